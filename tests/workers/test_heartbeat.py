"""The worker's heartbeat record (governance/core/liveness.py): ``stop()`` removes it, and
no beat under way writes it back after the removal (a stopped worker then read as alive
for WORKER_ALIVE_SECONDS, and ``manage.py workers`` exited 0 with a request stranded)."""

import json
import threading
import time

from governance.core import liveness


def test_a_beat_under_way_does_not_bring_a_stopped_workers_record_back(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = ""
    real = liveness.write
    writing = threading.Event()

    def slow_write(record):
        if threading.current_thread().name == "governance-heartbeat":
            writing.set()
            time.sleep(0.5)  # the beat is under way when stop() comes
        real(record)

    monkeypatch.setattr(liveness, "write", slow_write)
    hb = liveness.Heartbeat("celery@test", ["cpu"], interval=0.05).start()
    assert [r["node"] for r in liveness.records()] == ["celery@test"]
    assert writing.wait(5)
    hb.stop()
    time.sleep(0.7)  # past the beat's write
    assert liveness.records() == []


def test_two_workers_of_one_node_on_one_host_are_two_records(settings, tmp_path):
    """Two ``manage.py worker`` on one host (one per queue) are both celery@<host>: one
    record per node flipped between them, and ``workers --strict`` said the cpu queue had
    no live worker (a probe). A record per process; a dead one of this host is removed when
    the node starts again, not left DEAD for good."""
    import os
    import socket
    import subprocess
    import sys

    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = ""
    now = time.time()
    host = socket.gethostname()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        liveness.write({"node": "celery@box", "host": host, "pid": other.pid, "queues": ["gpu"], "at": now})
        liveness.write({"node": "celery@box", "host": host, "pid": int(dead.stdout), "queues": ["cpu"], "at": now - 600})
        liveness.write({"node": "celery@box", "host": "elsewhere", "pid": 1, "queues": ["x"], "at": now})
        (tmp_path / "workers" / "celery@box.json").write_text(json.dumps(  # as written before: by node alone
            {"node": "celery@box", "host": host, "pid": int(dead.stdout), "queues": ["cpu"], "at": now - 900}))
        assert len(liveness.records()) == 4
        hb = liveness.Heartbeat("celery@box", ["cpu"], interval=60).start()
        recs = {(r["host"], r["pid"]): r for r in liveness.records()}
        assert set(recs) == {(host, other.pid), (host, os.getpid()), ("elsewhere", 1)}  # the dead two removed
        assert {q for r in liveness.alive() for q in r["queues"]} == {"cpu", "gpu", "x"}
        hb.stop()
        assert {(r["host"], r["pid"]) for r in liveness.records()} == {(host, other.pid), ("elsewhere", 1)}
    finally:
        other.kill()
        other.wait()


def test_a_worker_s_age_does_not_depend_on_its_wall_clock_or_the_reader_s(settings, tmp_path, monkeypatch):
    """A probe: a worker 10 minutes behind read as DEAD while it served; one 2 hours ahead,
    killed, read as alive for 2 hours; so did one killed after its host's clock was stepped
    back. On one machine the age is its monotonic clock's (the boot id says it is one)."""
    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = ""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 600)  # the worker's clock, 10 min behind
    hb = liveness.Heartbeat("celery@behind", ["cpu"], interval=60).start()
    monkeypatch.setattr(time, "time", real)
    assert [r["node"] for r in liveness.alive()] == ["celery@behind"]
    hb._stop.set()  # as if killed: no more beats, the record stays
    monkeypatch.setattr(time, "time", lambda: real() - 300)  # the reader's clock stepped back
    later = time.monotonic() + settings.WORKER_ALIVE_SECONDS + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    assert liveness.alive() == [] and liveness.records()[0]["node"] == "celery@behind"


def test_with_redis_a_worker_s_age_is_on_redis_s_clock(settings, monkeypatch, redis_server):
    settings.REDIS_URL = redis_server
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200)  # the worker's clock 2 h ahead
    hb = liveness.Heartbeat("celery@ahead", ["gpu"], interval=60).start()
    try:
        monkeypatch.setattr(time, "time", real)
        assert [r["node"] for r in liveness.alive()] == ["celery@ahead"]
        record = next(r for r in liveness.records() if r["node"] == "celery@ahead")
        assert record["age"] < 5  # not two hours in the future, not -7,200 s
        monkeypatch.setattr(time, "time", lambda: real() - 600)  # a reader 10 min behind
        assert [r["node"] for r in liveness.alive()] == ["celery@ahead"]
        hb._stop.set()  # as if killed: its last record stays
        settings.WORKER_ALIVE_SECONDS = 1
        time.sleep(1.5)
        assert "celery@ahead" not in [r["node"] for r in liveness.alive()]  # dead, not alive for 2 hours
    finally:
        hb.stop()


def test_the_recovery_sweeps_last_run_is_kept_apart_from_the_workers(settings, tmp_path, monkeypatch, redis_server):
    """``manage.py workers`` says when the sweep last ran (``sweep_ran`` / ``sweep_age``), on
    the records' clocks, in the folder and in Redis, never listed as a worker."""
    settings.VAR_DIR = tmp_path
    for url in ("", redis_server):
        settings.REDIS_URL = url
        if url:
            import redis

            redis.Redis.from_url(url).delete(liveness.SWEEP_KEY)
        assert liveness.sweep_age() is None
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 7200)  # the sweeping worker's clock 2 h ahead
        liveness.sweep_ran()
        monkeypatch.setattr(time, "time", real)
        assert 0 <= liveness.sweep_age() < 5
        assert all(r["node"] != "sweep" for r in liveness.records())
