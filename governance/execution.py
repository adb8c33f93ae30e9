"""Running an admitted request on a worker (called by the Celery task).

Idempotent: the run claims the request with a compare-and-set ``queued -> running``; a
second delivery of the same task finds it claimed (or finished) and does nothing.

Charging rule: a failure *before* the data is read refunds the reservation; once the
worker has started reading the data the charge stays, whatever happens next, because the
failure itself may depend on the data. Errors after the read are reported to the analyst
without their message (which could depend on the data); the worker log keeps it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engines import plugins
from engines.types import Cancelled, EngineRequest, Plan

from . import audit, ledger
from .data import load_columns
from .engine_meta import dataset_meta
from .models import Request

log = logging.getLogger(__name__)
PROGRESS_INTERVAL = 0.5  # seconds between progress writes


def execute(request_id: str, worker: str = "") -> str:
    """Run one request to a final state; returns its final (or current) status."""
    now = timezone.now()
    claimed = Request.objects.filter(pk=request_id, status=Request.Status.QUEUED).update(
        status=Request.Status.RUNNING, started_at=now, heartbeat_at=now, worker=worker[:200],
        progress={"phase": "starting", "fraction": 0.0})
    if not claimed:
        return Request.objects.filter(pk=request_id).values_list("status", flat=True).first() or "missing"
    with Heartbeat(request_id):
        return _run(request_id)


class Heartbeat:
    """Writes the running request's ``heartbeat_at`` every REQUEST_HEARTBEAT_SECONDS from a
    thread, so that the recovery sweep (governance.recovery) can tell a long, silent
    engine from a dead worker. Not started for tasks run eagerly in-process (tests)."""

    def __init__(self, request_id):
        self.request_id = request_id
        self.stop = threading.Event()
        self.thread = None

    def __enter__(self):
        from workers import app

        if not app.conf.task_always_eager and settings.REQUEST_HEARTBEAT_SECONDS > 0:
            self.thread = threading.Thread(target=self.beat, name=f"heartbeat-{self.request_id}", daemon=True)
            self.thread.start()
        return self

    def beat(self):
        from django.db import connection

        try:
            while not self.stop.wait(settings.REQUEST_HEARTBEAT_SECONDS):
                try:
                    Request.objects.filter(pk=self.request_id, status=Request.Status.RUNNING).update(
                        heartbeat_at=timezone.now())
                except Exception:  # noqa: BLE001 - a missed beat is retried; the sweep has a grace period
                    log.warning("heartbeat of request %s failed", self.request_id, exc_info=True)
        finally:
            connection.close()

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


def _run(request_id) -> str:
    req = Request.objects.select_related("dataset").get(pk=request_id)
    ds = req.dataset
    plan = Plan(**req.plan)
    engine_request = EngineRequest(kind=req.kind, params=req.params)

    try:
        meta = dataset_meta(ds)
        plugins.info(req.engine)  # the engine may have been removed since planning
        Request.objects.filter(pk=req.pk).update(data_read=True, progress={"phase": "reading data", "fraction": 0.0})
        data = load_columns(ds, list(plan.columns))
    except Exception as e:
        # The rows never reached the engine: nothing was released, refund.
        log.exception("request %s failed before reading data", req.pk)
        return _finish(req, Request.Status.FAILED, error={"code": "request.failed_before_read",
                                                          "detail": f"Failed before the data was read: {e}"},
                       charge=False)

    workdir = results_dir(req.pk)
    shutil.rmtree(workdir, ignore_errors=True)  # a previous delivery's partial files
    workdir.mkdir(parents=True)
    try:
        release = plugins.run(req.engine, engine_request, meta, data, plan, _progress(req.pk), workdir)
    except Cancelled as c:
        shutil.rmtree(workdir, ignore_errors=True)
        return _finish(req, Request.Status.CANCELLED, error={
            "code": "request.cancelled",
            "detail": "Cancelled while running; the data was read, the charge for the work done stands."},
            actual_event=c.actual_event, charge=True)
    except Exception:
        log.exception("request %s failed after reading data", req.pk)
        shutil.rmtree(workdir, ignore_errors=True)
        return _finish(req, Request.Status.FAILED, error={
            "code": "request.failed_after_read",
            "detail": "The engine failed after reading the data; the charge stands (a failure can depend on the data)."},
            charge=True)
    result = dict(release.result)
    files = _describe_files(workdir)
    if files:
        result["files"] = files
    officer = dict(release.officer_report) if release.officer_report is not None else None
    if officer is not None and (workdir / "officer").is_dir():
        officer["files"] = _describe_files(workdir / "officer")
    if not any(workdir.iterdir()):
        workdir.rmdir()
    return _finish(req, Request.Status.SUCCEEDED, result=result, actual_event=release.actual_event, charge=True,
                   officer_report=officer)


def results_dir(request_id) -> Path:
    """Where a request's files live (a replay serves the files of the request it replays)."""
    return Path(settings.RESULTS_DIR) / str(request_id)


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
            officer_report=None) -> str:
    ctx = audit.Context.of_request(req, outcome=status, reason=(error or {}).get("code", ""),
                                   detail=(error or {}).get("detail", ""), result_sha256=audit.result_digest(result))
    with transaction.atomic():
        # The request row first (as the recovery sweep does), then the ledger: a request the
        # sweep already declared lost is left as it is and this run's result is dropped.
        finished = Request.objects.filter(pk=req.pk, status=Request.Status.RUNNING).update(
            status=status, result=result, error=error, finished_at=timezone.now(), officer_report=officer_report,
            progress={"phase": status, "fraction": 1.0})
        if not finished:
            log.warning("request %s was finished elsewhere (recovery sweep); its run's outcome is dropped", req.pk)
            return Request.objects.filter(pk=req.pk).values_list("status", flat=True).first()
        if req.ledger_entry_id:
            if charge:
                ledger.commit(req.ledger_entry_id, actual_event, audit_ctx=ctx)
            else:
                ledger.release(req.ledger_entry_id, audit_ctx=ctx)
    return status


def _progress(request_id):
    """The engine's ``progress``: writes the update at most every PROGRESS_INTERVAL seconds
    (and always the first and the final one), and checks for a cancellation in the same
    statement: the write only matches a row whose cancellation was not requested. So a
    cancellation is seen at the next write, within about PROGRESS_INTERVAL seconds of a
    running engine's progress reports (one statement per write, none in between)."""
    last = [0.0]

    def report(update: dict):
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL or update.get("fraction") == 1.0:
            last[0] = now
            if not Request.objects.filter(pk=request_id, cancel_requested=False).update(
                    progress=update, heartbeat_at=timezone.now()):
                raise Cancelled("cancelled by the analyst")
    return report
