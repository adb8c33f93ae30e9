"""Typed errors that carry the service's error code and numbers.

Every error the API returns is ``{"code", "detail", ...}``; the client raises the class
registered for its ``code`` (``ApiError`` for a code it does not know), with the HTTP
status, the detail and every other field of the body in ``.body``. The common numbers are
attributes: ``BudgetExceeded.remaining_epsilon``, ``RateLimited.retry_after``,
``InvalidRequest.errors``, ``SqlUnsupported.part``... A request that was admitted but then
failed on the worker raises ``RequestFailed`` with the request's ``error.code``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ApiError(Exception):
    """An error answer of the service: ``code`` (stable), ``status`` (HTTP), ``detail``, ``body``."""

    codes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, code: str, status: int, detail: str, body: dict[str, Any] | None = None):
        super().__init__(f"[{code}] {detail}" if detail else f"[{code}]")
        self.code = code
        self.status = status
        self.detail = detail
        self.body: dict[str, Any] = body or {}

    def __getattr__(self, name: str) -> Any:
        # any number the service sent (e.g. would_total_epsilon) is an attribute too
        body = self.__dict__.get("body") or {}
        if name in body:
            return body[name]
        raise AttributeError(name)


class InvalidRequest(ApiError):
    """400: bad parameters, an unknown engine or dataset, a malformed body, a composition
    that would cost more work than one call may (``request.too_costly``). ``errors`` maps
    each field (or parameter) to what is wrong with it."""

    codes = ("request.invalid", "request.malformed", "event.invalid", "dataset.invalid", "engine.unknown",
             "dataset.partition_invalid", "request.not_acceptable", "method.not_allowed", "request.too_costly")

    @property
    def errors(self) -> dict[str, Any]:
        return self.body.get("errors") or {}


class SqlError(InvalidRequest):
    """400: a SQL request that is not one valid SELECT (``sql.invalid``)."""

    codes = ("sql.invalid",)

    @property
    def part(self) -> str:
        return self.body.get("part", "")


class SqlUnsupported(SqlError):
    """400: valid SQL the service does not answer; ``part`` names what (``"JOIN"``, ``"LIKE"``...)."""

    codes = ("sql.unsupported",)


class AuthenticationError(ApiError):
    """401: no token, or a token that is unknown, revoked or expired."""

    codes = ("auth.required", "auth.failed")


class PermissionDenied(ApiError):
    """403: not allowed (``permission.denied``), no grant on the dataset (``grant.missing``),
    or, as a queued request's error, an account deactivated meanwhile (``account.inactive``)."""

    codes = ("permission.denied", "grant.missing", "account.inactive")


class NotFound(ApiError):
    """404: no such object, or one you may not see (the service does not say which)."""

    codes = ("not_found",)


class BudgetExceeded(ApiError):
    """409: the gate refused; the request would cross the dataset's budget or your grant's cap."""

    codes = ("budget.exceeded",)

    @property
    def scope(self) -> str:
        """``dataset`` or ``grant``: which limit would be crossed."""
        return self.body.get("scope", "")

    @property
    def remaining_epsilon(self) -> float | None:
        return self.body.get("remaining_epsilon")

    @property
    def spent_epsilon(self) -> float | None:
        return self.body.get("spent_epsilon")

    @property
    def would_cost_epsilon(self) -> float | None:
        return self.body.get("would_cost_epsilon")


class Conflict(ApiError):
    """409 other than the budget: a non-private release refused, an inactive dataset, a
    request that can no longer be cancelled, a concurrent change, a revoked grant's cap."""

    codes = ("budget.non_private", "dataset.pld_not_allowed", "dataset.inactive", "ledger.conflict", "conflict",
             "grant.revoked")


class IdempotencyKeyReused(ApiError):
    """422: the Idempotency-Key was already used for another request."""

    codes = ("idempotency.key_reused",)


class RequestTooLarge(ApiError):
    """413: the body is over the service's limit."""

    codes = ("request.too_large",)


class UnsupportedMediaType(ApiError):
    """415: the body's content type is not accepted."""

    codes = ("request.unsupported_media_type",)


class RateLimited(ApiError):
    """429: too many new requests (``rate.limited``), or too many of the analyst's requests
    queued or running at once (``request.too_many_active``); ``retry_after`` seconds to
    wait (from the header)."""

    codes = ("rate.limited", "request.too_many_active")

    @property
    def retry_after(self) -> float | None:
        return _seconds(self.body.get("retry_after"))


class ServerError(ApiError):
    """5xx, or an answer that is not the service's JSON (``storage.full``, 507: the server's
    disk is full; ``storage.unwritable``, 503: its storage is read-only; ``database.unavailable``,
    503: its database is busy or unreachable, with ``retry_after`` seconds;
    ``cluster.unavailable``, 503: the Dask cluster, registering a distributed dataset; retry
    later): those four kept nothing. After any other 5xx (a
    gateway's 502 or 504 too) or an answer cut short, a POST may have been admitted:
    ``submit`` retries it with its ``Idempotency-Key`` and, when the retries fail too, the
    error's ``idempotency_key`` gets that request back (``may_have_been_admitted``)."""

    codes = ("error", "storage.full", "storage.unwritable", "database.unavailable", "cluster.unavailable",
             "response.invalid")

    @property
    def retry_after(self) -> float | None:
        return _seconds(self.body.get("retry_after"))


def _seconds(value: Any) -> float | None:
    """A Retry-After as seconds, or None when it is not a number of seconds ("soon", a date)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 and seconds == seconds and seconds != float("inf") else None


class RequestFailed(ApiError):
    """An admitted request that ended without a result: ``code`` is the request's
    ``error.code`` (``request.failed_before_read``: refunded; ``request.failed_after_read``
    and ``request.worker_lost``: the charge stands; ``request.time_limit``: the work done is
    charged; ``request.restored``: in flight when the service's database was backed up and
    then restored, charged in full; ``request.cancelled``); ``request`` is the request as the
    service last showed it."""

    codes = ("request.failed_before_read", "request.failed_after_read", "request.worker_lost",
             "request.time_limit", "request.restored", "request.cancelled", "engine.error")

    @property
    def request(self) -> dict[str, Any]:
        return self.body.get("request") or {}


class ServerUnreachable(ApiError):
    """The service could not be reached: connection refused, DNS failure, a dropped
    connection, TLS failure (``connection.failed``; ``status`` 0; ``url``; the
    ``requests`` exception is the ``__cause__``; ``sent``: False when the connection was
    never made). Nothing was charged unless a POST had reached the service: retry it with
    the same ``Idempotency-Key`` (``submit`` does; when its retries fail too, the error's
    ``idempotency_key`` is that key and ``may_have_been_admitted`` says whether any attempt
    may have landed). A wait that gave up names its request (``request_id``): it was
    admitted and goes on."""

    codes = ("connection.failed",)


class ServerTimeout(ServerUnreachable, TimeoutError):
    """The service did not connect, or sent nothing more of its answer, within the client's
    ``timeout`` (``connection.timeout``; ``timeout`` in seconds: per connection and per
    read, as in ``requests``, not for a whole call; ``run(..., timeout=)`` bounds a wait). A POST may have been admitted: ``submit`` retries it with the
    same ``Idempotency-Key``, which is never charged twice."""

    codes = ("connection.timeout",)


class WaitTimeout(TimeoutError):
    """``run(..., timeout=s)`` gave up waiting; the request goes on (``request_id``; from
    ``run`` and ``sql``, ``idempotency_key``: the same call with it gets the request back,
    never charged twice)."""

    def __init__(self, request_id: str, status: str, seconds: float, idempotency_key: str | None = None):
        super().__init__(f"request {request_id} is still {status} after {seconds:g} s")
        self.request_id = request_id
        self.status = status
        self.idempotency_key = idempotency_key


ERRORS: dict[str, type[ApiError]] = {code: cls for cls in (
    InvalidRequest, SqlError, SqlUnsupported, AuthenticationError, PermissionDenied, NotFound, BudgetExceeded,
    Conflict, IdempotencyKeyReused, RequestTooLarge, UnsupportedMediaType, RateLimited, ServerError,
    RequestFailed, ServerUnreachable, ServerTimeout) for code in cls.codes}


def error_for(status: int, body: Any, retry_after: str | None = None) -> ApiError:
    """The typed error for an error answer (``body`` as parsed JSON, or text)."""
    wait = {"retry_after": _seconds(retry_after)} if _seconds(retry_after) is not None else {}
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        # not the service's JSON (a proxy's page): typed by its status, its Retry-After kept
        text = body if isinstance(body, str) else repr(body)
        if status == 429:
            return RateLimited("rate.limited", status, text[:500], wait)
        cls: type[ApiError] = ServerError if status >= 500 else ApiError
        return cls("error" if status >= 500 else f"http.{status}", status, text[:500], wait)
    body = {**wait, **body}
    code = body["code"]
    detail = body.get("detail")
    cls = ERRORS.get(code) or (ServerError if status >= 500 else ApiError)
    return cls(code, status, detail if isinstance(detail, str) else str(detail or ""), body)
