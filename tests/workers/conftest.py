"""A real Redis and a real Celery worker process, against the test database.

The worker is `manage.py worker` in a subprocess, pointed at the same database (the
SQLite test file or the PostgreSQL test database) and data directory as the test.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))
# TEST_REDIS_DB: a separate database per concurrent test run (two suites on one Redis
# would take each other's tasks).
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/{int(os.environ.get('TEST_REDIS_DB', '7'))}"


def redis_up() -> bool:
    import redis

    try:
        return redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="session")
def redis_server():
    if not redis_up():
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "redis-start"], check=False)
    if not redis_up():
        if os.environ.get("CI") == "true":
            pytest.fail("Redis could not be started (scripts/services.sh redis-start)")
        pytest.skip("no Redis server (scripts/services.sh redis-start)")
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    return REDIS_URL


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.fixture
def real_worker(redis_server, settings, tmp_path, monkeypatch, request):
    """Start a worker process on Redis and send this process's tasks there
    (``@pytest.mark.worker(pool="prefork", NAME="value")``: another pool, more environment).

    Yields ``send(request_id)``, which delivers a task for a request once more;
    ``send.process`` is the worker's process, ``send.start_again()`` starts another (the same
    command: the same node name) and makes it ``send.process``.
    """
    from governance.requests import submission
    from workers import app
    from workers.tasks import run_request

    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_server,
           "DATA_DIR": str(settings.DATA_DIR), "RESULTS_DIR": str(settings.RESULTS_DIR),
           "DATASET_IMPORT_DIRS": ",".join(map(str, settings.DATASET_IMPORT_DIRS)),
           "GOVERNANCE_VAR_DIR": str(tmp_path / "worker-var"), "CELERY_TASK_ALWAYS_EAGER": "false",
           "REQUEST_HEARTBEAT_SECONDS": "1"}
    marker = request.node.get_closest_marker("worker")
    extra = dict(marker.kwargs) if marker else {}
    pool = extra.pop("pool", "solo")
    env.update(extra)
    log = open(tmp_path / "worker.log", "w")
    procs = []

    def start():
        procs.append(subprocess.Popen([sys.executable, "manage.py", "worker", "-Q", "cpu,gpu", "-c", "1", "--pool",
                                       pool, "--loglevel", "INFO"], cwd=ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
        send.process = procs[-1]  # for the tests that kill it
        return procs[-1]

    def send(request_id, queue="cpu"):
        # An explicit connection: the app's own pool may still hold the embedded broker.
        with app.connection_for_write(redis_server) as conn:
            run_request.apply_async(args=[str(request_id)], queue=queue, connection=conn)

    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False
    monkeypatch.setattr(submission, "enqueue", send)
    send.start_again = start
    start()
    try:
        yield send
    finally:
        app.conf.task_always_eager = eager
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        print((tmp_path / "worker.log").read_text()[-3000:])


def wait_for(predicate, timeout=90.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s")


#: a folder for a real worker's PYTHONPATH that installs the memory-hog test engine by its entry point
ENTRY_POINTS = str((Path(__file__).parent / "entry_points").resolve())


@pytest.fixture
def memory_hog():
    """The memory-hog test engine (tests/workers/memory_hog.py) in this process too: the web side plans it."""
    from engines import plugins

    from .memory_hog import ENGINE

    plugins.pm.register(ENGINE, name="memory-hog-test")
    yield ENGINE
    plugins.pm.unregister(ENGINE)
