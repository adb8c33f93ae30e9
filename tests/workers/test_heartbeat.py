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
