"""Recovery of requests whose worker died (killed, OOM, a lost node).

A running request's worker writes ``heartbeat_at`` when it claims the request, with every
progress report, and from a heartbeat thread every ``REQUEST_HEARTBEAT_SECONDS``. The
sweep (``sweep()``: the periodic task ``workers.sweep`` run by Celery beat, or
``manage.py recover``) applies three documented rules:

1. **Lost**: a request ``running`` whose heartbeat is older than
   ``REQUEST_LOST_AFTER_SECONDS`` (grace period, default 120 s) is finished as ``failed``
   with ``request.worker_lost``. Its reservation follows the charging rule of
   ``governance.requests.execution``: if the worker had started reading the data (``data_read``)
   the reservation is **committed in full** (the engine may have released something, or
   failed in a data-dependent way; the steps it took are not known, so the whole reserved
   event is charged); otherwise it is **released**. One audit record either way.
2. **Not picked up**: a request ``queued`` for longer than
   ``REQUEST_REQUEUE_AFTER_SECONDS`` has its task sent again, once per such period
   (``progress.requeued_at``), so a backlog that is only slow is not flooded with copies.
   A second delivery is harmless: the claim is a compare-and-set. Only requests of which
   the broker holds no message are sent (``_pending``; a broker that cannot be read sends
   nothing that sweep):

   - Redis (``workers.broker.redis_pending_request_ids``): none in the queue's lists or in
     the unacknowledged hash, where a message taken by a dead worker waits until Redis
     delivers it again. What it lacks was lost with a restart without persistence, or never
     published (the web process killed between its commit and its publish).
   - embedded (``filesystem://``, ``workers.broker.pending_request_ids``): no message file
     left in the broker's folder: a message there is waiting its turn; one that is gone was
     taken by a worker, which claims it at once unless it died with it (``kill -9``; the
     transport keeps taken messages in memory until they are acknowledged).
3. **Not sent**: a request ``queued`` whose task could not be sent after its commit (Redis
   down or restarting, a broken broker connection: ``governance.core.dispatch`` lets the
   POST be answered and marks it with ``progress.unsent_at``, ``mark_unsent``) is sent by
   the next sweep, without waiting for rule 2's period: no copy of its message exists.

Each step is a compare-and-set on the request's status and heartbeat inside the ledger's
transaction, so a sweep racing a worker that comes back, or another sweep, changes
nothing twice: a worker whose request was swept finds it no longer ``running`` and its
result is dropped (never shown). Both take the request row before the budget row.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..core.dispatch import mark_unsent  # noqa: F401 - rule 3's marker lives with the sending
from ..ledger import actions as ledger, trail
from ..models import Request

log = logging.getLogger(__name__)
LOST = {"code": "request.worker_lost",
        "detail": "The worker running this request stopped answering; see the charging rule in the README."}


def _stale(cutoff):
    return Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)


def sweep(*, now=None, lost_after: float | None = None, requeue_after: float | None = None) -> dict:
    """Apply the rules once; returns ``{"lost": [ids], "requeued": [ids]}``."""
    now = now or timezone.now()
    lost_after = settings.REQUEST_LOST_AFTER_SECONDS if lost_after is None else lost_after
    requeue_after = settings.REQUEST_REQUEUE_AFTER_SECONDS if requeue_after is None else requeue_after
    cutoff = now - timedelta(seconds=lost_after)
    lost = []
    for pk in Request.objects.filter(_stale(cutoff), status=Request.Status.RUNNING).values_list("pk", flat=True):
        if _finish_lost(pk, cutoff, now):
            lost.append(str(pk))
    requeued = []
    from .submission import enqueue
    from engines import plugins

    # Once per period per request: a backlog that is merely slow is not flooded with copies.
    # A request whose message never reached the broker (rule 3) is sent at once.
    stale_queued = Request.objects.filter(
        Q(created_at__lt=now - timedelta(seconds=requeue_after)) | Q(progress__has_key="unsent_at"),
        status=Request.Status.QUEUED)
    candidates = []
    for pk, engine, progress in stale_queued.values_list("pk", "engine", "progress"):
        progress = progress or {}
        last = progress.get("requeued_at")
        if "unsent_at" not in progress and last is not None and \
                last > (now - timedelta(seconds=requeue_after)).timestamp():
            continue
        try:
            queue = plugins.info(engine)["queue"]
        except Exception:  # noqa: BLE001 - an engine removed since: the cpu queue will fail it cleanly
            queue = "cpu"
        candidates.append((pk, queue, progress))
    waiting = _pending({q for pk, q, p in candidates if "unsent_at" not in p})
    for pk, queue, progress in candidates:
        if "unsent_at" not in progress and (waiting is None or str(pk) in waiting):
            continue  # its message is in the broker, waiting its turn (or the broker cannot say): no copy
        stamped = {k: v for k, v in progress.items() if k != "unsent_at"}
        if not Request.objects.filter(pk=pk, status=Request.Status.QUEUED).update(
                progress={**stamped, "requeued_at": now.timestamp()}):
            continue
        enqueue(pk, queue)
        requeued.append(str(pk))
    if lost or requeued:
        log.warning("recovery sweep: %d lost, %d requeued", len(lost), len(requeued))
    return {"lost": lost, "requeued": requeued}


def _pending(queues: set[str]) -> set[str] | None:
    """The request ids whose message the broker holds (waiting, or taken and not yet
    acknowledged); None when the broker cannot be read."""
    if not queues:
        return set()
    if getattr(settings, "EMBEDDED_BROKER", False):
        from workers.broker import pending_request_ids

        return pending_request_ids(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("data_folder_in", settings.BROKER_DIR))
    from workers.broker import redis_pending_request_ids

    from ..core.dispatch import app

    try:
        with app().connection_for_read() as conn:
            return redis_pending_request_ids(conn, queues)
    except Exception:  # noqa: BLE001 - Redis down or restarting: the next sweep looks again
        log.warning("recovery sweep: the broker's queues could not be read; nothing re-sent this time", exc_info=True)
        return None


def _finish_lost(pk, cutoff, now) -> bool:
    with transaction.atomic():
        # the request row first, then the ledger: the order governance.requests.execution uses
        done = Request.objects.filter(_stale(cutoff), pk=pk, status=Request.Status.RUNNING).update(
            status=Request.Status.FAILED, error=LOST, finished_at=now)
        if not done:
            return False
        req = Request.objects.get(pk=pk)
        Request.objects.filter(pk=pk).update(progress={**(req.progress or {}), "phase": "failed"})
        if req.ledger_entry_id:
            ctx = trail.Context.of_request(req, outcome=Request.Status.FAILED, reason=LOST["code"],
                                           detail=LOST["detail"])
            if req.data_read:
                ledger.commit(req.ledger_entry_id, audit_ctx=ctx)
            else:
                ledger.release(req.ledger_entry_id, audit_ctx=ctx)
    return True
