"""The recovery sweep: a running request whose worker went silent is finished by the
documented rule (data read: the reservation is committed; not read: released), exactly
once, with its audit record; a queued request never picked up is sent again."""

from datetime import timedelta

from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from governance.audit import verification
from governance.requests.execution import execute
from governance.models import AuditRecord, LedgerEntry, Request
from governance.requests.recovery import sweep
from tests.requests.test_requests_api import post

pytestmark = pytest.mark.django_db


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


def queued(client, eps=0.25, capture=None):
    with capture(execute=False):
        return post(client, {"epsilon": eps}).json()["id"]


def as_if_a_worker_died(rid, *, data_read: bool, silent_for=600):
    then = timezone.now() - timedelta(seconds=silent_for)
    Request.objects.filter(pk=rid).update(status="running", started_at=then, heartbeat_at=then, data_read=data_read,
                                          worker="cpu@dead")


@pytest.mark.parametrize("data_read,ledger_status,action", [(True, "committed", "commit"),
                                                            (False, "released", "release")])
def test_a_lost_request_is_finished_by_the_rule(api, analyst, clinic, django_capture_on_commit_callbacks,
                                                data_read, ledger_status, action):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(rid, data_read=data_read)
    assert sweep()["lost"] == [rid]
    req = Request.objects.get(pk=rid)
    assert req.status == "failed" and req.error["code"] == "request.worker_lost"
    assert LedgerEntry.objects.get().status == ledger_status
    rec = AuditRecord.objects.exclude(action__in=["settings", "grant"]).get(dataset=clinic)
    assert (rec.action, rec.outcome, rec.reason, rec.worker) == (action, "failed", "request.worker_lost", "cpu@dead")
    assert sweep()["lost"] == []  # nothing happens twice
    assert AuditRecord.objects.exclude(action__in=["settings", "grant"]).count() == 1 and verification.verify().ok


def test_a_request_with_a_recent_heartbeat_is_left_alone(api, analyst, clinic, django_capture_on_commit_callbacks):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(rid, data_read=True, silent_for=30)
    assert sweep(lost_after=120)["lost"] == []
    assert Request.objects.get(pk=rid).status == "running"


def test_a_worker_that_comes_back_after_the_sweep_changes_nothing(api, analyst, clinic,
                                                                   django_capture_on_commit_callbacks):
    client = api(analyst)
    rid = queued(client, capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(rid, data_read=True)
    sweep()
    # the task is delivered again (Redis redelivers unacknowledged messages): the claim refuses
    assert execute(rid, worker="cpu@back") == "failed"
    # and a run that was still going finds its request finished: its result is dropped
    from governance.requests.execution import _finish

    req = Request.objects.get(pk=rid)
    assert _finish(req, "succeeded", result={"rows": 1}, charge=True) == "failed"
    body = client.get(f"/api/requests/{rid}/").json()
    assert body["status"] == "failed" and body["result"] is None
    assert AuditRecord.objects.exclude(action__in=["settings", "grant"]).count() == 1 and verification.verify().ok


def test_a_queued_request_never_picked_up_is_sent_again(api, analyst, clinic, django_capture_on_commit_callbacks):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    assert sweep(requeue_after=900)["requeued"] == []
    Request.objects.filter(pk=rid).update(created_at=timezone.now() - timedelta(hours=1))
    assert sweep(requeue_after=900)["requeued"] == [rid]  # Celery is eager here: it ran
    assert Request.objects.get(pk=rid).status == "succeeded"
    assert LedgerEntry.objects.get().status == "committed"


def test_a_slow_backlog_is_sent_again_once_per_period(api, analyst, clinic, django_capture_on_commit_callbacks,
                                                      monkeypatch):
    from governance.requests import submission

    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(str(pk)))
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    Request.objects.filter(pk=rid).update(created_at=timezone.now() - timedelta(hours=7))
    for _ in range(3):
        sweep(requeue_after=3600)
    assert sent == [rid]  # not once per sweep
    assert sweep(requeue_after=3600, now=timezone.now() + timedelta(hours=2))["requeued"] == [rid]


def test_the_recover_command(api, analyst, clinic, django_capture_on_commit_callbacks, capsys):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(rid, data_read=False)
    call_command("recover")
    out = capsys.readouterr().out
    assert f"lost: 1 {rid}" in out and "requeued: 0" in out


def test_after_a_restore_requests_in_flight_at_the_backup_are_finished_charged_not_run_again(
        api, analyst, clinic, django_capture_on_commit_callbacks, capsys, settings):
    """A probe restored a backup taken while a synthesis was queued: its worker ran it again,
    the analyst held two different tables for one charge and the first table's files were
    overwritten; a request running at the backup would have been swept as lost with its
    files deleted. ``recover --restored`` (before the workers start) finishes both as
    ``request.restored``, charged in full, their files kept, each with its audit record."""
    from governance.models import LedgerEntry

    client = api(analyst)
    waiting = queued(client, capture=django_capture_on_commit_callbacks)
    taken = queued(client, eps=0.1, capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(taken, data_read=True)
    with django_capture_on_commit_callbacks(execute=True):
        done = post(client, {"epsilon": 0.1}).json()["id"]
    kept = settings.RESULTS_DIR / str(waiting)
    kept.mkdir(parents=True)
    (kept / "synthetic.csv").write_text("a\n1\n")  # released after the backup
    call_command("recover", "--restored")
    out = capsys.readouterr().out
    assert out.startswith("restored: 2 ") and waiting in out and taken in out and done not in out
    for rid in (waiting, taken):
        req = Request.objects.get(pk=rid)
        assert (req.status, req.error["code"]) == ("failed", "request.restored")
        assert LedgerEntry.objects.get(pk=req.ledger_entry_id).status == "committed"
        rec = AuditRecord.objects.get(request_id=rid)
        assert (rec.action, rec.outcome, rec.reason) == ("commit", "failed", "request.restored")
    assert (kept / "synthetic.csv").read_text() == "a\n1\n"
    assert Request.objects.get(pk=done).status == "succeeded"
    assert execute(waiting, worker="cpu@later") == "failed"  # a message still in the broker runs nothing
    assert verification.verify().ok
    call_command("recover", "--restored")
    assert capsys.readouterr().out.startswith("restored: 0")


def test_the_sweep_removes_a_copy_no_dataset_names_once_it_is_old(make_dataset, settings):
    """A registration killed between its copy and its row (SIGKILL skips the clean-up) left
    a copy of the rows in DATA_DIR forever (a hostile probe, 2026-11-27)."""
    import os
    import time

    from workers.tasks import sweep as sweep_task

    ds = make_dataset("kept")
    root = settings.DATA_DIR / "datasets"
    orphan, fresh = root / "gone-0123456789ab.csv", root / "inflight-0123456789ab.csv"
    orphan.write_text("a,b\n1,2\n")
    fresh.write_text("a,b\n1,2\n")
    old = time.time() - 7 * 3600
    os.utime(orphan, (old, old))
    os.utime(settings.DATA_DIR / ds.file, (old, old))
    assert sweep_task()["orphan_files"] == ["datasets/gone-0123456789ab.csv"]
    assert not orphan.exists() and fresh.exists() and (settings.DATA_DIR / ds.file).exists()


def test_the_sweep_removes_an_upload_spool_a_killed_web_process_left(make_dataset, settings):
    """An upload over FILE_UPLOAD_MAX_MEMORY_SIZE is spooled to a file while it is read; a
    web process killed meanwhile left it, the rows in it, in TMPDIR for good (a probe).
    Spools are kept beside the copies, and an old one is removed as an orphan copy is."""
    import os
    import time

    from workers.tasks import sweep as sweep_task

    make_dataset("kept")
    spools = Path(settings.FILE_UPLOAD_TEMP_DIR)
    assert spools.parent == settings.DATA_DIR
    left, reading = spools / "tmp2brkx_4m.upload.csv", spools / "tmpq81zz3pa.upload.csv"
    for f in (left, reading):
        f.write_text("pid,wage\nPID100000,354.94\n")
    old = time.time() - 7 * 3600
    os.utime(left, (old, old))
    assert sweep_task()["orphan_files"] == ["uploads/tmp2brkx_4m.upload.csv"]
    assert not left.exists() and reading.exists()


def test_large_uploads_are_spooled_under_data_dir_readable_by_the_owner_only(api, officer, settings, monkeypatch):
    """Django spools an upload past FILE_UPLOAD_MAX_MEMORY_SIZE to FILE_UPLOAD_TEMP_DIR: the
    service's, under DATA_DIR, not TMPDIR."""
    import io
    import os

    from django.core.files import temp  # (what Django's TemporaryUploadedFile calls)

    from governance import settings as configured

    assert Path(configured.FILE_UPLOAD_TEMP_DIR) == configured.DATA_DIR / "uploads"
    seen = []
    real = temp.NamedTemporaryFile

    def spy(*args, **kwargs):
        f = real(*args, **kwargs)
        seen.append((kwargs.get("dir"), os.stat(f.name).st_mode & 0o777))
        return f

    monkeypatch.setattr(temp, "NamedTemporaryFile", spy)
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = "age,income\n" + "".join(f"{20 + i % 50},{1000 + i}\n" for i in range(500))
    upload = io.BytesIO(body.encode())
    upload.name = "big.csv"
    r = api(officer).post("/api/datasets/", {"name": "big", "budget_epsilon": 1, "file": upload}, format="multipart")
    assert r.status_code == 201, r.json()
    assert seen and all(d == settings.FILE_UPLOAD_TEMP_DIR and mode == 0o600 for d, mode in seen), seen
    assert not list(Path(settings.FILE_UPLOAD_TEMP_DIR).iterdir())  # the spool of a finished upload is gone


def test_the_sweep_removes_a_scratch_directory_a_host_that_is_gone_left(settings):
    """A run killed on a host that never comes back (a replaced Kubernetes pod) left its
    scratch (a synthetic table charged but never released) for good: only a process of the
    same host name removed it (a probe). Past the hard time limit no run is still writing
    there; an empty one (a live process's, idle) and a recent one are kept."""
    import os
    import time

    from workers.tasks import sweep as sweep_task

    base = settings.RESULTS_DIR / ".scratch"
    dead, busy, idle = base / "podA-13077-140115299130240", base / "podB-88-1401", base / "podC-7-1"
    for d in (dead, busy, idle):
        d.mkdir(parents=True)
    for d in (dead, busy):
        (d / "synthetic.csv").write_text("wage,region\n354.94,south\n")
    old = time.time() - settings.CELERY_TASK_TIME_LIMIT - settings.REQUEST_LOST_AFTER_SECONDS - 60
    for p in (dead / "synthetic.csv", dead, idle):
        os.utime(p, (old, old))
    # a live process of this host (a solo pool, no time limit) keeps its own, however old
    import socket
    import threading

    mine = base / f"{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    mine.mkdir()
    (mine / "synthetic.csv").write_text("wage\n1\n")
    for p in (mine / "synthetic.csv", mine):
        os.utime(p, (old, old))
    assert sweep_task()["stale_scratch"] == ["podA-13077-140115299130240"]
    assert not dead.exists() and (busy / "synthetic.csv").exists() and idle.exists()
    assert (mine / "synthetic.csv").exists()


def test_a_sweeper_whose_clock_runs_ahead_keeps_copies_being_written(make_dataset, settings, monkeypatch):
    """A worker whose clock ran 7 hours ahead judged copies being written (and fresh ones
    whose row was not yet written) old, and unlinked them: the registrations failed with a
    500 (a probe). Their age is judged on the clock that stamps the files."""
    import time

    from governance.datasets import files

    root = settings.DATA_DIR / "datasets"
    root.mkdir(parents=True, exist_ok=True)
    part = root / "tmpabc123.part"
    part.write_text("a,b\n1,2\n")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7 * 3600)
    assert files.drop_orphan_files() == [] and part.exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".now-")]  # its marker is gone


def _run_as_a_worker_until_its_retry(rid, task_id):
    """``workers.run_request`` delivered to a worker (not eager), which asks Celery for a
    retry; the retry's copy runs at once here (Celery is eager in the tests)."""
    from celery.exceptions import Retry

    from workers.tasks import run_request

    run_request.push_request(id=task_id, args=[rid], kwargs={}, retries=0, is_eager=False, called_directly=False,
                             delivery_info={}, hostname="cpu@test")
    try:
        with pytest.raises(Retry):
            run_request.run(rid)
    finally:
        run_request.pop_request()


def test_a_task_that_finds_the_database_away_is_sent_again_not_dropped(api, analyst, clinic, monkeypatch,
                                                                        django_capture_on_commit_callbacks):
    """The claim raising OperationalError (PostgreSQL restarting) used to fail the task, which
    Celery then acknowledged: the message was gone, the request queued for the sweep's 6 h.
    The task now asks Celery for a retry, which sends it again (here: run at once, eagerly)."""
    from django.db import OperationalError

    from governance.requests import execution

    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    calls = []
    real = execution.execute

    def flaky(request_id, worker="", **_turn):
        calls.append(request_id)
        if len(calls) == 1:
            raise OperationalError("connection failed: the database system is starting up")
        return real(request_id, worker)

    monkeypatch.setattr(execution, "execute", flaky)
    _run_as_a_worker_until_its_retry(rid, "t1")
    assert calls == [rid, rid]  # the retry's copy ran it
    assert Request.objects.get(pk=rid).status == "succeeded"


def test_a_finished_run_whose_cancel_flag_cannot_be_read_is_released_not_failed(
        api, analyst, clinic, monkeypatch, django_capture_on_commit_callbacks):
    """A probe restarted PostgreSQL as runs finished: the late-cancel check's query raised,
    the error was taken for the engine's, and 4 finished results were dropped and charged
    in full as failures after the read."""
    from django.db import OperationalError

    from governance.requests import execution

    real = execution.Request.objects.filter

    def flaky(*args, **kwargs):
        if kwargs.get("cancel_requested"):
            raise OperationalError("the database system is shutting down")
        return real(*args, **kwargs)

    monkeypatch.setattr(execution.Request.objects, "filter", flaky)
    with django_capture_on_commit_callbacks(execute=True):
        r = api(analyst).post("/api/requests/", {"dataset": clinic.name, "engine": "aggregates", "kind": "count",
                                                 "params": {"epsilon": 0.2}}, format="json")
    assert r.status_code == 202, r.content
    req = Request.objects.get(pk=r.json()["id"])
    assert req.status == "succeeded" and req.result is not None, (req.status, req.error)


def test_an_outcome_waiting_for_the_database_keeps_its_request_alive(api, analyst, clinic, monkeypatch,
                                                                     django_capture_on_commit_callbacks):
    """A probe's nearly full database disk refused the outcome's commit but took the
    sweep's smaller one: the run's result was in hand and retried, yet nothing beat, so the
    sweep finished it as ``worker_lost``, charged in full, its files dropped. Each retry
    now beats; the sweep leaves the request to it."""
    from django.db import OperationalError

    from governance.requests import outcomes
    from governance.requests.releaser import RELEASER

    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    as_if_a_worker_died(rid, data_read=True)  # running, silent for 600 s: the sweep would take it
    scheduled = []
    monkeypatch.setattr(RELEASER, "at", lambda when, outcome, group=None: scheduled.append(outcome))
    outcome = outcomes.Outcome(Request.objects.get(pk=rid), Request.Status.SUCCEEDED, result={"value": 1})
    outcomes._again(outcome, OperationalError("database or disk is full"))
    assert scheduled == [outcome]
    beat = Request.objects.get(pk=rid).heartbeat_at
    assert timezone.now() - beat < timedelta(seconds=5)
    sweep()
    req = Request.objects.get(pk=rid)
    assert req.status == "running" and LedgerEntry.objects.get().status == "reserved"
    assert outcomes.write(outcome) == "succeeded"  # the retry, once there is room


def test_a_task_is_sent_again_for_as_long_as_the_database_is_away(monkeypatch):
    """retry(max_retries=None) meant Celery's default of 3: past about 7 s of a database
    away the message was dropped with a traceback (a probe's full disk). The 50th try is
    sent again like the first."""
    from celery.exceptions import Retry
    from django.db import OperationalError

    from governance.requests import execution
    from workers.tasks import run_request

    def away(request_id, worker="", **_turn):
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(execution, "execute", away)
    sent = []
    monkeypatch.setattr(run_request, "apply_async", lambda *a, **k: sent.append(k.get("countdown")))
    for retries in (3, 50):
        run_request.push_request(id="t1", args=["r"], kwargs={}, retries=retries, is_eager=False,
                                 called_directly=False, delivery_info={}, hostname="cpu@test")
        try:
            with pytest.raises(Retry):
                run_request.run("r")
        finally:
            run_request.pop_request()
    assert sent == [8, 30]


def _read_only_error():
    """What Django raises on a read-only PostgreSQL (SQLSTATE 25006), on any database."""
    from django.db import InternalError

    class ReadOnlySqlTransaction(Exception):
        sqlstate = "25006"

    e = InternalError("cannot execute UPDATE in a read-only transaction")
    e.__cause__ = ReadOnlySqlTransaction()
    return e


def test_a_read_only_postgresql_is_a_503_and_a_task_sent_again(api, officer, monkeypatch):
    """A standby after a failover (or default_transaction_read_only): writes raised
    InternalError, a 500 page, and a worker's claim would have dropped its task (a probe)."""
    from celery.exceptions import Retry
    from django.contrib.auth import get_user_model

    from governance.requests import execution
    from workers.tasks import run_request

    def read_only(*args, **kwargs):
        raise _read_only_error()

    with monkeypatch.context() as m:
        m.setattr(get_user_model().objects, "create_user", read_only)
        r = api(officer).post("/api/analysts/", {"username": "zed"}, format="json")
    assert r.status_code == 503 and r.json()["code"] == "storage.unwritable", r.content[:300]
    monkeypatch.setattr(execution, "execute", read_only)
    monkeypatch.setattr(run_request, "apply_async", lambda *a, **k: None)
    run_request.push_request(id="t1", args=["r"], kwargs={}, retries=0, is_eager=False, called_directly=False,
                             delivery_info={}, hostname="cpu@test")
    try:
        with pytest.raises(Retry):
            run_request.run("r")
    finally:
        run_request.pop_request()


def test_a_queued_request_covered_by_another_s_turn_is_not_sent_again(api, analyst, clinic, monkeypatch,
                                                                      django_capture_on_commit_callbacks):
    """Any message of a queue runs the fairest request queued on it (governance.requests.turns):
    a request whose own message ran another's is covered by that other's message, still in the
    broker. Only as many requests as the queue lacks turns are sent again, not every one whose
    own id the broker does not hold (a backlog would be sent again every period)."""
    from governance.requests import recovery, submission

    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(str(pk)))
    ran = queued(api(analyst), 0.1, capture=django_capture_on_commit_callbacks)
    Request.objects.filter(pk=ran).update(status="succeeded")  # run in another's turn; its message waits
    a, b, c = (queued(api(analyst), 0.2 + i / 100, capture=django_capture_on_commit_callbacks) for i in range(3))
    Request.objects.filter(pk__in=[a, b, c]).update(created_at=timezone.now() - timedelta(hours=1))
    monkeypatch.setattr(recovery, "_pending", lambda queues: {ran, b})  # two turns for three queued
    assert len(sweep(requeue_after=900)["requeued"]) == 1 and len(sent) == 1 and sent[0] in (a, c)
    sent.clear()
    Request.objects.filter(pk__in=[a, b, c]).update(progress={})  # a new period
    monkeypatch.setattr(recovery, "_pending", lambda queues: {ran, b, a})  # three turns for three
    assert sweep(requeue_after=900)["requeued"] == [] and sent == []


def test_a_run_whose_database_went_away_after_the_claim_is_taken_back_by_its_retried_task(
        api, analyst, clinic, monkeypatch, settings, django_capture_on_commit_callbacks):
    """A probe restarted PostgreSQL just after a worker claimed a request: the run could write
    neither its failure nor anything else, its task was sent again, and the copy found the
    request claimed (not queued) and did nothing; the sweep failed it two minutes later as a
    lost worker, though the worker was alive. The retried task now takes its own claimed,
    unread request back once its heartbeat has stood still, and runs it."""
    from django.db import OperationalError

    from governance.requests import execution, outcomes

    settings.REQUEST_HEARTBEAT_SECONDS = 0  # the copy runs at once here (eager): the claim's heartbeat is old by then
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    away = {"refusal": 1, "write": 1}
    real_refusal, real_write = execution.access_refusal, outcomes.write

    def refusal(*a, **k):
        if away["refusal"]:
            away["refusal"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real_refusal(*a, **k)

    def write(out):
        if away["write"]:
            away["write"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real_write(out)

    monkeypatch.setattr(execution, "access_refusal", refusal)
    monkeypatch.setattr(outcomes, "write", write)
    _run_as_a_worker_until_its_retry(rid, "t7")
    req = Request.objects.get(pk=rid)
    assert req.status == "succeeded" and req.run_task == "t7", (req.status, req.error)
    assert LedgerEntry.objects.get().status == "committed" and verification.verify().ok


def test_a_read_mark_the_database_cannot_take_is_no_failure_of_the_table(
        api, analyst, clinic, monkeypatch, settings, caplog, django_capture_on_commit_callbacks):
    """A probe filled the database's disk: the read mark's UPDATE raised, and the run took it
    for its table's failure (logged "could not read its table"; had the database answered
    the refund's write, the analyst would have read that the table was missing). Nothing was
    read: the task is sent again, and its copy takes the request back and runs it."""
    from django.db import OperationalError

    from governance.audit import verification
    from governance.requests import execution

    settings.REQUEST_HEARTBEAT_SECONDS = 0  # the copy runs at once here (eager): the claim's heartbeat is old by then
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    full = [1]
    real = execution._mark_data_read

    def mark(pk):
        if full:
            full.pop()
            raise OperationalError("database or disk is full")
        return real(pk)

    monkeypatch.setattr(execution, "_mark_data_read", mark)
    _run_as_a_worker_until_its_retry(rid, "t9")
    req = Request.objects.get(pk=rid)
    assert req.status == "succeeded" and req.officer_report is None, (req.status, req.error, req.officer_report)
    assert "could not read its table" not in caplog.text
    assert LedgerEntry.objects.get().status == "committed" and verification.verify().ok


def test_a_retried_task_leaves_a_live_or_read_run_of_its_own_alone(api, analyst, clinic,
                                                                    django_capture_on_commit_callbacks):
    from governance.requests.execution import StillRunning, claim, reclaim

    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    assert claim(rid, "cpu@test", "t8") is not None
    with pytest.raises(StillRunning):  # its heartbeat is fresh: the run may be alive
        reclaim("t8", "cpu@test")
    assert reclaim("t0", "cpu@test") is None  # another task's claim
    Request.objects.filter(pk=rid).update(heartbeat_at=timezone.now() - timedelta(seconds=600), data_read=True)
    assert reclaim("t8", "cpu@test") is None  # rows were read: the sweep finishes it, charged
    assert execute(rid, "cpu@test", "t8", retried=True) == "running"
    Request.objects.filter(pk=rid).update(data_read=False)
    assert execute(rid, "cpu@test", "t8", retried=True) == "succeeded"


def test_the_sweeps_unsent_mark_is_not_shown_to_the_analyst(api, analyst, clinic, django_capture_on_commit_callbacks):
    """A probe stopped Redis and POSTed: the request's progress showed the sweep's
    ``unsent_at`` (the server's clock; the news that the broker was down)."""
    from governance.core.dispatch import mark_unsent

    client = api(analyst)
    rid = queued(client, capture=django_capture_on_commit_callbacks)
    assert mark_unsent(rid) and "unsent_at" in Request.objects.get(pk=rid).progress
    shown = [client.get(f"/api/requests/{rid}/").json(), client.get("/api/requests/").json()["results"][0]]
    assert [s["progress"] for s in shown] == [{"phase": "queued"}] * 2, shown
