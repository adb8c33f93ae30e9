from rest_framework.permissions import SAFE_METHODS, BasePermission


def is_officer(user) -> bool:
    """Privacy officers are staff users."""
    return bool(user and user.is_authenticated and user.is_staff)


class IsOfficer(BasePermission):
    message = "Only privacy officers (staff) may do this."

    def has_permission(self, request, view):
        return is_officer(request.user)


class OfficerWritesOnly(BasePermission):
    message = "Only privacy officers (staff) may change this."

    def has_permission(self, request, view):
        return request.method in SAFE_METHODS or is_officer(request.user)
