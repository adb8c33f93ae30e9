from rest_framework.permissions import SAFE_METHODS, BasePermission

from ..core.roles import is_officer


class IsOfficer(BasePermission):
    message = "Only privacy officers (staff) may do this."

    def has_permission(self, request, view):
        return is_officer(request.user)


class OfficerWritesOnly(BasePermission):
    message = "Only privacy officers (staff) may change this."

    def has_permission(self, request, view):
        return request.method in SAFE_METHODS or is_officer(request.user)
