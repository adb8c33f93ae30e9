"""One exception handler: every error is ``{"code", "detail", ...}`` with a stable code."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import IntegrityError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler
from rest_framework.views import set_rollback

from ..errors import GovernanceError

DRF_CODES = {
    exceptions.ValidationError: "request.invalid",
    exceptions.ParseError: "request.malformed",
    exceptions.UnsupportedMediaType: "request.unsupported_media_type",
    exceptions.NotAuthenticated: "auth.required",
    exceptions.AuthenticationFailed: "auth.failed",
    exceptions.PermissionDenied: "permission.denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method.not_allowed",
    exceptions.NotAcceptable: "request.not_acceptable",
    exceptions.Throttled: "rate.limited",
}


def exception_handler(exc, context):
    if isinstance(exc, IntegrityError):
        # Two concurrent creations of the same thing (a grant, a dataset name): one wins.
        set_rollback()
        return Response({"code": "conflict", "detail": "This conflicts with a concurrent change; "
                         "reload and retry."}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, GovernanceError):
        return Response({"code": exc.code, "detail": exc.detail, **exc.extra}, status=exc.status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_handler(exc, context)
    if response is None:
        return None
    code = next((c for cls, c in DRF_CODES.items() if isinstance(exc, cls)), "error")
    data = response.data
    if isinstance(exc, exceptions.ValidationError):
        body = {"code": code, "detail": "The request has invalid fields.", "errors": data}
    elif isinstance(data, dict) and "detail" in data:
        body = {"code": code, "detail": str(data["detail"])}
    else:
        body = {"code": code, "detail": data}
    response.data = body
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Token realm="api"'
    return response


def page_not_found(request, exception=None):
    """404 for URLs no route matches: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": f"No endpoint at {request.path}."}, status=404)
    from django.views.defaults import page_not_found as html_404

    return html_404(request, exception)
