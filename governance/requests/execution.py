"""Running an admitted request on a worker (called by the Celery task).

Idempotent: the run claims the request with a compare-and-set ``queued -> running``; a
second delivery of the same task finds it claimed (or finished) and does nothing.

Charging rule: a failure *before* the data is read refunds the reservation; once the
worker has started reading the data the charge stays, whatever happens next, because the
failure itself may depend on the data. Errors after the read are reported to the analyst
without their message (which could depend on the data), and logged without it too.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import math
import os
import re
import shutil
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from accounting import events as ev
from accounting.costs import Cost
from engines import plugins
from engines.federated.types import Federation
from engines.types import Cancelled, EngineError, EngineRequest, Plan

from ..core import processes
from ..core.clock import db_now
from ..core.errors import AccountInactive, BudgetExceeded, NonPrivateRefused, PldNotAllowed, UserError
from ..core.raw_rows import concrete, from_row
from ..datasets.data import load_columns
from ..datasets.engine_meta import dataset_meta
from ..models import Dataset, Request
from . import federated_runs, outcomes, turns
from .recovery import db_time
from .releaser import RELEASER
from .result_files import check_writable, disk_full, results_dir
from .submission import access_refusal

log = logging.getLogger(__name__)
PROGRESS_INTERVAL = 0.5  # seconds between progress writes when there are no ticks (eager runs)


_LAST_TICK = threading.local()  # the tick (monotonic) of this thread's last run's outcome


def execute(request_id: str, worker: str = "", task: str = "", take_turns: bool = False,
            retried: bool = False, worker_process: str = "") -> str:
    """Run one request to a final state; returns its final (or current) status. With
    ``take_turns`` (a worker's message), the request run is the fairest of the message's
    queue (``claim_turn``), not necessarily ``request_id``. The claim waits for the tick of
    this thread's last run, whose outcome the releaser writes then: a claim at the moment
    the last run's engine finished showed its exact duration (the next request's
    ``started_at``, its status, a cancel's answer), a data-dependent time the ticks exist to
    hide, to whoever's request came next. ``worker_process``: the worker process whose
    liveness record vouches for the run (``recovery.sweep``)."""
    wait = getattr(_LAST_TICK, "due", 0.0) - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    req = reclaim(task, worker, worker_process) if retried else None
    if req is None:
        req = claim_turn(request_id, worker, task, worker_process) if take_turns else \
            claim(request_id, worker, task, worker_process)
    if req is None:
        return Request.objects.filter(pk=request_id).values_list("status", flat=True).first() or "missing"
    if str(req.pk) != str(request_id):
        log.info("request %s runs in the turn of request %s's message", req.pk, request_id)
    with RunClock(req.pk, quantum_ms(req.dataset)) as clock:
        return _run(req, clock)


STARTING = {"phase": "starting", "fraction": 0.0}  # a claimed request's progress until its data is read


class StillRunning(Exception):
    """A retried task's claimed request is running with a heartbeat too recent to tell its
    run stopped: the task is sent again later (``workers.tasks.run_request``)."""


def reclaim(task: str, worker: str = "", worker_process: str = "") -> Request | None:
    """A retried task's own request, claimed again: the database went away between the claim
    and the read, so the run could write neither its failure nor anything else and the task
    was sent again, while the request stayed ``running``; the copy found nothing queued and
    the sweep failed it as a lost worker two minutes later (a probe restarted PostgreSQL
    just after a claim). Taken back (compare-and-set) when no row was read and its heartbeat
    has stood still for two heartbeat periods: a run still alive beats within one
    (``StillRunning`` then). None when this task claimed nothing that is still running unread."""
    if not task:
        return None
    mine = Request.objects.filter(run_task=task[:64], status=Request.Status.RUNNING, data_read=False)
    pk = mine.values_list("pk", flat=True).first()
    if pk is None:
        return None
    stale = db_now() - timedelta(seconds=2 * settings.REQUEST_HEARTBEAT_SECONDS)  # the heartbeats' clock
    if not mine.filter(pk=pk, heartbeat_at__lt=stale).update(worker=worker[:200], worker_process=worker_process[:64],
                                                             heartbeat_at=db_time(),
                                                             progress=STARTING):
        raise StillRunning(task)
    log.info("request %s claimed again by its task %s after the database came back", pk, task)
    return Request.objects.select_related("dataset").get(pk=pk)


TURN_ATTEMPTS = 20  # claims lost to other workers before a turn falls back to its own request


def claim_turn(request_id, worker: str = "", task: str = "", worker_process: str = "") -> Request | None:
    """The turn of ``request_id``'s message (``governance.requests.turns``): the fairest
    queued request of its queue, claimed; one another worker claimed first moves the turn
    to the next fairest; ``request_id`` itself when its engine is unknown here or no other
    could be claimed. None when nothing of the queue is left queued."""
    try:
        engine = Request.objects.filter(pk=request_id).values_list("engine", flat=True).first()
    except (ValueError, ValidationError):  # not a request id at all
        return None
    engines = turns.queue_engines(engine) if engine else None
    for _ in range(TURN_ATTEMPTS if engines else 0):
        pk = turns.fairest(engines)
        if pk is None:
            break
        req = claim(pk, worker, task, worker_process)
        if req is not None:
            return req
    return claim(request_id, worker, task, worker_process)


def claim(request_id, worker: str = "", task: str = "", worker_process: str = "") -> Request | None:
    """``queued -> running`` by compare-and-set, returning the claimed row and its dataset's
    in the same statement (``WITH r AS (UPDATE ... RETURNING ...) SELECT ... JOIN``); None
    when another delivery has it. ``task``: the Celery task whose turn runs it (the worker's
    hard time limit finds the run by it)."""
    values = {"status": Request.Status.RUNNING, "worker": worker[:200], "worker_process": worker_process[:64],
              "run_task": task[:64], "progress": STARTING}
    if connection.vendor != "postgresql":  # SQLite: this host's clock is the database's (recovery.db_time)
        now = timezone.now()
        values.update(started_at=now, heartbeat_at=now)
    field = Request._meta.get_field
    try:
        params = [field(k).get_db_prep_save(v, connection) for k, v in values.items()]
        params += [field("id").get_db_prep_value(request_id, connection), Request.Status.QUEUED]
    except (ValueError, ValidationError):  # not a request id at all
        return None
    with connection.cursor() as cur:
        cur.execute(_claim_sql(connection.vendor, tuple(values)), params)
        row = cur.fetchone()
    if row is None:
        return None
    req_fields = concrete(Request)
    req = from_row(Request, req_fields, row[:len(req_fields)])
    if len(row) > len(req_fields):  # PostgreSQL: the dataset's row came with it
        req.dataset = from_row(Dataset, concrete(Dataset), row[len(req_fields):])
    else:  # SQLite has no data-modifying CTEs
        req.dataset = Dataset.objects.get(pk=req.dataset_id)
    return req


@functools.cache
def _claim_sql(vendor: str, columns: tuple[str, ...]) -> str:
    field = Request._meta.get_field
    # PostgreSQL: started and heartbeat on the database's clock, as every heartbeat and the
    # sweep's cutoff (governance.requests.recovery): a worker's own clock may be stepped or skewed
    own = [] if vendor != "postgresql" else [f"{field(k).column} = STATEMENT_TIMESTAMP()"
                                             for k in ("started_at", "heartbeat_at")]
    sets = ", ".join([f"{field(k).column} = %s" for k in columns] + own)
    ret = ", ".join(f.column for f in concrete(Request))
    update = f"UPDATE {Request._meta.db_table} SET {sets} WHERE id = %s AND status = %s RETURNING {ret}"
    if vendor != "postgresql":
        return update
    ds = ", ".join(f"d.{f.column}" for f in concrete(Dataset))
    return f"WITH r AS ({update}) SELECT r.*, {ds} FROM r JOIN {Dataset._meta.db_table} d ON d.id = r.dataset_id"


def quantum_ms(ds: Dataset) -> int:
    """The release clock of runs on ``ds``: the officer's setting, else ``RELEASE_QUANTUM_MS``."""
    return settings.RELEASE_QUANTUM_MS if ds.release_quantum_ms is None else ds.release_quantum_ms


class RunClock:
    """The clock of one run, started when the worker claims the request. What the analyst
    can observe of a run that reads data changes only on its ticks, every quantum (the
    dataset's ``release_quantum_ms``, else ``RELEASE_QUANTUM_MS``; README, "Release-path
    side channels"): the time a sampler
    takes depends on the noise it draws, and the time a query takes on the data.

    - Progress: the engine's reports are kept in memory; on the next tick a thread hands
      the latest one, with the heartbeat, to the process's releaser thread, which writes it
      on its persistent connection. A cancellation is noticed at such a write and raised
      (``Cancelled``) at the engine's next report.
    - The final state: written on the next tick by the process's releaser thread
      (``governance.requests.releaser``), so the task returns at once; ``hold()`` (sleeping until
      the tick) is for runs without a clock thread.
    - Heartbeat: written at least every ``REQUEST_HEARTBEAT_SECONDS`` (governance.requests.recovery
      tells a long, silent engine from a dead worker by it).

    Run eagerly in-process (tests) there is no thread: a report is written at once, at most
    every PROGRESS_INTERVAL seconds (and always the final one); ``hold()`` still waits."""

    def __init__(self, request_id, quantum_ms: int | None = None):
        self.request_id = request_id
        self.quantum = max(settings.RELEASE_QUANTUM_MS if quantum_ms is None else quantum_ms, 0) / 1000
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pending: dict | None = None
        self.cancelled = False
        self.write_failing = False
        self.thread = None
        self.last_direct = 0.0

    def __enter__(self):
        from workers import app

        if not app.conf.task_always_eager:
            self.thread = threading.Thread(target=self._ticks, name=f"clock-{self.request_id}", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)

    def next_tick(self, now: float) -> float:
        """The first tick at or after ``now`` (monotonic seconds); ticks start one quantum in."""
        if self.quantum <= 0:
            return now
        return self.t0 + max(1, math.ceil((now - self.t0) / self.quantum)) * self.quantum

    def hold(self) -> None:
        """Sleep until the next tick: the final state of a run is written on a tick."""
        delay = self.next_tick(time.monotonic()) - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def report(self, update: dict) -> None:
        """The engine's ``progress`` callback."""
        if self.thread is None:
            now = time.monotonic()
            if now - self.last_direct >= PROGRESS_INTERVAL or update.get("fraction") == 1.0:
                self.last_direct = now
                if not self._write(update):
                    raise Cancelled("cancelled by the analyst")
            return
        if self.cancelled:
            raise Cancelled("cancelled by the analyst")
        with self.lock:
            self.pending = update

    def _write(self, update: dict) -> bool:
        """Write a progress report (and the heartbeat) unless a cancellation was requested."""
        return bool(Request.objects.filter(pk=self.request_id, cancel_requested=False).update(
            progress=update, heartbeat_at=db_time()))

    def _ticks(self):
        """The clock thread: on each tick, the latest report (and the heartbeat when due) is
        handed to the process's releaser thread, which writes it on its own persistent
        database connection (a connection opened by this short-lived thread was a new
        PostgreSQL backend per run)."""
        period = self.quantum or PROGRESS_INTERVAL
        beat = settings.REQUEST_HEARTBEAT_SECONDS
        last_beat = time.monotonic()
        while True:
            now = time.monotonic()
            wake = self.t0 + (math.floor((now - self.t0) / period) + 1) * period
            if self.stop.wait(wake - now):
                return
            with self.lock:
                update, self.pending = self.pending, None
            if update is not None or (beat > 0 and time.monotonic() - last_beat >= beat):
                RELEASER.at(time.monotonic(), functools.partial(self._tick_write, update))
                last_beat = time.monotonic()

    def _tick_write(self, update: dict | None) -> None:
        """A tick's write (on the releaser thread): the report with the heartbeat, or the
        heartbeat alone; only while the request is running (an outcome written meanwhile
        keeps its progress). A report refused for a cancellation marks the run cancelled."""
        try:
            running = Request.objects.filter(pk=self.request_id, status=Request.Status.RUNNING)
            if update is None:
                running.update(heartbeat_at=db_time())
                # a cancel asked during a long phase without reports is raised at the next one
                self.cancelled = self.cancelled or running.filter(cancel_requested=True).exists()
            elif not running.filter(cancel_requested=False).update(progress=update, heartbeat_at=db_time()):
                self.cancelled = running.filter(cancel_requested=True).exists()  # raised at the next report
        except Exception as e:  # noqa: BLE001 - retried on the next tick; the sweep has a grace period
            # the traceback once, then a line per tick while it keeps failing (a full disk)
            log.warning("progress or heartbeat of request %s failed: %s", self.request_id, e,
                        exc_info=not self.write_failing)
            self.write_failing = True
        else:
            self.write_failing = False


_SERVER_PATH = re.compile(r"(?<![\w:/.])(?:/[^/\s'\"]+){2,}/?")


def no_paths(e: BaseException) -> str:
    """An error's message for the analyst, without the server's file paths (a stored table's
    location, a scratch directory) and, for an OS error, its words alone ("Read-only file
    system", not "[Errno 30] Read-only file system: '/srv/...'"): the server's log has the
    whole message."""
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return _SERVER_PATH.sub("<a server path>", text)


def _account_refusal(req: Request) -> AccountInactive | None:
    """An analyst deactivated since she submitted: her token stopped at once, and her
    queued requests stop too (they ran, their results unreadable until she came back)."""
    if not type(req.analyst).objects.filter(pk=req.analyst_id, is_active=True).exists():
        return AccountInactive(f"the account {req.analyst} was deactivated")
    return None


def _settings_refusal(req: Request, plan: Plan) -> UserError | None:
    """What the request's admission relied on and the officer changed while it waited: the
    dataset's allow_non_private (a non-private part) or pld_certification (a run certified
    by PLD) turned off, or the analyst's cap lowered below what she has spent and reserved
    ahead of this request (its own reservation included; those queued after it are the ones
    past the cap). Submitted now it would be refused; queued, it stops here, refunded (which
    may make room under the cap for the next one). A probe's three queued requests under a
    lowered cap: the first two were refused and the last one, the one past the cap, ran."""
    from ..ledger.actions import holds_on_ledger, recompute_state, to_event
    from ..ledger.limits import Limit
    from ..models import Grant

    allow_non_private, allow_pld = Dataset.objects.filter(pk=req.dataset_id).values_list(
        "allow_non_private", "pld_certification").get()
    if not allow_non_private and ev.has_non_private(to_event(plan.event)):
        return NonPrivateRefused(f"this request includes a non-private release and the privacy officer of dataset "
                                 f"{req.dataset.name} turned allow_non_private off", dataset=req.dataset.name)
    if not allow_pld and req.params.get("accountant") == "pld":
        return PldNotAllowed(f"this run is certified by PLD and the privacy officer of dataset {req.dataset.name} "
                             "turned pld_certification off", dataset=req.dataset.name)
    grant = Grant.objects.filter(dataset_id=req.dataset_id, analyst_id=req.analyst_id, revoked_at__isnull=True).first()
    limit = Limit.of_grant(grant, req.dataset) if grant is not None else None
    if limit is None:
        return None
    state = Cost.from_json(grant.state)
    if holds_on_ledger(limit, state, req.dataset_id, grant.pk):
        return None
    if req.ledger_entry_id is not None:  # over it as a whole: is this one past it, in the order admitted?
        state = recompute_state(req.dataset_id, grant.pk, up_to=req.ledger_entry_id)
        if holds_on_ledger(limit, state, req.dataset_id, grant.pk, up_to=req.ledger_entry_id):
            return None
    return BudgetExceeded(f"the privacy officer lowered {req.analyst}'s cap on dataset {req.dataset.name} to "
                          f"epsilon {limit.epsilon:.6g}, below what is spent and reserved under it ahead of this "
                          f"request ({limit.spent(state):.6g})", scope="grant", dataset=req.dataset.name)


def _run(req: Request, clock: RunClock) -> str:
    ds = req.dataset
    plan = Plan(**req.plan)
    engine_request = EngineRequest(kind=req.kind, params=req.params)

    try:
        # a grant revoked, a dataset or an account deactivated while the request waited stops it here
        refusal = access_refusal(req.analyst, ds) or _account_refusal(req) or _settings_refusal(req, plan)
        if refusal is None:
            meta = dataset_meta(ds)
            # the engine may have been removed since planning; what it imports (torch, ...) is
            # loaded now, and the plan's version checked (one queued across an upgrade of the
            # service): a worker that cannot load or run it fails before the read, refunded
            plugins.prepare(req.engine, plan)
            workdir = scratch_dir()  # before the read: a full or unwritable results disk is a refund
    except Exception as e:
        # The rows never reached the engine: nothing was released, refund.
        return _failed_before_read(req, e)
    if refusal is not None:
        return _finish(req, Request.Status.CANCELLED, error={
            "code": refusal.code, "detail": f"Not run: {refusal} (since the request was admitted); nothing was read, "
                                            "the reservation is refunded."}, charge=False)
    try:
        if ds.execution == Dataset.Execution.DISTRIBUTED:  # footers only: a check hung on a file reads no row
            data = load_columns(ds, list(plan.columns))
            read = _mark_data_read(req.pk)
        else:
            read = _mark_data_read(req.pk)
            data = load_columns(ds, list(plan.columns)) if read else None
    except (OperationalError, InterfaceError):
        # the service's database away or full (the read mark, a federation's sites): no row
        # was read and nothing can be written now; the task is sent again and takes its
        # request back (``reclaim``), or the sweep refunds it. Taken for the table's failure,
        # a probe's full disk read "could not read its table", and a database back within
        # seconds would have failed the request as "the dataset's table is missing".
        raise
    except Exception as e:
        # No row reached the engine: refund. A local table's read failed as rows were read
        # (a stored file damaged or changed since registration): its message can quote a row
        # (a CSV parser's names the line it stopped at), so the officer's report has it and
        # the analyst a fixed text; as for a partition no longer as registered. A cluster's
        # or federation's setup failed before any row (its message names no data).
        if ds.execution == Dataset.Execution.LOCAL or getattr(e, "code", None) == "dataset.partition_invalid":
            _log_failure(req.pk, e, "could not read its table")
            processes.note_out_of_memory(e)
            return _finish(req, Request.Status.FAILED, error={"code": "request.failed_before_read", "detail": (
                "Failed before the data was read: the dataset's table (or a partition of it) is missing, unreadable "
                "or no longer as registered (the privacy officer's page of this request says why); the reservation "
                "is refunded.")}, charge=False, officer_report={"failure": str(e)})
        return _failed_before_read(req, e)
    if not read:
        return _finish(req, Request.Status.CANCELLED, error={
            "code": "request.cancelled", "detail": "Cancelled before the data was read; the reservation is refunded."},
            charge=False)

    _cluster_jobs()  # forget any job an earlier run of this thread left noted
    # a federated run: its progress per round and the sites its audit record names
    recorder = federated_runs.Recorder(clock.report, data.superlink) if isinstance(data, Federation) else None
    try:
        release = plugins.run(req.engine, engine_request, meta, data, plan, recorder or clock.report, workdir)
        if clock.cancelled or _cancel_asked(req.pk):
            # asked after the engine's last report was handed over (a synthesis's reports and
            # release are its last two): the run is cancelled as promised, not released
            late = Cancelled("cancelled by the analyst")
            late.actual_event = release.actual_event
            raise late
    except Cancelled as c:
        _empty_quietly(workdir)
        return _finish(req, Request.Status.CANCELLED, error={
            "code": "request.cancelled",
            "detail": outcomes.CANCELLED_RUNNING},
            actual_event=c.actual_event, charge=True, clock=clock, officer_report=_jobs(recorder))
    except Exception as e:
        if isinstance(e, EngineError) and getattr(e, "nothing_read", False):
            # the engine knows no row was read (a federated run no site answered): refund
            _empty_quietly(workdir)
            return _finish(req, Request.Status.FAILED, error={
                "code": "request.failed_before_read", "detail": f"No data was read: {e}"},
                charge=False, clock=clock, officer_report=_jobs(recorder))
        _log_failure(req.pk, e)
        processes.note_out_of_memory(e)
        _empty_quietly(workdir)
        # The engine may name the work done before the failure (a data-parallel run that lost a
        # rank, a training stopped by the time limit: the steps taken); that is charged, as
        # for a cancellation.
        spent = getattr(e, "actual_event", None)
        if _time_limited(e):
            limit = settings.CELERY_TASK_SOFT_TIME_LIMIT
            error = {"code": "request.time_limit",
                     "detail": f"Stopped by the workers' time limit ({limit} s, CELERY_TASK_SOFT_TIME_LIMIT) after "
                               "reading the data; the work done is charged."}
        else:
            error = {"code": "request.failed_after_read", "detail": (
                "The results storage is full, read-only or gone: the engine could not write its files after "
                "reading the data; the charge stands." if _storage_full(e, workdir) else
                "The engine failed after reading the data; the charge stands (a failure can depend on the data).")}
        return _finish(req, Request.Status.FAILED, error=error, actual_event=spent, charge=True, clock=clock,
                       officer_report=_jobs(recorder))
    try:
        result, officer = _keep_files(req, release, workdir, recorder)
    except OSError as e:  # the results disk: the release made but not kept, the charge stands
        log.error("request %s: its files could not be kept: %s", req.pk, e)
        _empty_quietly(workdir)
        return _finish(req, Request.Status.FAILED, error={
            "code": "request.failed_after_read",
            "detail": f"The release could not be stored ({e.strerror or type(e).__name__}); the data was read, so "
                      "the charge stands."}, actual_event=release.actual_event, charge=True, clock=clock)
    return _finish(req, Request.Status.SUCCEEDED, result=result, actual_event=release.actual_event, charge=True,
                   officer_report=officer, clock=clock)


def _cancel_asked(request_id) -> bool:
    """Whether the analyst asked to cancel after the engine's last report. The database away
    at that moment is no cancellation: the result is in hand and its outcome's write is
    tried again until the database is back (``outcomes._again``); raised, the error was
    taken for the engine's, a finished result dropped and charged in full (a probe's
    PostgreSQL restart, 4 runs of 5). Released, a result whose cancel came just then is
    the analyst's own, charged the same (a cancel after the read commits the work done)."""
    try:
        return Request.objects.filter(pk=request_id, cancel_requested=True).exists()
    except outcomes.DATABASE_AWAY as e:
        log.warning("request %s: its cancel flag could not be read (%s); taken as not cancelled", request_id, e)
        return False


def _failed_before_read(req: Request, e: Exception) -> str:
    """Refunded: the rows never reached the engine, and the failure's message names no data
    (an engine that cannot load, a full results disk, a cluster out of reach)."""
    log.exception("request %s failed before reading data", req.pk)
    processes.note_out_of_memory(e)
    return _finish(req, Request.Status.FAILED, error={"code": "request.failed_before_read",
                                                      "detail": f"Failed before the data was read: {no_paths(e)}"},
                   charge=False)


def _time_limited(e: BaseException) -> bool:
    """The worker's soft time limit stopped the run (Celery raises it in the task)."""
    from celery.exceptions import SoftTimeLimitExceeded

    return isinstance(e, SoftTimeLimitExceeded)


def _storage_full(e: BaseException, workdir: Path | None = None) -> bool:
    """The engine's failure was a full (over-quota, read-only) disk: a fact about the server, said to
    the analyst, not a message that could quote the data. Seen in the error, or in the disk
    itself (torch.save says RuntimeError), or the run's scratch directory gone (the results
    directory removed or unmounted during the run)."""
    return ((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)) or disk_full()
            or not (workdir is None or workdir.is_dir()))


def _keep_files(req: Request, release, workdir: Path, recorder) -> tuple[dict, dict | None]:
    """The result and officer report with the files the run wrote (moved to the request's
    results directory)."""
    result = dict(release.result)
    files = _describe_files(workdir)
    if files:
        result["files"] = files
    officer = dict(release.officer_report) if release.officer_report is not None else None
    if officer is not None and (workdir / "officer").is_dir():
        officer["files"] = _describe_files(workdir / "officer")
    if recorder is not None:
        officer = {**(officer or {}), "cluster": recorder.job(result)}
    if any(workdir.iterdir()):  # the files become the request's; the next run gets a new scratch
        target = results_dir(req.pk)
        shutil.rmtree(target, ignore_errors=True)  # a previous delivery's
        target.parent.mkdir(parents=True, exist_ok=True)
        workdir.rename(target)
    return result, officer


READING = {"phase": "reading data", "fraction": 0.0}


def _mark_data_read(request_id) -> bool:
    """``data_read`` set (and the phase shown) before the first row is read: the charging
    rule's mark; False (nothing set) if the analyst asked to cancel before it: nothing is
    read then, and the reservation is refunded (a probe's cancel while the worker loaded
    torch was read and charged in full). One written-out statement (the ORM's update cost
    three times its database work here)."""
    field = Request._meta.get_field
    with connection.cursor() as cur:
        cur.execute(_data_read_sql(), [field("data_read").get_db_prep_save(True, connection),
                                       field("progress").get_db_prep_save(READING, connection),
                                       field("id").get_db_prep_value(request_id, connection),
                                       field("cancel_requested").get_db_prep_save(False, connection)])
        return cur.rowcount == 1


@functools.cache
def _data_read_sql() -> str:
    field = Request._meta.get_field
    return (f"UPDATE {Request._meta.db_table} SET {field('data_read').column} = %s, {field('progress').column} = %s "
            f"WHERE id = %s AND {field('cancel_requested').column} = %s")


def _jobs(recorder) -> dict | None:
    """The officer report of a run that failed or was cancelled: what names its job in the
    audit record (a federated run's sites, or a distributed run's cluster jobs)."""
    return {"cluster": recorder.job()} if recorder is not None else _cluster_jobs()


def _cluster_jobs() -> dict | None:
    """The cluster jobs this thread sent during the run (``engines.distributed.cluster``),
    as the officer report of a run that failed or was cancelled, so that its audit record
    names them too (a successful run's report has them already)."""
    dc = sys.modules.get("engines.distributed.cluster")  # never imported: no cluster was used
    job = dc.take_submitted() if dc is not None else None
    return {"cluster": job} if job else None


def _log_failure(request_id, e: Exception, what: str = "failed after reading data") -> None:
    """The worker log gets the failure's type and where it happened, not its message: a
    message raised after the read can quote the data (a value, a row), and logs are no place
    for raw rows. Run the engine on public or synthetic data to see the message."""
    stack = "".join(traceback.format_tb(e.__traceback__))
    log.error("request %s %s: %s (message withheld: it may quote the data)\n%s",
              request_id, what, type(e).__name__, stack)


def scratch_dir() -> Path:
    """An empty directory for this process's (and thread's) run to write files into; kept
    between runs that write none (creating and removing a directory per request cost ~3 ms
    of a DP count here), renamed to the request's results directory when they do."""
    base = Path(settings.RESULTS_DIR) / ".scratch"
    path = base / f"{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    if path.is_dir():
        _empty(path)
    else:
        remove_dead_scratch(base)
        # the service's own: its files (a model, a synthetic table, the officer's reports on the
        # private rows) are not for the host's other accounts; the results directory it is
        # renamed to keeps the mode
        path.mkdir(parents=True, mode=0o700)
    check_writable(path)
    if path.stat().st_mode & 0o077:  # made before the mode was set
        path.chmod(0o700)
    return path


def remove_dead_scratch(base: Path) -> None:
    """Remove the scratch directories of this host's processes that are gone: a run killed
    (kill -9, the hard time limit) left its files there (a synthetic table, the officer's
    reports on every training row) with no release naming them, and its process id never
    comes back to empty them. Done when a process starts its first run."""
    try:
        entries = list(base.iterdir())
    except OSError:  # no scratch directory yet
        return
    for entry in entries:
        pid = _pid_here(entry.name)
        if pid is not None and processes.gone(pid):
            shutil.rmtree(entry, ignore_errors=True)


def _pid_here(name: str) -> int | None:
    """The process id of a scratch directory ``host-pid-thread`` (a host name may hold '-')
    of this host; None for another host's."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    return int(parts[1])


def remove_stale_scratch(older_than: float | None = None) -> list[str]:
    """Remove the scratch directories of any host whose newest file is older than
    ``older_than`` seconds (default: the hard time limit and REQUEST_LOST_AFTER_SECONDS
    more), judged on the clock that stamps the files: no run lasts that long, so what a run
    left there (a synthetic table charged but never released, the officer's reports) is a
    killed process's, whose host may never come back (a Kubernetes pod is replaced under
    another name) to remove it (``remove_dead_scratch`` only judges its own host's). An
    empty directory, which holds nothing, is left to its process, and so is one of a live
    process of this host (a solo or threads pool enforces no time limit); a host whose
    workers run longer than this host's CELERY_TASK_TIME_LIMIT should not share its results
    volume with it. Run by the recovery sweep; returns their names."""
    if older_than is None:
        older_than = settings.CELERY_TASK_TIME_LIMIT + settings.REQUEST_LOST_AFTER_SECONDS
    base = Path(settings.RESULTS_DIR) / ".scratch"
    try:
        entries = [e for e in base.iterdir() if e.is_dir() and not e.is_symlink()]
    except OSError:  # no scratch directory yet
        return []
    now = processes.files_now(base)
    if now is None:  # nothing can be written there: nothing is judged
        return []
    cutoff = now - older_than
    removed = []
    for entry in entries:
        pid = _pid_here(entry.name)
        if pid is not None and not processes.gone(pid):
            continue  # a live process of this host (a solo pool has no time limit): its own to empty
        try:
            stamps = [p.lstat().st_mtime for p in entry.rglob("*")]
            if not stamps or max(stamps + [entry.lstat().st_mtime]) > cutoff:
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _empty_quietly(path: Path) -> None:
    """``_empty`` on a run's way to its outcome, which must be written whatever the disk
    does: a results directory removed or made read-only during the run raised here, the
    outcome was never written and the request ran on as "running" until the sweep took its
    worker for lost, minutes later (probe CP). Left over files go with the next run of this
    process (``scratch_dir``) or the sweep (``remove_dead_scratch``)."""
    try:
        _empty(path)
    except OSError as e:
        log.warning("scratch directory %s could not be emptied: %s", path, e)


def _empty(path: Path) -> None:
    """Remove what a run (or a killed earlier run of this process id) left in ``path``."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _describe_files(workdir: Path) -> list[dict]:
    out = []
    for path in sorted(workdir.iterdir()):
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            out.append({"name": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()})
    return out


def _finish(req: Request, status: str, *, result=None, error=None, actual_event=None, charge: bool,
            officer_report=None, clock: RunClock | None = None) -> str:
    """Write the outcome; once the data was read (``clock`` given), on the clock's next tick.
    In a real worker (the clock has its thread) the process's releaser thread writes it,
    with every other outcome due at that moment in one transaction (group commit,
    ``governance.requests.outcomes``), so the task slot is free meanwhile; at quantum 0 too, the
    tick being now. Run in-process (no clock thread) the task sleeps until the tick and
    writes it itself."""
    out = outcomes.Outcome(req, status, result=result, error=error, actual_event=actual_event, charge=charge,
                           officer_report=officer_report)
    if clock is None:
        return outcomes.write(out)
    due = clock.next_tick(time.monotonic())
    # The run's heartbeat stops with its task: a wait longer than half the sweep's grace
    # period is slept in the task instead, with the clock thread still beating.
    if clock.thread is None:  # run in-process (no worker): written here
        clock.hold()
        return outcomes.write(out)
    if due - time.monotonic() > settings.REQUEST_LOST_AFTER_SECONDS / 2:
        clock.hold()
        return outcomes.write_or_retry(out)
    RELEASER.at(due, out, group=outcomes.write_group)
    _LAST_TICK.due = due  # this thread's next claim waits for it (``execute``)
    return status
