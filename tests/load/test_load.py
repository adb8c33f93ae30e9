"""The load benchmark at CI size: bench/bench_load.py --quick, run as it is run by hand.

1,000 POSTs /api/requests/ by 64 concurrent clients against one dataset whose budget fits
about half of them, through the real server (deploy/entrypoint.sh web: gunicorn) and a
real Celery worker (deploy/entrypoint.sh worker) on PostgreSQL and Redis, with one
restart of the web server in the middle. The benchmark computes its reliability report
from the database and prints it as its last line (``LOAD_RESULT_JSON {...}``); this test
asserts on it: nothing lost, nothing overspent, no 5xx, no reservation left, the audit
chain verifies, the fault was survived.

It runs once per ``scripts/test.sh``: in the PostgreSQL pass (skipped on SQLite), in its
own scratch database (``governance_load_ci``, dropped afterwards) and Redis db 14, not in
pytest's test database. Without PostgreSQL or Redis (and ``scripts/services.sh`` unable to
start them) it is skipped, except under CI=true where that is a failure. ~1-1.5 min.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
RESULT_TAG = "LOAD_RESULT_JSON "
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))

pytestmark = pytest.mark.postgres


def _unavailable(message: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI requires it")
    pytest.skip(message)


def _pg_base_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        return url
    s = settings.DATABASES["default"]
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _pg_up(url: str) -> bool:
    import dj_database_url
    import psycopg

    cfg = dj_database_url.parse(url)
    try:
        with psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                             password=cfg["PASSWORD"] or None, dbname=cfg["NAME"], connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=REDIS_PORT, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture
def services():
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the load test runs in the PostgreSQL pass of scripts/test.sh (DATABASE_URL=postgres://...)")
    url = _pg_base_url()
    for name, up in (("postgres", lambda: _pg_up(url)), ("redis", _redis_up)):
        if not up():
            subprocess.run([str(ROOT / "scripts" / "services.sh"), f"{name}-start"], check=False)
        if not up():
            _unavailable(f"{name} is not available (scripts/services.sh {name}-start)")
    return url


def test_load_quick(services):
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["BENCH_PG_BASE_URL"] = services
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "bench/bench_load.py", "--quick", "--db", "governance_load_ci",
                           "--redis-db", "14"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    report = proc.stdout + "\n" + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    assert lines, f"no result line (exit {proc.returncode}):\n{report}"
    r = json.loads(lines[-1][len(RESULT_TAG):])
    print(proc.stdout)
    print(f"bench_load.py --quick took {took:.0f}s")

    assert r["attempted"] == r["requests"] == 1000
    assert r["lost"] == 0, report
    assert r["no_answer"] == 0, report
    assert r["status_5xx"] == 0, report
    assert r["overspent"] == 0, report
    assert r["left_reserved"] == 0, report
    assert r["audit_verify_exit"] == 0, report
    assert r["audit_chain_ok"], report
    assert r["drain_left"] == 0, report
    # the budget ran out partway: both answers happened, and nothing else
    assert r["admitted"] > 0 and r["refused"] > 0, report
    assert r["admitted"] + r["refused"] + r["replayed"] + r["other_4xx"] == r["attempted"], report
    assert r["other_4xx"] == 0, report
    assert r["faults_injected"] == r["faults_survived"] == 1, report
    assert r["ok"] and proc.returncode == 0, report
