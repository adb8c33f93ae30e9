"""The worker's heartbeat record (governance/core/liveness.py): ``stop()`` removes it, and
no beat under way writes it back after the removal (a stopped worker then read as alive
for WORKER_ALIVE_SECONDS, and ``manage.py workers`` exited 0 with a request stranded)."""

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
