"""Tasks take ids, never model objects; the request row exists (queued) before the task is
sent. User errors are not retried; a second delivery of a task changes nothing."""

import logging
import os
import signal
import threading
import time

from celery import Task, shared_task
from celery.signals import (
    beat_embedded_init,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

log = logging.getLogger(__name__)


class RequestTask(Task):
    """A request's task is sent after its row and reservation are committed
    (``transaction.on_commit``). When the message cannot be sent, raising would turn the POST
    of an admitted, charged request into a 500 (the analyst never learns its id); instead
    the request stays ``queued``, marked unsent, and the next recovery sweep sends it
    (``governance.requests.recovery``, rule 3; ``governance.core.dispatch.publish_or_mark`` marks it).
    Seen in bench/bench_faults.py: Redis restarting or unreachable past Celery's publish
    retries (``OperationalError``), and kombu's Redis channel torn down under a publish by
    the reconnection of another thread (``AttributeError: 'NoneType' object has no attribute 'client'``)."""

    def apply_async(self, args=None, kwargs=None, **options):
        # No time limits in the message: the worker's own CELERY_TASK_*_TIME_LIMIT apply.
        # Celery stamps the sender's (the web process's, the sweep's) into each message, and a
        # worker obeys the message's over its own: limits set on the workers never fired.
        options.setdefault("time_limit", None)
        options.setdefault("soft_time_limit", None)
        if self.app.conf.task_always_eager:  # run in-process (tests): nothing is sent, errors are the task's own
            return super().apply_async(args, kwargs, **options)
        from governance.core.dispatch import publish_or_mark

        request_id = (args or [None])[0] or (kwargs or {}).get("request_id")
        return publish_or_mark(lambda: super(RequestTask, self).apply_async(args, kwargs, **options), request_id)

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        """The hard time limit killed the pool process running a request (Celery calls this in
        the worker's main process): the request this task's turn ran (not always its
        message's own) is finished now as ``request.time_limit``, not by the sweep minutes
        later as a lost worker."""
        from billiard.exceptions import TimeLimitExceeded

        if not isinstance(exc, TimeLimitExceeded):
            return
        from django.conf import settings
        from django.db import connections

        from governance.requests.recovery import finish_killed_by_time_limit

        try:
            done = finish_killed_by_time_limit(task_id, settings.CELERY_TASK_TIME_LIMIT)
            if done:
                log.error("request %s: killed by the hard time limit; finished as request.time_limit", done)
        except Exception:  # noqa: BLE001 - the database away: the sweep finishes it as lost
            log.exception("task %s: killed by the hard time limit, its request not finished here", task_id)
        finally:
            connections.close_all()  # this is the pool's parent: no connection of it may pass to a forked child


# max_retries=None here: retry()'s own max_retries=None means "the task's default", 3, and
# a probe's database away for more than about 7 s dropped the message with a traceback
@shared_task(name="workers.run_request", base=RequestTask, acks_late=True, ignore_result=True, bind=True,
             max_retries=None)
def run_request(self, request_id: str) -> str:
    """Run an admitted request through its engine and commit (or refund) its charge.

    The database away (restarting, unreachable) when the task arrives: the claim raised, and
    Celery acknowledged the failed task, so the message was gone while the request stayed
    ``queued`` with its budget reserved until the sweep's re-send period (6 h on Redis; 27
    such requests in one 25 s PostgreSQL outage). Now the task is sent again after 1, 2, 4
    ... up to 30 s until the database answers; a copy that finds the request claimed changes
    nothing (the claim is a compare-and-set), unless the claim was this task's own and no
    row was read: the copy takes it back once its heartbeat has stopped (``reclaim``)."""
    from django.conf import settings
    from django.db import InterfaceError, InternalError, OperationalError

    from governance.requests.execution import StillRunning, execute

    from governance.core.errors import storage_unwritable

    try:
        # a worker's message is a turn of its queue (governance.requests.turns); an eager
        # task (tests) runs its own request, as its caller expects
        status = execute(request_id, worker=self.request.hostname or "", task=self.request.id or "",
                         take_turns=not self.request.is_eager, retried=bool(self.request.retries),
                         worker_process="" if self.request.is_eager else _worker_process())
    except StillRunning as exc:  # its run may be alive: asked again once a heartbeat would have come
        raise self.retry(exc=exc, countdown=settings.REQUEST_HEARTBEAT_SECONDS) from exc
    except (OperationalError, InterfaceError, InternalError) as exc:
        if isinstance(exc, InternalError) and storage_unwritable(exc) is None:
            raise  # a read-only PostgreSQL (a standby after a failover) is sent again; nothing else is
        if self.request.is_eager:
            raise
        log.warning("request %s: the database is unavailable (%s); its task is sent again", request_id, exc)
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 30)) from exc
    _replace_after_out_of_memory(f"the run in the turn of request {request_id}")
    return status


_IN_POOL_PROCESS = []  # set in a prefork pool's process (worker_process_init)


@worker_process_init.connect
def _pool_process(**_kwargs):
    """A prefork pool's child, not the worker itself: Celery's solo pool sends this signal
    too, in the worker's main process, which then exited on a run out of memory and left
    every queued request with no worker (a probe's, ``--pool solo``)."""
    from billiard.process import current_process

    if current_process().name != "MainProcess":
        _IN_POOL_PROCESS.append(True)


def _worker_process() -> str:
    """The worker process whose liveness record this task's process is covered by, as the
    record names it (``liveness.process_key``): a prefork pool's child runs under its
    parent's record, a solo or threads pool is the worker."""
    from governance.core.liveness import process_key

    return process_key(os.getppid() if _IN_POOL_PROCESS else os.getpid())


def _replace_after_out_of_memory(work: str) -> None:
    """Work that ran out of memory (a request's run, a registration's read) left its process
    holding it (``governance.core.processes.note_out_of_memory``): in a prefork pool the
    process exits once the outcome is written (``worker_process_shutdown`` drains the
    releaser) and the pool starts a fresh one. Celery logs the exit as a lost worker; the
    work is already final, and a second delivery of its task changes nothing. A solo or
    threads pool is the worker itself: it keeps running, with an error in the log."""
    from governance.core.processes import OUT_OF_MEMORY

    if not OUT_OF_MEMORY.is_set():
        return
    if not _IN_POOL_PROCESS:
        log.error("%s ran out of memory; this worker (a solo or threads pool) keeps what it allocated: "
                  "restart it, or run a prefork pool, which replaces the process", work)
        OUT_OF_MEMORY.clear()
        return
    log.warning("%s ran out of memory: this pool process (pid %s) exits and the pool starts a fresh one",
                work, os.getpid())
    raise SystemExit(0)


@shared_task(name="workers.register_dataset", acks_late=True, ignore_result=True)
def register_dataset(dataset_id: int) -> str:
    """Read a pending dataset's table off the request thread (governance.datasets.registry)."""
    from governance.datasets.registry import finish_registration

    status = finish_registration(dataset_id)
    _replace_after_out_of_memory(f"the registration of dataset {dataset_id}")
    return status


@shared_task(name="workers.clear_sessions", ignore_result=True)
def clear_sessions() -> None:
    """Delete expired web sessions (Django's ``clearsessions``), run hourly by Celery beat:
    Django keeps a row per sign-in until then."""
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    Session.objects.filter(expire_date__lt=timezone.now()).delete()


@shared_task(name="workers.sweep", ignore_result=True)
def sweep() -> dict:
    """The recovery sweep (governance.requests.recovery), run every minute by Celery beat."""
    from django.conf import settings

    from governance.datasets.files import drop_orphan_files
    from governance.datasets.registry import resend_stale_registrations
    from governance.requests.execution import remove_stale_scratch
    from governance.requests.recovery import sweep as run_sweep

    out = run_sweep()
    out["registrations"] = resend_stale_registrations(settings.REQUEST_LOST_AFTER_SECONDS)
    out["orphan_files"] = drop_orphan_files()
    out["stale_scratch"] = remove_stale_scratch()
    try:
        from governance.core.liveness import sweep_ran

        sweep_ran()  # manage.py workers says when the sweep last ran
    except Exception:  # noqa: BLE001 - the sweep's work is done; its stamp is for readers
        log.exception("the recovery sweep's last-run stamp could not be written")
    return out


_HEARTBEAT = []


@worker_ready.connect
def _start_heartbeat(sender=None, **_kwargs):
    """The worker's liveness record (governance.core.liveness), every WORKER_HEARTBEAT_SECONDS
    from the main process: ``manage.py workers`` and the officer's dashboard read it. With
    an embedded beat (``manage.py worker --beat``), a watch that starts it again if it dies."""
    from governance.core.liveness import Heartbeat

    try:
        queues = list(sender.app.amqp.queues.consume_from or {})
    except Exception:  # noqa: BLE001
        queues = []
    _HEARTBEAT.append(Heartbeat(getattr(sender, "hostname", "") or "worker", queues).start())
    controller = getattr(sender, "controller", None)
    if getattr(controller, "beat", None) is not None:
        _HEARTBEAT.append(BeatWatch(controller).start())
    if controller is not None:
        _HEARTBEAT.append(PoolWatch(controller).start())


class StopClock:
    """How long processes have been stopped (SIGSTOP, a job-control stop): ``too_long``
    gives those among ``pids`` stopped for ``limit`` seconds, seen at each look."""

    def __init__(self, limit: float):
        self.limit = limit
        self.since: dict[int, float] = {}  # pid -> monotonic time first seen stopped

    def too_long(self, pids) -> list[int]:
        import psutil

        now, out, since = time.monotonic(), [], {}
        for pid in pids:
            try:
                stopped = psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
            except psutil.Error:
                stopped = False
            if stopped:
                since[pid] = self.since.get(pid, now)
                if now - since[pid] >= self.limit:
                    out.append(pid)
        self.since = since
        return out


class _Watch:
    """A thread of the worker's main process that looks (``look``) every ``interval``
    seconds until the worker stops, with a ``StopClock`` of EMBEDDED_BEAT_STOPPED_SECONDS."""

    name = "governance-watch"

    def __init__(self, controller, interval: float = 5.0):
        from django.conf import settings

        self.controller, self.interval = controller, interval
        self._stopped = StopClock(settings.EMBEDDED_BEAT_STOPPED_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.look()

    def look(self) -> None:
        raise NotImplementedError

    def stop(self):
        self._stop.set()


class PoolWatch(_Watch):
    """A pool process stopped (SIGSTOP, a job-control stop) holds its task, the requests
    queued behind it and, on a worker of one process, the recovery sweep (a task on the
    same pool): a probe's stopped process kept every request queued for good while
    ``manage.py workers`` called the worker alive. This watch kills a child process
    stopped for ``EMBEDDED_BEAT_STOPPED_SECONDS`` (the beat is ``BeatWatch``'s): the pool
    starts a new one, and the task ends as a lost worker's does (a ``kill -9`` of a pool
    process: charged if its data was read, else refunded)."""

    name = "governance-pool-watch"

    def _children(self) -> list[int]:
        import psutil

        beat = getattr(getattr(self.controller, "beat", None), "pid", None)
        try:
            return [p.pid for p in psutil.Process().children() if p.pid != beat]
        except psutil.Error:
            return []

    def look(self) -> None:
        for pid in self._stopped.too_long(self._children()):
            log.error("worker process %s was stopped (SIGSTOP) for over %g s: killed (the pool starts a new one; "
                      "its task ends as a lost worker's)", pid, self._stopped.limit)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class BeatWatch(_Watch):
    """Celery runs an embedded beat (``worker --beat``) as a child process and never looks
    at it again: killed (the OOM killer, a stray signal), the recovery sweep was never sent
    again and nothing said so. This thread of the worker's main process looks every
    ``interval`` seconds and starts a new one, with an error in the log. A beat stopped
    (SIGSTOP, a job-control stop) for ``EMBEDDED_BEAT_STOPPED_SECONDS`` counts as dead: it
    is killed and replaced (a probe's stopped beat held two requests queued, their messages
    gone, while ``manage.py workers`` said all was well)."""

    name = "governance-beat-watch"

    def __init__(self, controller, interval: float = 5.0):
        super().__init__(controller, interval)
        self.restarts = 0

    def look(self) -> None:
        beat = self.controller.beat
        if beat is None or not hasattr(beat, "is_alive") or self._stop.is_set():
            return
        if not beat.is_alive():
            self._restart(f"died (exit code {getattr(beat, 'exitcode', None)})")
        elif self._stopped.too_long([beat.pid]):
            try:
                os.kill(beat.pid, signal.SIGKILL)
                beat.join(5)
            except (OSError, AssertionError):
                pass
            self._restart(f"was stopped (SIGSTOP) for over {self._stopped.limit:g} s; killed")

    def _restart(self, why: str) -> None:
        from celery.beat import EmbeddedService

        log.error("the embedded beat process %s: the recovery sweep stopped; starting a new beat", why)
        self._stopped.since.clear()
        try:
            beat = EmbeddedService(self.controller.app, schedule_filename=self.controller.schedule_filename,
                                   scheduler_cls=self.controller.scheduler)
            beat.start()
        except Exception:  # noqa: BLE001 - tried again at the next look
            log.exception("the embedded beat could not be started again")
            return
        self.controller.beat = beat
        self.restarts += 1

    def stop(self):
        """The worker is stopping: no more restarts, and a beat this watch started is
        stopped (Celery's own step stops only the first)."""
        self._stop.set()
        if self.restarts and self.controller.beat is not None:
            try:
                self.controller.beat.stop()
            except Exception:  # noqa: BLE001
                pass


@beat_embedded_init.connect
def _exit_with_the_worker(**_kwargs):
    """In an embedded beat (the child process of ``manage.py worker --beat``): exit within
    seconds once the worker that started it is gone. A worker killed with ``kill -9`` (or by
    the OOM killer) left its beat running alone for good, sending the sweep every minute
    beside the next worker's own beat (three such orphans after one CI run)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        log.warning("the worker that started this embedded beat is gone: the beat stops")
        os._exit(0)

    threading.Thread(target=watch, name="governance-beat-parent", daemon=True).start()


@worker_shutdown.connect
def _stop_heartbeat(**_kwargs):
    while _HEARTBEAT:
        _HEARTBEAT.pop().stop()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _write_pending_outcomes(**_kwargs):
    """A worker stopping cleanly writes the outcomes waiting for their tick first (governance.requests.releaser)."""
    from governance.requests.releaser import RELEASER

    RELEASER.drain()


@task_prerun.connect
@task_postrun.connect
def _database_connections(task=None, **_kwargs):
    """Persistent connections in the worker as in the web (CELERY_DB_REUSE_MAX in settings):
    before and after each task, close those past CONN_MAX_AGE or broken by an error (Django's
    ``close_old_connections``, run for every web request). Not for an eager task: that runs
    inside its caller's (a test's) transaction."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
