"""Requests still queued when their analyst's grant is revoked or their dataset is taken out
of service: cancelled and refunded in that change's transaction, so that a grant given
back (or the dataset activated again) before a worker reaches them does not bring them
back to life (a probe: 211 requests admitted before a revocation ran and were released
after the grant was given again). A request a worker already claimed runs on: it is no
longer queued (docs/concepts.md)."""

from __future__ import annotations

import time

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from ..models import Request
from . import actions, trail

__all__ = ["cancel_if_queued", "cancel_queued"]


def cancel_if_queued(req: Request, code: str, detail: str) -> bool:
    """``req`` cancelled and its reservation refunded, with its ``release`` audit record
    (``code`` its reason), if it is still queued: a worker claiming it meanwhile wins it.
    The caller holds the transaction."""
    if not Request.objects.filter(pk=req.pk, status=Request.Status.QUEUED).update(
            status=Request.Status.CANCELLED, finished_at=timezone.now(), progress={"phase": "cancelled"},
            error={"code": code, "detail": detail}):
        return False
    if req.ledger_entry_id:
        actions.release(req.ledger_entry_id, audit_ctx=trail.Context.of_request(
            req, outcome="cancelled", reason=code, detail=detail))
    return True


def cancel_queued(dataset_id: int, code: str, why: str, analyst_id: int | None = None) -> int:
    """Cancel the requests queued on the dataset (of ``analyst_id`` only, if given) and
    refund their reservations, each with its ``release`` audit record (``code`` its
    reason). The caller holds the transaction; returns how many were cancelled."""
    detail = f"Not run: {why} (since the request was admitted); nothing was read, the reservation is refunded."
    queued = Request.objects.filter(dataset_id=dataset_id, status=Request.Status.QUEUED)
    if analyst_id is not None:
        queued = queued.filter(analyst_id=analyst_id)
    return sum(cancel_if_queued(req, code, detail) for req in _taken(queued.order_by("created_at")))


HELD_TRIES, HELD_PAUSE = 10, 0.05  # a queued row another holds: asked again this often, this far apart


def _taken(queued) -> list[Request]:
    """The queued rows, each locked for this transaction (PostgreSQL; SQLite has one writer
    at a time). The caller holds the budget's lock, and an analyst's cancel takes its
    request's row before the budget's (its refund): waiting for a row the cancel holds was
    a deadlock (a probe's 20 cancels beside a revoke: the officer's revoke a 503, the
    admin's a 500, the grant still active). So rows held by another are not waited for but
    asked for again, without waiting (NOWAIT), for about half a second: a worker's claim or
    the sweep's requeue stamp holds one for a statement and lets go (skipped for good, such
    a row stayed queued and ran once the grant was given back: a probe); a cancel holds it
    until this transaction ends, and cancels it then."""
    rows = list(queued.select_for_update(skip_locked=True, of=("self",)))
    if connection.vendor != "postgresql":
        return rows
    for pk in queued.exclude(pk__in=[r.pk for r in rows]).values_list("pk", flat=True):
        for _ in range(HELD_TRIES):
            try:
                with transaction.atomic():  # a savepoint: a refusal to wait does not end the caller's transaction
                    row = queued.filter(pk=pk).select_for_update(nowait=True, of=("self",)).first()
            except OperationalError:  # held by another
                time.sleep(HELD_PAUSE)
                continue
            if row is not None:
                rows.append(row)
            break
    return rows
