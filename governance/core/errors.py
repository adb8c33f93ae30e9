"""Errors with stable codes. User errors (4xx) are apart from system errors (5xx).

The API's exception handler turns each into ``{"code", "detail", ...extra}`` with its
HTTP status, so an analyst sees why, with the numbers.
"""

from __future__ import annotations


class GovernanceError(Exception):
    """Base error: ``code`` is stable and documented, ``status`` the HTTP status."""

    code = "error"
    status = 500

    def __init__(self, detail: str, **extra):
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class ClusterUnavailable(GovernanceError):
    """The Dask cluster could not be reached, had no worker, or was lost while it read a
    table being registered: nothing was registered; a retry later may pass."""

    code = "cluster.unavailable"
    status = 503


class UserError(GovernanceError):
    """The request was wrong; retrying it unchanged will fail again."""

    code = "request.invalid"
    status = 400


class InvalidRequest(UserError):
    code = "request.invalid"


class InvalidEvent(UserError):
    code = "event.invalid"


class InvalidDataset(UserError):
    code = "dataset.invalid"


class UploadTooLarge(InvalidDataset):
    """An uploaded table over ``MAX_UPLOAD_BYTES``: 413, as the parser's refusal of a body
    whose declared length is over it (a chunked body, or a file just over the limit inside
    the form fields' allowance, is only found too large while it is copied). A table named
    by a server path is not an upload: over the limit it stays a 400 ``dataset.invalid``."""

    code = "request.too_large"
    status = 413


class TooManyActive(UserError):
    """The analyst has ``MAX_ACTIVE_REQUESTS`` requests queued or running: a new one waits
    until one of them ends (``active``, ``max_active``, ``retry_after`` seconds)."""

    code = "request.too_many_active"
    status = 429


class BudgetExceeded(UserError):
    """The gate refused: composing this event would cross a budget or a grant's cap."""

    code = "budget.exceeded"
    status = 409


class NonPrivateRefused(UserError):
    """A non-private release on a dataset whose officer does not allow them."""

    code = "budget.non_private"
    status = 409


class PldNotAllowed(UserError):
    """A run to be certified by PLD on a dataset whose officer turned PLD certification off
    while it waited (a new request asking for it is a 400, request.invalid)."""

    code = "dataset.pld_not_allowed"
    status = 409


class NoGrant(UserError):
    code = "grant.missing"
    status = 403


class AccountInactive(UserError):
    """The analyst's account was deactivated while a request of hers waited."""

    code = "account.inactive"
    status = 403


class GrantRevoked(UserError):
    """A change of a revoked grant's cap (give it again with the cap instead)."""

    code = "grant.revoked"
    status = 409


class DatasetNotActive(UserError):
    code = "dataset.inactive"
    status = 409


class IdempotencyKeyReused(UserError):
    """An Idempotency-Key sent again with a different request."""

    code = "idempotency.key_reused"
    status = 422


class LedgerConflict(UserError):
    """A status change that is not allowed (e.g. committing a released entry)."""

    code = "ledger.conflict"
    status = 409


class SqlInvalid(UserError):
    """A SQL request that is not one valid SELECT, or whose options clash with it (``part``)."""

    code = "sql.invalid"


class SqlUnsupported(UserError):
    """Valid SQL the aggregates engine does not answer; ``part`` names what (JOIN, OR, ...)."""

    code = "sql.unsupported"


class TooCostly(UserError):
    """A call whose input would take more than its budget of work (about one CPU second;
    ``accounting.work``), refused before the work is done. ``work_units`` (counted so
    far) and ``max_work_units`` say by how much."""

    code = "request.too_costly"


def storage_full(exc: BaseException) -> str | None:
    """Why, if ``exc`` means the server's disk is full (a file's write, or the database's:
    SQLite's "database or disk is full", PostgreSQL's disk_full 53100); else None."""
    import errno

    from django.db import OperationalError

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return exc.strerror or "No space left on device"
    if isinstance(exc, OperationalError):
        cause = exc.__cause__
        if "database or disk is full" in str(exc) or getattr(cause, "sqlstate", None) == "53100":
            return "the database has no space left"
    return None


def storage_unwritable(exc: BaseException) -> str | None:
    """Why, if ``exc`` means the server cannot write its own storage (a read-only or
    forbidden directory, SQLite's or PostgreSQL's read-only database); else None. A probe's
    read-only DATA_DIR gave registrations a 500 with Django's debug page."""
    import errno

    from django.db import DatabaseError, OperationalError

    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return exc.strerror or "Read-only file system"
    if isinstance(exc, OperationalError) and "readonly database" in str(exc):
        return "the database is read-only"
    if isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == "25006":
        # PostgreSQL's read_only_sql_transaction (a hot standby after a failover,
        # default_transaction_read_only): Django's InternalError, a 500 page (a probe's)
        return "the database is read-only"
    return None


STORAGE_FULL_DETAIL = ("The server has no space left to store this ({}); nothing was kept. Retry once an operator "
                       "has freed space.")
STORAGE_UNWRITABLE_DETAIL = ("The server cannot write its storage ({}); nothing was kept. Retry once an operator has "
                             "made it writable.")
