"""Every setting the Configuration table lists (docs/operations.md) is checked at start-up (issue 22):
``REQUEST_RATE_LIMIT=100000`` (no ``/period``) passed ``manage.py check`` and then every
``POST /api/requests/`` was a 500. A malformed value is now a system check error with a
stable id (governance.E007-E024), or, where Django needs the value before the checks run
(the database URL, the log level), an ImproperlyConfigured naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from governance.core import checks
from governance.core.security import RequestCreationThrottle

ROOT = Path(__file__).resolve().parents[1]


def ids(problems):
    return {p.id for p in problems if p.level >= 40}  # errors only


def test_the_default_configuration_passes():
    assert ids(checks.check_settings(None)) == set()


@pytest.mark.parametrize("overrides, error_id", [
    ({"REQUEST_RATE_LIMIT": "100000"}, "governance.E007"),
    ({"REQUEST_RATE_LIMIT": "100/fortnight"}, "governance.E007"),
    ({"REQUEST_RATE_LIMIT": "100 / min"}, "governance.E007"),
    ({"REQUEST_RATE_LIMIT": "0/min"}, "governance.E007"),
    ({"REQUEST_RATE_LIMIT": "-5/min"}, "governance.E007"),
    ({"REQUEST_RATE_LIMIT": "100/5min"}, "governance.E007"),
    ({"API_TOKEN_TTL_DAYS": -1}, "governance.E008"),
    ({"DASK_TASK_RETRIES": -1}, "governance.E015"),
    ({"CELERY_DB_REUSE_MAX": 0}, "governance.E017"),
    ({"WORKER_MAX_MEMORY_MB": -1}, "governance.E035"),
    ({"MAX_ACTIVE_REQUESTS": -1}, "governance.E036"),
    ({"MAX_REQUEST_PARAMS_BYTES": 0}, "governance.E036"),
    ({"RESULTS_MIN_FREE_MB": -1}, "governance.E036"),
    ({"OUTCOME_RETRY_SECONDS": -1}, "governance.E036"),
    ({"SECURE_HSTS_SECONDS": -3600}, "governance.E023"),
    ({"REQUEST_REQUEUE_AFTER_SECONDS": 0}, "governance.E021"),
    ({"RELEASE_QUANTUM_MS": -1}, "governance.E022"),
    ({"RELEASE_QUANTUM_MS": 120_000, "REQUEST_LOST_AFTER_SECONDS": 120}, "governance.E022"),
    ({"DATASET_IMPORT_DIRS": [Path("relative/import")]}, "governance.E012"),
    ({"DATASET_IMPORT_URIS": ["bucket/tables/"]}, "governance.E013"),
    ({"DATASET_IMPORT_URIS": ["file:///data/tables/"]}, "governance.E013"),
    ({"DASK_SCHEDULER_ADDRESS": "scheduler"}, "governance.E014"),
    ({"DASK_SCHEDULER_ADDRESS": "http://scheduler:8786"}, "governance.E014"),
    ({"DASK_SCHEDULER_ADDRESS": "tcp://scheduler:port"}, "governance.E014"),
    ({"REDIS_URL": "localhost:6379"}, "governance.E016"),
    ({"REDIS_URL": "http://cache:6379/0"}, "governance.E016"),
    ({"CELERY_BROKER_URL": "bogus://broker/0"}, "governance.E016"),
    ({"CELERY_TASK_SOFT_TIME_LIMIT": 600, "CELERY_TASK_TIME_LIMIT": 600}, "governance.E018"),
    ({"CELERY_TASK_SOFT_TIME_LIMIT": 0}, "governance.E018"),
    ({"CELERY_BROKER_TRANSPORT_OPTIONS": {"visibility_timeout": 3600}, "CELERY_TASK_TIME_LIMIT": 7200,
      "CELERY_TASK_SOFT_TIME_LIMIT": 7000}, "governance.E019"),
    ({"REQUEST_HEARTBEAT_SECONDS": 120, "REQUEST_LOST_AFTER_SECONDS": 120}, "governance.E020"),
    ({"REQUEST_HEARTBEAT_SECONDS": 0}, "governance.E020"),
    ({"MAX_UPLOAD_BYTES": 0}, "governance.E006"),
    ({"WORKER_HEARTBEAT_SECONDS": 0}, "governance.E031"),
    ({"WORKER_HEARTBEAT_SECONDS": 30, "WORKER_ALIVE_SECONDS": 30}, "governance.E031"),
    ({"FEDERATED_SUPERLINK": "superlink"}, "governance.E032"),
    ({"FEDERATED_SUPERLINK": "http://superlink:9093"}, "governance.E032"),
    ({"FEDERATED_SUPERLINK": "superlink:port"}, "governance.E032"),
    ({"FEDERATED_SUPERLINK": "superlink:9093/path"}, "governance.E032"),
    ({"FEDERATED_ROOT_CERTIFICATES": "relative/ca.pem"}, "governance.E033"),
    ({"FEDERATED_ROOT_CERTIFICATES": "/no/such/ca.pem"}, "governance.E033"),
    ({"FEDERATED_WAIT_SITES_SECONDS": 0}, "governance.E034"),
    ({"FEDERATED_ROUND_TIMEOUT_SECONDS": -1}, "governance.E034"),
])
def test_a_malformed_setting_is_a_check_error(overrides, error_id):
    with override_settings(**overrides):
        # (check_configuration's E003: pytest-django runs tests with DEBUG off)
        found = ids(checks.check_settings(None)) | ids(checks.check_configuration(None)) - {"governance.E003"}
    assert found == {error_id}, found


@pytest.mark.parametrize("overrides", [
    {"REQUEST_RATE_LIMIT": ""}, {"REQUEST_RATE_LIMIT": "1/s"}, {"REQUEST_RATE_LIMIT": "600/min"},
    {"REQUEST_RATE_LIMIT": "5000/hour"}, {"REQUEST_RATE_LIMIT": "10/day"},
    {"DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.5:8786"}, {"DASK_SCHEDULER_ADDRESS": "scheduler:8786"},
    {"DASK_SCHEDULER_ADDRESS": "tls://[::1]:8786"}, {"DASK_SCHEDULER_ADDRESS": "inproc://1.2.3/4"},
    {"REDIS_URL": "redis://:pw@redis:6379/0"}, {"REDIS_URL": "rediss://redis/1"},
    {"REDIS_URL": "unix:///run/redis.sock"}, {"CELERY_BROKER_URL": "amqp://guest@rabbit//"},
    {"DATASET_IMPORT_URIS": ["s3://bucket/tables/", "gs://b/t"]},
    {"RELEASE_QUANTUM_MS": 0}, {"API_TOKEN_TTL_DAYS": 0}, {"DASK_TASK_RETRIES": 0},
    {"FEDERATED_SUPERLINK": ""}, {"FEDERATED_SUPERLINK": "127.0.0.1:9093"}, {"FEDERATED_SUPERLINK": "[::1]:9093"},
    {"FEDERATED_SUPERLINK": "superlink.internal:9093"},
])
def test_good_values_pass(overrides):
    with override_settings(**overrides):
        assert ids(checks.check_settings(None)) == set()


@pytest.mark.parametrize("key, value, error_id", [
    ("CONN_MAX_AGE", -1, "governance.E009"), ("CONN_MAX_AGE", None, None), ("CONN_MAX_AGE", 0, None),
    ("OPTIONS", {"prepare_threshold": -1}, "governance.E010"), ("OPTIONS", {"prepare_threshold": None}, None)])
def test_database_options_are_checked(monkeypatch, key, value, error_id):
    monkeypatch.setitem(django_settings.DATABASES["default"], key, value)
    assert ids(checks.check_settings(None)) == ({error_id} if error_id else set())


def test_a_data_directory_that_is_a_file_is_refused(tmp_path, settings):
    (tmp_path / "file").write_text("x")
    for name in ("DATA_DIR", "RESULTS_DIR", "VAR_DIR"):
        with override_settings(**{name: tmp_path / "file"}):
            assert ids(checks.check_settings(None)) == {"governance.E011"}, name
    with override_settings(DATASET_IMPORT_DIRS=[tmp_path / "file"]):
        assert ids(checks.check_settings(None)) == {"governance.E012"}
    with override_settings(DATA_DIR=tmp_path / "not-yet"):  # created when first needed
        assert ids(checks.check_settings(None)) == set()


def test_engine_entry_points_switch_must_be_a_boolean_the_loader_reads(monkeypatch):
    monkeypatch.setenv("PRIVACY_ENGINES_DISABLE_ENTRYPOINTS", "yes")  # engines/plugins.py would ignore it
    assert ids(checks.check_settings(None)) == {"governance.E024"}
    monkeypatch.setenv("PRIVACY_ENGINES_DISABLE_ENTRYPOINTS", "true")
    assert ids(checks.check_settings(None)) == set()


def _run(tmp_path, command, **env):
    base = {"PATH": "/usr/bin:/bin", "GOVERNANCE_VAR_DIR": str(tmp_path / "var")}
    return subprocess.run([sys.executable, "manage.py", *command], env={**base, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_manage_py_check_names_every_malformed_setting_from_the_environment(tmp_path):
    (tmp_path / "a-file").write_text("x")
    r = _run(tmp_path, ["check"],
             REQUEST_RATE_LIMIT="100000", API_TOKEN_TTL_DAYS="-1", DB_CONN_MAX_AGE="-5",
             DATABASE_URL="postgres://u@127.0.0.1:1/db", DB_PREPARE_THRESHOLD="-1",
             DATA_DIR=str(tmp_path / "a-file"), DATASET_IMPORT_DIRS="relative/dir",
             DATASET_IMPORT_URIS="bucket/tables/", DASK_SCHEDULER_ADDRESS="scheduler", DASK_TASK_RETRIES="-1",
             REDIS_URL="redis://127.0.0.1:1/0", CELERY_BROKER_URL="bogus://x", CELERY_DB_REUSE_MAX="0",
             CELERY_TASK_SOFT_TIME_LIMIT="100", CELERY_TASK_TIME_LIMIT="50", CELERY_VISIBILITY_TIMEOUT="10",
             REQUEST_HEARTBEAT_SECONDS="300", REQUEST_LOST_AFTER_SECONDS="120", REQUEST_REQUEUE_AFTER_SECONDS="0",
             RELEASE_QUANTUM_MS="-1", SECURE_HSTS_SECONDS="-1", PRIVACY_ENGINES_DISABLE_ENTRYPOINTS="yes",
             MAX_UPLOAD_BYTES="0")
    assert r.returncode != 0
    expected = {f"governance.E{n:03d}" for n in range(6, 25)}
    missing = {i for i in expected if f"({i})" not in r.stderr}
    assert not missing, (missing, r.stderr[-3000:])
    assert "Traceback" not in r.stderr


def test_the_issue_case_stops_manage_py_check(tmp_path):
    r = _run(tmp_path, ["check"], REQUEST_RATE_LIMIT="100000")
    assert r.returncode != 0 and "(governance.E007) REQUEST_RATE_LIMIT='100000'" in r.stderr, r.stderr[-2000:]
    assert _run(tmp_path, ["check"], REQUEST_RATE_LIMIT="100000/min").returncode == 0


@pytest.mark.parametrize("env, message", [
    ({"DATABASE_URL": "posgres://u:hunter2@db/x"}, "DATABASE_URL is not a database URL"),
    ({"DATABASE_URL": "postgres://u:hunter2@db:port/x"}, "DATABASE_URL is not a database URL"),
    ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='LOUD' is not DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    ({"RELEASE_QUANTUM_MS": "1s"}, "RELEASE_QUANTUM_MS='1s' is not an integer"),
])
def test_values_needed_before_the_checks_stop_the_process_with_their_name(tmp_path, env, message):
    r = _run(tmp_path, ["check"], **env)
    assert r.returncode != 0 and f"ImproperlyConfigured: {message}" in r.stderr, r.stderr[-2000:]
    assert "hunter2" not in r.stderr  # the password of a database URL is never printed


# ---------------------------------------------------------------- accepted means it works

@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.text(max_size=12),
    st.builds(lambda n, sep, p: f"{n}{sep}{p}", st.integers(-5, 10**6), st.sampled_from(["/", " /", "/ ", ""]),
              st.sampled_from(["s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day", "M", "5min",
                               "w", "week", "", "min "]))))
def test_every_rate_the_check_accepts_is_one_the_throttle_applies(rate):
    if checks.rate_problem(rate) is not None:
        return
    throttle = RequestCreationThrottle()
    with override_settings(REQUEST_RATE_LIMIT=rate):
        throttle.rate = throttle.get_rate()
        num, duration = throttle.parse_rate(throttle.rate)  # DRF's own parser: must not raise
    assert rate == "" or (num >= 1 and duration in (1, 60, 3600, 86400))


@pytest.mark.django_db
@pytest.mark.parametrize("rate", ["100000", "1/s", "600/min", "", "abc/min"])
def test_post_requests_never_500s_whatever_the_rate(api, analyst, make_dataset, grant, settings, rate):
    """With a rate the check accepts the throttle applies it; with one it refuses (a process
    started without the checks) the limit is off and logged, never a 500."""
    from django.core.cache import cache

    cache.clear()
    settings.REQUEST_RATE_LIMIT = rate
    ds = make_dataset(epsilon=100.0)
    grant(analyst, ds)
    for i in range(3):
        r = api(analyst).post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                                  "params": {"epsilon": 0.01 + i / 1000}}, format="json")
        assert r.status_code < 500, r.content[:500]
        assert r.status_code in (201, 202, 200) or (rate == "1/s" and r.status_code == 429), r.content[:300]
    cache.clear()


def test_csrf_trusted_origins_without_a_scheme_are_djangos_own_check_error():
    """CSRF_TRUSTED_ORIGINS is checked by Django itself (4_0.E001), with the rest at start-up."""
    from django.core.checks import run_checks

    with override_settings(CSRF_TRUSTED_ORIGINS=["governance.example.org"]):
        assert "4_0.E001" in {p.id for p in run_checks()}
    with override_settings(CSRF_TRUSTED_ORIGINS=["https://governance.example.org"]):
        assert "4_0.E001" not in {p.id for p in run_checks()}


@pytest.mark.parametrize("soft, warned", [(20, True), (3599, True), (3600, False), (10_800, False)])
def test_a_soft_time_limit_under_aims_rounds_allowance_is_a_warning(soft, warned):
    """AIM ends its rounds after 1,800 s (then one last round, the fit, the files): under a
    soft limit of 20 s a probe's every AIM run failed after the read, charged, with nothing
    released, and no check said so."""
    with override_settings(CELERY_TASK_SOFT_TIME_LIMIT=soft, CELERY_TASK_TIME_LIMIT=soft + 300):
        found = {p.id for p in checks.check_settings(None)}
    assert found == ({"governance.W003"} if warned else set())
