"""Recovery of requests whose worker died (killed, OOM, a lost node).

A running request's worker writes ``heartbeat_at`` when it claims the request, with every
progress report, and from a heartbeat thread every ``REQUEST_HEARTBEAT_SECONDS``. The
sweep (``sweep()``: the periodic task ``workers.sweep`` run by Celery beat, or
``manage.py recover``) applies three documented rules:

1. **Lost**: a request ``running`` whose heartbeat is older than
   ``REQUEST_LOST_AFTER_SECONDS`` (grace period, default 120 s) on the database's clock
   (``db_now``, heartbeats are written as ``db_time``), or, once this process's sweeps
   have watched it (``Watch``), unchanged for that long on their monotonic clock, is
   finished as ``failed``
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
   nothing that sweep), and of those only as many as their queue lacks turns: any message
   of a queue runs the fairest request queued on it (``governance.requests.turns``), so a
   request whose own message ran another's is covered by that other's message
   (``_turns_short``):

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
import time
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from ..core.clock import db_now
from ..core.dispatch import mark_unsent  # noqa: F401 - rule 3's marker lives with the sending
from ..ledger import actions as ledger, trail
from ..models import Request
from .result_files import drop_files

log = logging.getLogger(__name__)
LOST = {"code": "request.worker_lost",
        "detail": "The worker running this request stopped answering; see the charging rules in docs/concepts.md."}


def _stale(cutoff):
    return Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)


def db_started():
    """When the database server last started (PostgreSQL's ``pg_postmaster_start_time``;
    None elsewhere): a restart is an outage this process's sweeps may not have seen."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cur:
        cur.execute("SELECT pg_postmaster_start_time()")
        return cur.fetchone()[0]


def db_time():
    """A heartbeat's value as an update writes it: the database's ``Now()`` on PostgreSQL
    (workers on other hosts, their clocks stepped or skewed), this host's on SQLite (the
    stored text then has the format every comparison with a Python datetime expects)."""
    return Now() if connection.vendor == "postgresql" else timezone.now()


class Watch:
    """What this process's sweeps saw of each running request's heartbeat, on its monotonic
    clock: a heartbeat that changed since the last sweep is alive whatever the wall clocks
    say (a worker whose clock was stepped back writes times that look old; a sweeper stepped
    forward sees every time as old), and one unchanged for ``lost_after`` seconds of this
    clock is lost even when it reads as recent (a worker that ran ahead, then died). A
    request this process has not watched yet is judged by the database's clock, unless its
    worker is alive (``liveness``, on a clock of its own): then it is only watched, and
    swept once it stood still for ``lost_after`` here (a probe stepped the database's clock
    10 minutes forward, and a fresh sweeper finished a live run as lost). After a
    sweep that failed (the database away) every request is watched afresh: an outcome
    held in a worker's memory meanwhile is written within seconds of the database's
    return (``outcomes._again``) and must not lose that race to the sweep."""

    def __init__(self):
        self.seen: dict = {}  # request id -> (heartbeat, monotonic time it was first seen)
        self.afresh = False

    def lost(self, running, cutoff, lost_after: float, vouched=frozenset) -> list:
        """``running``: (request id, heartbeat); ``vouched()``: the ids whose worker is alive,
        asked only if a request not watched before looks stale (it reads the liveness
        records: one Redis call or a directory listing, not needed on most sweeps)."""
        now, seen, out, alive = time.monotonic(), {}, [], None
        for pk, heartbeat in running:
            before = self.seen.get(pk)
            if before is not None and before[0] == heartbeat and not self.afresh:
                seen[pk] = before
                if now - before[1] >= lost_after:
                    out.append(pk)
                continue
            seen[pk] = (heartbeat, now)
            if before is None and not self.afresh and heartbeat is not None and heartbeat < cutoff:
                alive = vouched() if alive is None else alive
                if pk not in alive:
                    out.append(pk)  # not watched before: the database's clock decides
        self.seen, self.afresh = seen, False
        return out


WATCH = Watch()


def sweep(*, now=None, lost_after: float | None = None, requeue_after: float | None = None) -> dict:
    """Apply the rules once; returns ``{"lost": [ids], "requeued": [ids]}``. ``now`` (a
    test's clock): judge every heartbeat by it alone, not by ``WATCH``."""
    try:
        return _sweep(now, lost_after, requeue_after)
    except DatabaseError:
        WATCH.afresh = True
        raise


def _sweep(now, lost_after, requeue_after) -> dict:
    given = now is not None
    now = now or db_now()
    lost_after = settings.REQUEST_LOST_AFTER_SECONDS if lost_after is None else lost_after
    requeue_after = settings.REQUEST_REQUEUE_AFTER_SECONDS if requeue_after is None else requeue_after
    cutoff = now - timedelta(seconds=lost_after)
    if given:
        candidates = [(pk, _stale(cutoff)) for pk in
                      Request.objects.filter(_stale(cutoff), status=Request.Status.RUNNING).values_list("pk", flat=True)]
    else:
        restarted = db_started()
        if restarted is not None and timedelta(0) <= now - restarted < timedelta(seconds=lost_after):
            # the database restarted within the grace period: no heartbeat could be written
            # while it was down, and a worker holding an outcome writes it within seconds of
            # its return; a sweep in a process that saw no error marked such a request lost
            # 0.23 s after a restart (a probe's), and its held outcome was dropped. A start
            # time in the database's future (its clock stepped back past it) is no restart:
            # it turned every sweep off until the clock caught up (a probe's)
            WATCH.afresh = True
        running = {pk: (beat, started, worker, proc, engine) for pk, beat, started, worker, proc, engine in
                   Request.objects.filter(status=Request.Status.RUNNING).values_list(
                       "pk", "heartbeat_at", "started_at", "worker", "worker_process", "engine")}

        def vouched():
            alive = _live_nodes()
            return {pk for pk, (_, _, worker, proc, engine) in running.items()
                    if any((not proc or p is None or proc == p) and (queues is None or _queue_of(engine) in queues)
                           for p, queues in alive.get(worker, ()))}

        candidates = [(pk, _unchanged(*running[pk][:2])) for pk in WATCH.lost(
            [(pk, beat or started) for pk, (beat, started, *_) in running.items()], cutoff, lost_after, vouched)]
    lost = []
    for pk, still in candidates:
        if _finish_lost(pk, still, now):
            lost.append(str(pk))
    requeued = []
    from .submission import enqueue

    # Once per period per request: a backlog that is merely slow is not flooded with copies.
    # A request whose message never reached the broker (rule 3) is sent at once.
    stale_queued = Request.objects.filter(
        Q(created_at__lt=now - timedelta(seconds=requeue_after)) | Q(progress__has_key="unsent_at")
        # created in the database's future: a web process whose clock runs ahead (its broker
        # message, if lost, would never be old enough to send again)
        | Q(created_at__gt=now + timedelta(seconds=requeue_after)),
        status=Request.Status.QUEUED)
    candidates = []
    for pk, engine, progress in stale_queued.values_list("pk", "engine", "progress"):
        progress = progress or {}
        last = progress.get("requeued_at")
        if "unsent_at" not in progress and last is not None and \
                last > (now - timedelta(seconds=requeue_after)).timestamp():
            continue
        candidates.append((pk, _queue_of(engine), progress))
    waiting = _pending({q for pk, q, p in candidates if "unsent_at" not in p})
    short = _turns_short(waiting) if waiting is not None and candidates else {}
    for pk, queue, progress in candidates:
        if "unsent_at" not in progress:
            if waiting is None or str(pk) in waiting:
                continue  # its message is in the broker, waiting its turn (or the broker cannot say): no copy
            if short.get(queue, 1) <= 0:
                continue  # the broker holds a turn for every queued request of its queue (turns.py)
        short[queue] = short.get(queue, 1) - 1
        stamped = {k: v for k, v in progress.items() if k != "unsent_at"}
        if not Request.objects.filter(pk=pk, status=Request.Status.QUEUED).update(
                progress={**stamped, "requeued_at": now.timestamp()}):
            continue
        enqueue(pk, queue)
        requeued.append(str(pk))
    if lost or requeued:
        log.warning("recovery sweep: %d lost, %d requeued", len(lost), len(requeued))
    return {"lost": lost, "requeued": requeued}


def _queue_of(engine: str) -> str:
    """The queue ``engine``'s requests are sent to; ``cpu`` for an engine removed since (the
    cpu queue fails it cleanly)."""
    from engines import plugins

    try:
        return plugins.info(engine)["queue"]
    except Exception:  # noqa: BLE001 - an engine removed since
        return "cpu"


def _turns_short(waiting: set[str]) -> dict[str, int]:
    """Per queue, how many more queued requests there are than turns the broker holds
    (``governance.requests.turns``: any message of a queue runs the fairest request queued
    on it, so a request whose own message ran another's is covered by that one's message).
    Each message is counted by its request's engine's queue; on Redis the messages of the
    runs under way (taken, not yet acknowledged) are no turns to come. Where this errs it
    errs toward sending (a message sent twice counts once; on the embedded broker a
    worker's prefetched messages are not seen): a turn too many finds the queue empty,
    harmless; a turn too few could strand a request."""
    from collections import Counter
    def per_queue(requests) -> Counter:
        return Counter(_queue_of(e) for e in requests.values_list("engine", flat=True))

    ids, turns = list(waiting), Counter()
    for i in range(0, len(ids), 5000):  # (SQLite binds at most 32,766 values in one statement)
        turns.update(per_queue(Request.objects.filter(pk__in=ids[i:i + 5000])))
    queued = per_queue(Request.objects.filter(status=Request.Status.QUEUED))
    if not getattr(settings, "EMBEDDED_BROKER", False):
        turns.subtract(per_queue(Request.objects.filter(status=Request.Status.RUNNING)))
    return {q: queued[q] - max(turns[q], 0) for q in queued}


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


def _live_nodes() -> dict[str, list[tuple[str | None, set[str] | None]]]:
    """The Celery node names with a live liveness record, each with its live processes: the
    process (``liveness.process_key``) and the queues it consumes (None: a record that does
    not say, any queue); empty when they cannot be read: the database's clock then decides, as before. Two
    ``manage.py worker`` on one host, one per queue, are one node (``celery@<host>``): the
    cpu one killed, the gpu one vouched for its request for minutes (a probe); only a live
    process of the request's queue vouches now, and only the process that claimed it
    (``Request.worker_process``: its id and start time) where the claim says which: a worker
    started again under the same name vouched for its dead predecessor's run, which was
    finished 3 min 45 s after the kill instead of 2 (a probe); so did one started again as
    the same pid 1 of a container (a probe)."""
    from ..core import liveness

    try:
        records = liveness.alive()
    except Exception:  # noqa: BLE001 - Redis away: judged by the database's clock
        return {}
    nodes: dict[str, list] = {}
    for r in records:
        if not r.get("node"):
            continue
        queues = r.get("queues")
        proc = r.get("process") if isinstance(r.get("process"), str) else None
        queues = {str(q) for q in queues} if isinstance(queues, list) and queues else None
        nodes.setdefault(r["node"], []).append((proc, queues))
    return nodes


def _unchanged(heartbeat, started):
    """The compare-and-set's condition: the heartbeat the sweep judged is still the last one."""
    return Q(heartbeat_at=heartbeat) if heartbeat is not None else Q(heartbeat_at__isnull=True, started_at=started)


def finish_killed_by_time_limit(task_id: str, limit: int) -> str | None:
    """The request whose run the workers' hard time limit killed (its pool process, stuck in
    one long call the soft limit could not interrupt: an aggregate inside one OpenDP call),
    found by the task whose turn ran it (``run_task``); its id, or None. Celery's worker
    calls this at once (``workers.tasks.RequestTask.on_failure``): it was finished by the
    sweep as ``request.worker_lost`` only after the heartbeat's grace period, and said
    nothing of the limit. Charged as a lost run (the steps taken are not known)."""
    if not task_id:
        return None
    pk = Request.objects.filter(run_task=task_id, status=Request.Status.RUNNING).values_list("pk", flat=True).first()
    error = {"code": "request.time_limit",
             "detail": f"Stopped by the workers' hard time limit ({limit} s, CELERY_TASK_TIME_LIMIT), its process "
                       "ended; charged in full if the data had been read, else refunded."}
    return str(pk) if pk is not None and _finish_lost(pk, Q(run_task=task_id), db_now(), error) else None


RESTORED = {"code": "request.restored",
            "detail": "The service's database was restored from a backup taken while this request was queued or "
                      "running; its answer may have been released after the backup, so it is not run again and is "
                      "charged in full."}


def finish_restored() -> list[str]:
    """After a restore from a backup (deploy/README.md, Restore), before any worker starts:
    every request still queued or running is finished as failed (``request.restored``),
    its reservation committed, its files (if any) kept. The backup forgot what happened to
    them: a probe's queued synthesis ran again after the restore and its analyst held two
    different tables for one charge, the first table's files overwritten; a running one
    would have been swept as lost with its files deleted. Returns their ids."""
    now, waiting = db_now(), Q(status__in=[Request.Status.QUEUED, Request.Status.RUNNING])
    return [str(pk) for pk in Request.objects.filter(waiting).values_list("pk", flat=True)
            if _finish_lost(pk, waiting, now, RESTORED, restored=True)]


def _finish_lost(pk, still: Q, now, error=LOST, restored=False) -> bool:
    """``restored``: ``still`` alone decides (a queued request too), charged in full, files kept."""
    with transaction.atomic():
        # the request row first, then the ledger: the order governance.requests.execution uses
        running = {} if restored else {"status": Request.Status.RUNNING}
        done = Request.objects.filter(still, pk=pk, **running).update(
            status=Request.Status.FAILED, error=error, finished_at=now)
        if not done:
            return False
        req = Request.objects.get(pk=pk)
        Request.objects.filter(pk=pk).update(progress={**(req.progress or {}), "phase": "failed"})
        if req.ledger_entry_id:
            ctx = trail.Context.of_request(req, outcome=Request.Status.FAILED, reason=error["code"],
                                           detail=error["detail"])
            if req.data_read or restored:
                ledger.commit(req.ledger_entry_id, audit_ctx=ctx)
            else:
                ledger.release(req.ledger_entry_id, audit_ctx=ctx)
    if restored:
        return True
    drop_files(pk)  # failed just now: files a run killed between keeping them and its outcome had kept
    return True
