"""The embedded broker (``filesystem://``, workers/broker.py; issue 22): a message is never
read half-written, a file that cannot be parsed never stops the worker, a dead worker is
visible (``manage.py workers``, the officer's dashboard), and a queued request whose
message is gone is sent again after a minute, not six hours.

kombu's own filesystem transport failed these: it created a message file under its final
name and wrote it afterwards (a polling reader read ``b""`` or half a document), and a
file that did not parse raised ``JSONDecodeError`` out of ``drain_events``, which Celery
treats as unrecoverable: the worker exited (code 0) and later requests stayed queued.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from queue import Empty

import pytest
from django.core.management import call_command
from django.utils import timezone
from kombu import Connection, Consumer, Producer, Queue

import workers  # noqa: F401 - registers workers.broker for filesystem:// (as every process of the service does)
from governance.models import Request

from .conftest import ROOT, database_url, wait_for

COUNT = {"engine": "aggregates", "kind": "count"}


def options(folder: Path) -> dict:
    return {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder / "control"),
            "processed_folder": str(folder / "processed"), "store_processed": False, "polling_interval": 0.01}


def connection(folder: Path) -> Connection:
    for d in ("control", "processed"):
        (folder / d).mkdir(parents=True, exist_ok=True)
    return Connection("filesystem://localhost/", transport_options=options(folder))


def _produce(folder: str, producer: int, n: int, pad: int):
    import workers  # noqa: F401 - a producer process of the service has imported the app

    with connection(Path(folder)) as conn:
        p = Producer(conn.default_channel)
        for k in range(n):
            p.publish({"producer": producer, "k": k, "pad": "x" * pad}, routing_key="cpu", exchange="",
                      declare=[Queue("cpu", routing_key="cpu")], serializer="json")


def _body(payload: dict):
    import base64

    raw = payload["body"]
    if payload.get("properties", {}).get("body_encoding") == "base64":
        raw = base64.b64decode(raw)
    return json.loads(raw)


def test_the_embedded_broker_is_the_atomic_transport():
    from workers.broker import Transport

    with Connection("filesystem://localhost/") as conn:
        assert isinstance(conn.transport, Transport)


def test_messages_from_concurrent_producer_processes_are_read_whole(tmp_path):
    """Four producer processes publish while the reader polls as fast as it can: every
    message arrives whole, once. (kombu's transport: a few in 800 read half-written, each an
    exception that stops a worker.)"""
    procs, n = 4, 150
    ctx = mp.get_context("fork")
    with connection(tmp_path) as conn:
        channel = conn.default_channel
        ps = [ctx.Process(target=_produce, args=(str(tmp_path), i, n, 64 * 1024)) for i in range(procs)]
        for p in ps:
            p.start()
        got, errors = [], []
        deadline = time.monotonic() + 90
        while len(got) < procs * n and time.monotonic() < deadline:
            try:
                payload = channel._get("cpu")
            except Empty:
                continue
            except Exception as exc:  # noqa: BLE001 - what stopped the worker
                errors.append(repr(exc))
                continue
            body = _body(payload)
            got.append((body["producer"], body["k"]))
        for p in ps:
            p.join(30)
    assert errors == []
    assert sorted(got) == [(i, k) for i in range(procs) for k in range(n)]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".msg") or ".writing" in f]


def _bind_and_publish(folder: str, i: int, start: float, errors):
    import workers  # noqa: F401
    from kombu import Exchange

    with connection(Path(folder)) as conn:
        channel = conn.default_channel
        while time.time() < start:
            pass
        try:
            exchange = Exchange("cpu", type="direct")
            Queue(f"q{i}", exchange, routing_key="cpu")(channel).declare()
            Producer(channel).publish({"i": i}, exchange=exchange, routing_key="cpu")
        except Exception as exc:  # noqa: BLE001
            errors.put(repr(exc))


def test_processes_binding_a_new_exchange_at_once_never_read_an_empty_table(tmp_path):
    """A fresh var/broker: web processes and the worker declare the same exchange at once.
    kombu created the table with ``open("wb")`` before locking it; a second process
    truncated it and a third read ``b""``: ``JSONDecodeError('Expecting value...')``, the
    error of the issue (5 in 30 rounds of 4 processes here)."""
    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    for r in range(20):
        folder = tmp_path / f"r{r}"
        start = time.time() + 0.3
        ps = [ctx.Process(target=_bind_and_publish, args=(str(folder), i, start, errors)) for i in range(4)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(30)
        table = json.loads((folder / "control" / "cpu.exchange").read_text())
        assert sorted(q[2] for q in table) == [f"q{i}" for i in range(4)]
    seen = []
    while not errors.empty():
        seen.append(errors.get())
    assert seen == []


def _drain_until(conn, received: list, seconds: float = 10.0):
    """Reads the connection until a callback has put something in ``received`` (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while not received and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=1)
        except TimeoutError:
            pass


def test_an_unparsable_message_file_is_set_aside_and_the_next_one_is_delivered(tmp_path, caplog):
    with connection(tmp_path) as conn:
        Producer(conn.default_channel).publish({"hello": "world"}, routing_key="cpu", exchange="",
                                               declare=[Queue("cpu", routing_key="cpu")], serializer="json")
        good = next(f for f in os.listdir(tmp_path) if f.endswith(".msg"))
        whole = (tmp_path / good).read_bytes()
        # sorted before the good message: read first
        (tmp_path / "0_a_empty.cpu.msg").write_bytes(b"")  # created, not yet written (kombu's window)
        (tmp_path / "0_b_half.cpu.msg").write_bytes(whole[: len(whole) // 2])  # half-written
        (tmp_path / "0_c_garbage.cpu.msg").write_bytes(b"\x00\xffnot json")
        (tmp_path / "0_d_list.cpu.msg").write_bytes(b"[1, 2]")
        received = []
        with Consumer(conn, [Queue("cpu", routing_key="cpu")], accept=["json"],
                      callbacks=[lambda body, message: (received.append(body), message.ack())]):
            with caplog.at_level(logging.ERROR, logger="workers.broker"):
                _drain_until(conn, received)
    assert received == [{"hello": "world"}]
    assert sorted(os.listdir(tmp_path / "bad")) == ["0_a_empty.cpu.msg", "0_b_half.cpu.msg", "0_c_garbage.cpu.msg",
                                                    "0_d_list.cpu.msg"]
    assert sum("could not be read" in r.getMessage() for r in caplog.records) == 4
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".msg")]


def test_a_broker_folder_removed_while_consuming_is_made_again_and_delivery_goes_on(tmp_path, caplog):
    """A probe removed ``var/broker`` under a running worker: kombu's ``listdir`` raised
    FileNotFoundError out of ``drain_events`` and Celery stopped the worker with exit code 0
    (no ``on-failure`` restart). The folder is made again, empty, with an error in the log;
    counting, purging, sending and receiving go on."""
    import shutil

    folder = tmp_path / "broker"
    with connection(folder) as conn:
        q = Queue("cpu", routing_key="cpu")
        producer = Producer(conn.default_channel)
        received = []
        with Consumer(conn, [q], accept=["json"], callbacks=[lambda body, message: (received.append(body),
                                                                                       message.ack())]):
            shutil.rmtree(folder)
            with caplog.at_level(logging.ERROR, logger="workers.broker"):
                with pytest.raises(TimeoutError):  # nothing to read (was FileNotFoundError)
                    conn.drain_events(timeout=0.5)
            assert folder.is_dir() and "was removed; made again" in caplog.text
            assert q(conn.default_channel).queue_declare(passive=True).message_count == 0
            shutil.rmtree(folder)
            assert conn.default_channel._size("cpu") == 0 and conn.default_channel._purge("cpu") == 0
            shutil.rmtree(folder)
            producer.publish({"after": 1}, routing_key="cpu", exchange="", serializer="json")
            _drain_until(conn, received)
    assert received == [{"after": 1}]


def test_a_message_is_not_visible_before_it_is_whole(tmp_path, monkeypatch):
    """The write goes to a name the reader does not match; the rename makes it visible."""
    from workers import broker

    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append(sorted(os.listdir(tmp_path)))
        return real_replace(src, dst)

    monkeypatch.setattr(broker.os, "replace", replace)
    with connection(tmp_path) as conn:
        channel = conn.default_channel
        channel._put("cpu", {"body": "x"})
        assert len(seen) == 1 and [f for f in seen[0] if f.endswith(".writing")]
        with pytest.raises(Empty):  # what a reader polling in between would see
            monkeypatch.setattr(broker.os, "listdir", lambda _p: seen[0])
            channel._get("cpu")
        monkeypatch.undo()
        assert channel._get("cpu") == {"body": "x"}


# --------------------------------------------------------------------------- the recovery sweep


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    return ds


@pytest.fixture
def embedded(settings, tmp_path):
    """This process on an embedded broker in ``tmp_path/var/broker`` (whatever REDIS_URL the
    test run has), heartbeats in ``tmp_path/var/workers``."""
    var = tmp_path / "var"
    settings.VAR_DIR = var
    settings.BROKER_DIR = var / "broker"
    settings.EMBEDDED_BROKER = True
    settings.REDIS_URL = None
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = options(var / "broker")
    for d in ("control", "processed"):
        (var / "broker" / d).mkdir(parents=True, exist_ok=True)
    return var


def _queued(client, n, *, eps=0.1):
    from governance.requests import submission

    real = submission.enqueue
    submission.enqueue = lambda pk, queue: None  # the message is not sent (lost)
    try:
        return [client.post("/api/requests/", {**COUNT, "dataset": "clinic", "params": {"epsilon": eps + k * 1e-6}},
                            format="json").json()["id"] for k in range(n)]
    finally:
        submission.enqueue = real


def _publish(var: Path, rid):
    """The task of ``rid`` as a message in ``var/broker`` (sent, even when tasks run eagerly)."""
    import warnings

    from celery.exceptions import AlwaysEagerIgnored

    from workers import app

    with connection(var / "broker") as conn, warnings.catch_warnings():
        warnings.simplefilter("ignore", AlwaysEagerIgnored)  # sending is the point
        app.send_task("workers.run_request", args=[str(rid)], queue="cpu", connection=conn)


@pytest.mark.django_db
def test_a_queued_request_whose_message_is_gone_is_sent_again_after_a_minute(api, analyst, clinic, embedded,
                                                                            settings, monkeypatch):
    from governance.requests import submission
    from governance.requests.recovery import sweep

    settings.REQUEST_REQUEUE_AFTER_SECONDS = 60
    client = api(analyst)
    gone, waiting, young = _queued(client, 3)
    _publish(embedded, waiting)  # its message is a file in the folder, waiting its turn
    assert Request.objects.get(pk=waiting).status == "queued"
    from workers.broker import pending_request_ids

    assert pending_request_ids(embedded / "broker") == {waiting}
    minute_ago = timezone.now() - timedelta(seconds=61)
    Request.objects.filter(pk__in=[gone, waiting]).update(created_at=minute_ago)
    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(str(pk)))
    assert sweep()["requeued"] == [gone]
    assert sent == [gone]
    # the copy is sent once per period; the young one waits its minute
    assert sweep()["requeued"] == []
    assert sorted(sweep(now=timezone.now() + timedelta(seconds=65))["requeued"]) == sorted([gone, young])


# --------------------------------------------------------------------------- liveness


@pytest.mark.django_db
def test_manage_workers_says_no_worker_is_alive_and_what_waits(api, analyst, clinic, embedded, settings):
    from governance.core import liveness

    rid = _queued(api(analyst), 1)[0]
    out = _workers_command()
    assert out.code == 1
    assert "workers alive: 0" in out.text and "NO WORKER IS ALIVE" in out.text
    assert "queue cpu: 1 queued" in out.text and rid in out.text
    liveness.write({"node": "celery@box", "pid": 1, "queues": ["cpu", "gpu"], "at": time.time()})
    out = _workers_command()
    assert out.code == 0, out.text
    assert "worker celery@box" in out.text and ": alive" in out.text and "served by a live worker" in out.text
    liveness.write({"node": "celery@box", "pid": 1, "queues": ["cpu"], "at": time.time() - 3600})
    out = _workers_command()
    assert out.code == 1 and "DEAD (no heartbeat)" in out.text and rid in out.text


@pytest.mark.django_db
def test_manage_workers_says_when_the_recovery_sweep_last_ran_and_when_it_is_late(api, analyst, clinic, embedded,
                                                                                   client, officer):
    """A probe stopped the embedded beat: two requests whose messages were gone stayed queued
    while ``manage.py workers`` said a live worker served them (exit 0). It now says when the
    sweep last ran, and exits 1 when it has not for 5 minutes while a request waited longer;
    the officer's dashboard warns then too."""
    from governance.core import liveness
    from workers import app
    from workers.tasks import sweep

    def dashboard_warns():
        eager, app.conf.task_always_eager = app.conf.task_always_eager, False
        try:
            return 'id="sweep-late"' in client.get("/admin/").content.decode()
        finally:
            app.conf.task_always_eager = eager

    client.force_login(officer)

    liveness.write({"node": "celery@box", "pid": 1, "queues": ["cpu", "gpu"], "at": time.time()})
    rid = _queued(api(analyst), 1)[0]
    out = _workers_command()
    assert out.code == 0 and "recovery sweep: no run recorded" in out.text and "LATE" not in out.text, out.text
    assert not dashboard_warns()
    Request.objects.filter(pk=rid).update(created_at=timezone.now() - timedelta(minutes=6))
    out = _workers_command()
    assert out.code == 1 and "LATE: requests have waited 6 min" in out.text, out.text
    assert dashboard_warns()
    sweep()  # (re-sends it: a message file; the stamp is the point here)
    out = _workers_command()
    assert out.code == 0 and "recovery sweep: last ran 0 s ago" in out.text, out.text
    assert not dashboard_warns()


@pytest.mark.django_db
def test_manage_workers_strict_and_unreadable_heartbeats_exit_1(embedded, monkeypatch):
    """Nothing queued and every worker dead exited 0 (a health check reading the exit code
    missed a dead fleet until requests piled up): --strict says so. Heartbeats that cannot
    be read (Redis down) are no all-clear either."""
    from governance.core import liveness

    assert _workers_command().code == 0  # nothing waits: the default rule
    out = _workers_command("--strict")
    assert out.code == 1 and "--strict: no live worker consumes queue(s) cpu, gpu" in out.text, out.text
    liveness.write({"node": "celery@box", "pid": 1, "queues": ["cpu", "gpu"], "at": time.time()})
    assert _workers_command("--strict").code == 0
    monkeypatch.setattr(liveness, "records", lambda: (_ for _ in ()).throw(ConnectionError("redis is down")))
    out = _workers_command()
    assert out.code == 1 and "cannot read the heartbeats (ConnectionError: redis is down)" in out.text


@pytest.mark.django_db
def test_manage_workers_names_a_running_request_whose_worker_went_silent(api, analyst, clinic, embedded):
    """A request left ``running`` by a worker that died: ``manage.py workers`` named no
    problem and exited 0 until the recovery sweep finished it."""
    from governance.core import liveness

    rid = _queued(api(analyst), 1)[0]
    liveness.write({"node": "celery@gone", "pid": 1, "queues": ["cpu"], "at": time.time()})
    Request.objects.filter(pk=rid).update(status=Request.Status.RUNNING, worker="celery@gone",
                                          started_at=timezone.now(), heartbeat_at=timezone.now())
    out = _workers_command()
    assert out.code == 0, out.text
    assert "running requests: 1" in out.text and "SILENT" not in out.text
    liveness.write({"node": "celery@gone", "pid": 1, "queues": ["cpu"], "at": time.time() - 600})
    Request.objects.filter(pk=rid).update(heartbeat_at=timezone.now() - timedelta(seconds=300))
    out = _workers_command()
    assert out.code == 1, out.text
    assert f"request {rid} on celery@gone (DEAD): SILENT, last request heartbeat 5 min ago" in out.text


class _Out:
    def __init__(self, code, text):
        self.code, self.text = code, text


def _workers_command(*args) -> _Out:
    import io

    buf = io.StringIO()
    try:
        call_command("workers", *args, stdout=buf)
        code = 0
    except SystemExit as e:
        code = e.code
    return _Out(code, buf.getvalue())


@pytest.mark.django_db
def test_the_dashboard_warns_when_no_worker_is_alive(client, officer, embedded):
    from governance.core import liveness
    from workers import app

    client.force_login(officer)
    assert 'id="no-worker"' not in client.get("/admin/").content.decode()  # tasks in-process: nothing to warn of
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False
    try:
        page = client.get("/admin/").content.decode()
        assert 'id="no-worker"' in page and "No Celery worker is alive" in page
        liveness.write({"node": "celery@box", "pid": 1, "queues": ["cpu"], "at": time.time()})
        assert 'id="no-worker"' not in client.get("/admin/").content.decode()
    finally:
        app.conf.task_always_eager = eager


# --------------------------------------------------------------------------- a real worker


@pytest.fixture
def embedded_worker(embedded, settings, tmp_path, monkeypatch, request):
    """``manage.py worker`` on the embedded broker in ``tmp_path/var/broker`` (no Redis),
    against the test database; this process's sends go to the same folder. Its pool:
    prefork, or the fixture's parameter (``indirect``)."""
    from governance.requests import submission
    from workers import app

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE", "CELERY_BROKER_URL")}
    env.update({"DATABASE_URL": database_url(), "DATA_DIR": str(settings.DATA_DIR),
                "RESULTS_DIR": str(settings.RESULTS_DIR),
                "DATASET_IMPORT_DIRS": ",".join(map(str, settings.DATASET_IMPORT_DIRS)),
                "GOVERNANCE_VAR_DIR": str(embedded), "CELERY_TASK_ALWAYS_EAGER": "false",
                "RELEASE_QUANTUM_MS": "0", "WORKER_HEARTBEAT_SECONDS": "1", "WORKER_ALIVE_SECONDS": "3",
                "EMBEDDED_BEAT_STOPPED_SECONDS": "3"})
    settings.WORKER_ALIVE_SECONDS = 3
    logfile = tmp_path / "worker.log"
    log = open(logfile, "w")
    pool = getattr(request, "param", "prefork")
    proc = subprocess.Popen([sys.executable, "manage.py", "worker", "-Q", "cpu,gpu", "-c", "1", "--pool", pool,
                             "--loglevel", "INFO"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: _publish(embedded, pk))
    proc.env, proc.logfile = env, logfile
    try:
        yield proc
    finally:
        app.conf.task_always_eager = eager
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        print(logfile.read_text()[-3000:])


_PRODUCER = """
import sys, django
django.setup()
from governance.core.dispatch import send
for rid in sys.argv[1:]:
    send(rid, "cpu")
"""


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_on_the_embedded_broker_survives_bad_files_and_concurrent_producers(
        embedded_worker, api, analyst, clinic, embedded):
    """Three producer processes send 60 requests' tasks through the service's own sending
    path while the worker runs them; a garbage and an empty message file lie in the folder
    first. Every request succeeds, the worker is still running, the files are set aside."""
    broker = embedded / "broker"
    (broker / "0_garbage.cpu.msg").write_bytes(b"{not json")
    (broker / "0_a_empty.cpu.msg").write_bytes(b"")
    ids = _queued(api(analyst), 60, eps=0.01)
    env = embedded_worker.env
    producers = [subprocess.Popen([sys.executable, "-c", _PRODUCER, *ids[i::3]], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    for p in producers:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-2000:]

    def done():
        return Request.objects.filter(pk__in=ids, status="succeeded").count() == len(ids) or (
            embedded_worker.poll() is not None and pytest.fail(f"the worker exited {embedded_worker.returncode}"))
    wait_for(done, timeout=120, interval=0.3)
    assert embedded_worker.poll() is None
    log = embedded_worker.logfile.read_text()
    assert "Unrecoverable error" not in log and log.count("could not be read") == 2
    assert sorted(os.listdir(broker / "bad")) == ["0_a_empty.cpu.msg", "0_garbage.cpu.msg"]
    # it is visible as alive; stopped cleanly, it is not, and what waits is listed
    out = wait_for(lambda: (o := _workers_command()).code == 0 and ": alive" in o.text and o, timeout=20)
    assert "queues cpu,gpu,sweep" in out.text and "2 unreadable file(s) set aside" in out.text
    embedded_worker.terminate()
    embedded_worker.wait(30)
    left = _queued(api(analyst), 1, eps=0.02)[0]
    out = _workers_command()
    assert out.code == 1 and "workers alive: 0" in out.text and left in out.text


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_is_seen_dead_and_its_taken_request_is_sent_again(embedded_worker, api, analyst, clinic,
                                                                          embedded, settings, monkeypatch):
    """``kill -9`` of the worker: its heartbeat goes stale (``manage.py workers`` says DEAD);
    a request queued with no message left is re-sent by the next sweep after a minute, and a
    new worker runs it."""
    from governance.requests.recovery import sweep

    import psutil

    wait_for(lambda: ": alive" in _workers_command().text, timeout=60, interval=0.3)
    children = psutil.Process(embedded_worker.pid).children()
    assert children  # its embedded beat, its pool process
    embedded_worker.kill()
    embedded_worker.wait(10)
    # its children go with it (the beat was left running alone, sending sweeps for good)
    wait_for(lambda: not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE],
             timeout=20, interval=0.3)
    rid = _queued(api(analyst), 1, eps=0.03)[0]  # taken by the worker that died: no file left
    out = wait_for(lambda: (o := _workers_command()).code == 1 and "DEAD" in o.text and o, timeout=20)
    assert rid in out.text
    settings.REQUEST_REQUEUE_AFTER_SECONDS = 60
    Request.objects.filter(pk=rid).update(created_at=timezone.now() - timedelta(seconds=61))
    assert sweep()["requeued"] == [rid]  # its message is now a file in the folder
    assert sweep(now=timezone.now() + timedelta(seconds=120))["requeued"] == []  # waiting its turn: no copy
    again = subprocess.Popen([sys.executable, "manage.py", "worker", "-Q", "cpu", "-c", "1", "--pool", "solo"],
                             cwd=ROOT, env=embedded_worker.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: Request.objects.get(pk=rid).status == "succeeded", timeout=90, interval=0.3)
    finally:
        again.terminate()
        again.wait(20)


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_redis_writes_its_heartbeat_there(real_worker, redis_server, settings):
    """With REDIS_URL the heartbeats live in Redis (one hash), shared by web and workers."""
    from governance.core import liveness

    settings.REDIS_URL = redis_server
    pid = real_worker.process.pid  # (other test runs may share this Redis database)
    mine = wait_for(lambda: [r for r in liveness.alive() if r["pid"] == pid], timeout=90, interval=0.3)
    assert mine[0]["queues"] == ["cpu", "gpu", "sweep"]  # the recovery sweep's queue, always
    real_worker.process.terminate()
    real_worker.process.wait(30)
    assert [r for r in liveness.records() if r["pid"] == pid] == []  # a clean stop removes its record


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("embedded_worker", ["solo"], indirect=True)
def test_an_embedded_beat_that_dies_is_started_again(embedded_worker):
    """Celery starts the embedded beat (the recovery sweep's clock) as a child and never
    looks at it again: killed or stopped, the sweep stopped for good and nothing said so. The
    worker's watch starts a new one within seconds and logs it (solo pool: the beat is the
    only child)."""
    import signal

    import psutil

    from .conftest import wait_for

    worker = psutil.Process(embedded_worker.pid)

    def beat():
        children = worker.children()
        return children[0] if len(children) == 1 else None

    first = wait_for(beat, timeout=60)
    os.kill(first.pid, signal.SIGKILL)
    second = wait_for(lambda: (b := beat()) is not None and b.pid != first.pid and b, timeout=30)
    assert second.is_running()
    wait_for(lambda: "the embedded beat process died" in embedded_worker.logfile.read_text(), timeout=10)
    # stopped (SIGSTOP) past EMBEDDED_BEAT_STOPPED_SECONDS (3 here): killed and replaced (a
    # probe's stopped beat held requests queued for good while all looked well)
    os.kill(second.pid, signal.SIGSTOP)
    third = wait_for(lambda: (b := beat()) is not None and b.pid != second.pid and b, timeout=30)
    assert third.status() != psutil.STATUS_STOPPED and not second.is_running()
    wait_for(lambda: "was stopped (SIGSTOP) for over 3 s" in embedded_worker.logfile.read_text(), timeout=10)


def _uses_database(proc) -> bool:
    from django.db import connection as db

    name = str(db.settings_dict["NAME"])
    if db.vendor == "sqlite":
        return any(f.path.startswith(name) for f in proc.open_files())
    return any(c.raddr and c.raddr.port == int(db.settings_dict["PORT"]) for c in proc.net_connections("inet"))


def _idle_pool_process(embedded_worker, client, embedded):
    """(the worker's process, [its one pool process]) once a first request has run and the
    pool process waits on the task pipe again."""
    import psutil

    first = _queued(client, 1, eps=0.01)[0]
    _publish(embedded, first)
    wait_for(lambda: Request.objects.get(pk=first).status == "succeeded", timeout=90, interval=0.3)
    worker = psutil.Process(embedded_worker.pid)
    pool = [p for p in worker.children() if _uses_database(p)]
    assert len(pool) == 1, worker.children()
    time.sleep(0.5)  # idle again: waiting on the task pipe
    return worker, pool


@pytest.mark.django_db(transaction=True)
def test_an_idle_pool_process_killed_does_not_wedge_the_worker(embedded_worker, api, analyst, clinic, embedded):
    """Prefork on the embedded broker is billiard's shared-pipe pool: its idle process waits
    for a task holding the pipe's read lock. ``kill -9`` of that process left the lock held
    for good: its replacement blocked on it, and every later request waited forever while
    the worker looked alive (3 of 4 trials). With workers.pool's locks the kernel frees it."""
    import signal

    client = api(analyst)
    worker, pool = _idle_pool_process(embedded_worker, client, embedded)
    os.kill(pool[0].pid, signal.SIGKILL)
    wait_for(lambda: [p for p in worker.children() if p.pid != pool[0].pid and p.status() != "zombie"], timeout=30)
    later = _queued(client, 2, eps=0.02)
    for rid in later:
        _publish(embedded, rid)
    wait_for(lambda: Request.objects.filter(pk__in=later, status="succeeded").count() == 2, timeout=60, interval=0.3)
    assert embedded_worker.poll() is None


@pytest.mark.django_db(transaction=True)
def test_a_stopped_pool_process_is_killed_and_replaced(embedded_worker, api, analyst, clinic, embedded):
    """A probe stopped (SIGSTOP) the idle pool process of a one-process worker: every later
    request stayed queued for good, and the recovery sweep (a task on the same pool) never
    ran, while ``manage.py workers`` called the worker alive. The worker's watch kills a
    process stopped past EMBEDDED_BEAT_STOPPED_SECONDS (3 here); the pool starts another."""
    import signal

    import psutil

    client = api(analyst)
    _, pool = _idle_pool_process(embedded_worker, client, embedded)
    os.kill(pool[0].pid, signal.SIGSTOP)
    later = _queued(client, 2, eps=0.02)
    for rid in later:
        _publish(embedded, rid)
    wait_for(lambda: Request.objects.filter(pk__in=later, status="succeeded").count() == 2, timeout=90, interval=0.3)
    assert not pool[0].is_running() or pool[0].status() == psutil.STATUS_ZOMBIE
    assert f"worker process {pool[0].pid} was stopped (SIGSTOP)" in embedded_worker.logfile.read_text()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("embedded_worker", ["solo"], indirect=True)
def test_the_sweep_is_not_queued_behind_the_requests(embedded_worker, api, analyst, clinic, embedded, settings):
    """A probe's lost request stayed "running", its reservation held, 8 minutes past its
    deadline: the sweep was a message on the cpu queue behind 500 requests. It has a queue
    of its own, which `manage.py worker` consumes beside the ones it is given: taken in
    turn with them, it runs long before a backlog drains."""
    import re
    import warnings

    from celery.exceptions import AlwaysEagerIgnored

    from workers import app

    ids = _queued(api(analyst), 24, eps=0.001)
    with connection(embedded / "broker") as conn, warnings.catch_warnings():
        warnings.simplefilter("ignore", AlwaysEagerIgnored)
        for rid in ids:
            app.send_task("workers.run_request", args=[str(rid)], queue="cpu", connection=conn)
        app.send_task("workers.sweep", connection=conn,  # where beat sends it
                      queue=settings.CELERY_BEAT_SCHEDULE["sweep-lost-requests"]["options"]["queue"])
    log = wait_for(lambda: (t := embedded_worker.logfile.read_text()).count("] received") >= len(ids) + 1 and t,
                   timeout=180, interval=0.5)
    taken = re.findall(r"Task (workers\.\w+)\[", log)
    assert taken.index("workers.sweep") < 6, taken
