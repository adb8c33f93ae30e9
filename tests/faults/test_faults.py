"""The fault benchmark at its CI setting: bench/bench_faults.py, run as it is run by hand.

Through the real server (deploy/entrypoint.sh web: gunicorn), two real Celery workers
(deploy/entrypoint.sh worker, prefork: one on the cpu queue, one on gpu), PostgreSQL and a
Redis server of the benchmark's own (no persistence), analysts ask aggregates and DP-SGD
training runs of stevedata/gss_wages while the benchmark kills a worker with SIGKILL 4
times (2 mid-aggregate, 2 mid-training, one of them the worker's main process), restarts
Redis once while requests are queued and restarts the web server once; the recovery sweep
runs every second with REQUEST_HEARTBEAT_SECONDS=1, REQUEST_LOST_AFTER_SECONDS=5 and
REQUEST_REQUEUE_AFTER_SECONDS=10. The benchmark checks the database afterwards and prints
its reliability report, last line ``FAULTS_RESULT_JSON {...}``; this test asserts every
invariant on it. ``bench/bench_faults.py --full`` is the full setting (20 kills, 4 Redis
restarts).

Like tests/load, it runs once per ``scripts/test.sh``: in the PostgreSQL pass (skipped on
SQLite), in its own scratch database (``governance_faults_ci``, dropped afterwards), not in
pytest's test database. Without PostgreSQL or redis-server (and ``scripts/services.sh``
unable to provide them) it is skipped, except under CI=true where that is a failure.
The benchmark took 41-50 s here (three runs, load 0.6-1.3).
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.load.test_load import _pg_base_url, _pg_up, _unavailable

ROOT = Path(__file__).resolve().parents[2]
RESULT_TAG = "FAULTS_RESULT_JSON "

pytestmark = pytest.mark.postgres


@pytest.fixture
def services():
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the fault test runs in the PostgreSQL pass of scripts/test.sh (DATABASE_URL=postgres://...)")
    url = _pg_base_url()
    if not _pg_up(url):
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "postgres-start"], check=False)
    if not _pg_up(url):
        _unavailable("postgres is not available (scripts/services.sh postgres-start)")
    if shutil.which("redis-server") is None:  # the benchmark starts a Redis of its own; this installs it
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "redis-start"], check=False)
    if shutil.which("redis-server") is None:
        _unavailable("redis-server is not installed (scripts/services.sh redis-start)")
    return url


def test_faults_ci(services):
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["BENCH_PG_BASE_URL"] = services
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "bench/bench_faults.py", "--db", "governance_faults_ci"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - t0
    report = proc.stdout + "\n" + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    assert lines, f"no result line (exit {proc.returncode}):\n{report}"
    r = json.loads(lines[-1][len(RESULT_TAG):])
    print(proc.stdout)
    print(f"bench_faults.py (CI setting) took {took:.0f}s")

    assert r["setting"] == "CI"
    # every fault was injected, and survived
    assert r["faults_planned"] == r["faults_injected"] == 6, report
    assert r["faults_by_kind"] == {"kill-aggregate": [2, 2], "kill-training": [2, 2], "redis-restart": [1, 1],
                                   "web-restart": [1, 1]}, report
    assert r["faults_survived"] == r["faults_injected"], report
    assert r["kills_mid_run_with_data_read"] >= 1, report  # some kills landed in 'running' with the data read
    # afterwards: nothing lost, nothing stuck, every request final
    assert r["lost"] == 0 and r["no_answer"] == 0, report
    assert r["quiesce_left"] == 0 and r["running_fresh"] == 0, report
    assert set(r["db_by_status"]) <= {"succeeded", "failed", "cancelled"}, report
    assert r["untold"] == 0 and r["stuck_clients"] == 0, report
    # every reservation committed or released by the rule; nothing charged twice
    assert r["left_reserved"] == r["reserved_without_live_request"] == r["orphan_entries"] == 0, report
    assert r["charged_twice"] == 0 and r["k_admitted_twice"] == 0, report
    assert r["released_after_read"] == 0 and r["committed_without_read"] == 0, report
    assert r["lost_rule_broken"] == 0 and r["audit_record_mismatch"] == 0, report
    # within budget, the ledger and the chain agree and verify
    assert r["overspent"] == 0 and r["budget_row_agrees"], report
    assert r["audit_verify_exit"] == 0, report
    # no 5xx, nothing but the expected answers
    assert r["status_5xx"] == 0 and r["web_log_5xx"] == 0, report
    assert r["other_4xx"] == 0, report
    assert r["admitted"] > 0 and r["admitted"] + r["refused"] + r["replayed"] == r["attempted"], report
    assert r["ok"] and proc.returncode == 0, report
