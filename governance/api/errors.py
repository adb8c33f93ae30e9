"""One exception handler: every error is ``{"code", "detail", ...}`` with a stable code."""

import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import IntegrityError, OperationalError
from django.http import Http404, JsonResponse, UnreadablePostError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler
from rest_framework.views import set_rollback

from ..core.errors import (STORAGE_FULL_DETAIL, STORAGE_UNWRITABLE_DETAIL, GovernanceError, storage_full,
                           storage_unwritable)
from .parsers import RequestTooLarge

log = logging.getLogger(__name__)

# An error body is for people: a hostile request (a million unknown parameters) must not
# get itself echoed back a million times.
MAX_DETAIL_CHARS = 2_000
MAX_ERROR_ENTRIES = 50


DATABASE_RETRY_AFTER = 5  # seconds, on a 503 database.unavailable

DRF_CODES = {
    RequestTooLarge: "request.too_large",
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
    response = _handle(exc, context)
    if response is not None and isinstance(response.data, dict):
        response.data = _bounded(response.data)
    return response


def _handle(exc, context):
    if isinstance(exc, RequestDataTooBig):
        # Django's DATA_UPLOAD_MAX_MEMORY_SIZE: without this, Django's HTML 400 page.
        exc = RequestTooLarge(f"The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE "
                              f"({settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes).")
    elif isinstance(exc, SuspiciousOperation):
        # e.g. more than DATA_UPLOAD_MAX_NUMBER_FIELDS form fields or DATA_UPLOAD_MAX_NUMBER_FILES files
        exc = exceptions.ParseError(f"The request was refused: {str(exc)[:300]}")
    elif isinstance(exc, UnreadablePostError):
        exc = exceptions.ParseError("The request body could not be read (the client went away?).")
    if (why := storage_full(exc)) is not None:
        # the data or results directory, or the database, is full: the server's state, not the request's fault
        set_rollback()
        log.error("no space left: %s", exc)
        return Response({"code": "storage.full", "detail": STORAGE_FULL_DETAIL.format(why)},
                        status=status.HTTP_507_INSUFFICIENT_STORAGE)
    if (why := storage_unwritable(exc)) is not None:
        set_rollback()
        log.error("storage not writable: %s", exc)
        return Response({"code": "storage.unwritable", "detail": STORAGE_UNWRITABLE_DETAIL.format(why)},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, OperationalError):
        # the database locked past its timeout (SQLite), restarting or unreachable: the
        # request's transaction rolled back, nothing was kept; a retry in a moment may pass
        set_rollback()
        log.error("database unavailable: %s", exc)
        return Response({"code": "database.unavailable", "detail": "The database is busy or unreachable; nothing "
                         "was kept. Retry in a few seconds.", "retry_after": DATABASE_RETRY_AFTER},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers={"Retry-After": str(DATABASE_RETRY_AFTER)})
    if isinstance(exc, IntegrityError):
        # Two concurrent creations of the same thing (a grant, a dataset name): one wins.
        set_rollback()
        return Response({"code": "conflict", "detail": "This conflicts with a concurrent change; "
                         "reload and retry."}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, GovernanceError):
        retry = exc.extra.get("retry_after")
        return Response({"code": exc.code, "detail": exc.detail, **exc.extra}, status=exc.status,
                        headers={"Retry-After": str(retry)} if retry is not None else None)
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


def _bounded(body: dict) -> dict:
    """The error body with long texts cut and at most MAX_ERROR_ENTRIES entries per mapping."""
    out = {}
    for key, value in body.items():
        if isinstance(value, str) and len(value) > MAX_DETAIL_CHARS:
            value = value[:MAX_DETAIL_CHARS] + f"... ({len(value) - MAX_DETAIL_CHARS} more characters)"
        elif isinstance(value, dict) and len(value) > MAX_ERROR_ENTRIES:
            kept = dict(list(value.items())[:MAX_ERROR_ENTRIES])
            kept["..."] = f"{len(value) - MAX_ERROR_ENTRIES} more"
            value = _bounded(kept)
        elif isinstance(value, dict):
            value = _bounded(value)
        elif isinstance(value, list) and len(value) > MAX_ERROR_ENTRIES:
            value = value[:MAX_ERROR_ENTRIES] + [f"... {len(value) - MAX_ERROR_ENTRIES} more"]
        out[key] = value
    return out


def page_not_found(request, exception=None):
    """404 for URLs no route matches: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": f"No endpoint at {request.path}."}, status=404)
    from django.views.defaults import page_not_found as html_404

    return html_404(request, exception)
