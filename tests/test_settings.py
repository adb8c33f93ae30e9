"""Configuration from the environment, and the system checks that refuse unsafe mixes."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from governance.core import checks
from governance.core.env import envbool, envint, envlist, envsecret


def test_envbool_reads_the_usual_spellings_and_refuses_others(monkeypatch):
    for raw, value in [("true", True), ("1", True), ("off", False), ("NO", False)]:
        monkeypatch.setenv("X_FLAG", raw)
        assert envbool("X_FLAG", not value) is value
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured):
        envbool("X_FLAG", False)


def test_envint_and_envlist(monkeypatch):
    monkeypatch.setenv("X_INT", "12")
    assert envint("X_INT", 0) == 12
    monkeypatch.setenv("X_INT", "twelve")
    with pytest.raises(ImproperlyConfigured):
        envint("X_INT", 0)
    monkeypatch.setenv("X_LIST", "a, b,,c")
    assert envlist("X_LIST") == ["a", "b", "c"]


def test_envsecret_reads_a_file(monkeypatch, tmp_path):
    f = tmp_path / "secret"
    f.write_text("s3cret\n")
    monkeypatch.setenv("X_SECRET_FILE", str(f))
    assert envsecret("X_SECRET") == "s3cret"
    monkeypatch.setenv("X_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured):
        envsecret("X_SECRET")


def ids(problems):
    return {p.id for p in problems}


def test_checks_refuse_production_with_the_development_secret(settings):
    with override_settings(DEBUG=False, SECRET_KEY=settings.DEV_SECRET_KEY):
        assert "governance.E003" in ids(checks.check_configuration(None))
    with override_settings(DEBUG=False, SECRET_KEY="x" * 50, ALLOWED_HOSTS=[]):
        assert "governance.E004" in ids(checks.check_configuration(None))
    with override_settings(DEBUG=False, SECRET_KEY="x" * 50, ALLOWED_HOSTS=["example.org"]):
        assert "governance.E003" not in ids(checks.check_configuration(None))


def test_deploy_checks_flag_debug_and_dev_key(settings):
    with override_settings(DEBUG=True, SECRET_KEY=settings.DEV_SECRET_KEY):
        assert {"governance.E001", "governance.E002"} <= ids(checks.check_secret_key(None))


def test_a_bad_environment_stops_the_process(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DEBUG": "perhaps", "GOVERNANCE_VAR_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "DEBUG='perhaps' is not a boolean" in r.stderr
    env.update(DEBUG="false")
    r = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "governance.E003" in r.stderr


def test_every_secret_can_come_from_a_file(tmp_path):
    """Docker and Kubernetes secrets are files: each setting that can hold a password
    (the secret key, the database URL, the broker URLs) is read from NAME_FILE."""
    values = {"SECRET_KEY": "k" * 60, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
              "REDIS_URL": "redis://:pw1@127.0.0.1:1/0", "CELERY_BROKER_URL": "redis://:pw2@127.0.0.1:1/1"}
    env = {k: v for k, v in os.environ.items() if k not in values}
    for name, value in values.items():
        (tmp_path / name).write_text(value + "\n")
        env[f"{name}_FILE"] = str(tmp_path / name)
    code = ("import django, json; django.setup(); from django.conf import settings as s; "
            "print(json.dumps([s.SECRET_KEY, s.DATABASES['default']['NAME'], s.REDIS_URL, s.CELERY_BROKER_URL]))")
    r = subprocess.run([sys.executable, "-c", code], env={**env, "DJANGO_SETTINGS_MODULE": "governance.settings"},
                       capture_output=True, text=True, cwd=str(Path(__file__).parents[1]))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [values["SECRET_KEY"], str(tmp_path / "db.sqlite3"),
                                                 values["REDIS_URL"], values["CELERY_BROKER_URL"]]


def test_a_pool_process_holding_too_much_after_a_task_is_replaced():
    """Celery reads the guard from the settings (KiB); 0 turns it off."""
    from django.conf import settings

    from workers import app

    assert app.conf.worker_max_memory_per_child == settings.WORKER_MAX_MEMORY_MB * 1024 == 4096 * 1024


def test_the_embedded_database_is_created_readable_by_its_owner_only(tmp_path):
    """The ledger, the grants and the audit trail: 0600 with its WAL files, not the
    umask's 0644. A database file that exists keeps its mode."""
    env = {**os.environ, "GOVERNANCE_VAR_DIR": str(tmp_path / "var")}
    env.pop("DATABASE_URL", None)
    code = ("import os, django; os.umask(0o022); django.setup(); from django.db import connection; "
            "connection.cursor().execute('create table t (x int)'); connection.cursor().execute('insert into t values (1)'); "
            "print(sorted((p, oct(os.stat(os.path.join(os.environ['GOVERNANCE_VAR_DIR'], p)).st_mode & 0o777)) "
            "for p in os.listdir(os.environ['GOVERNANCE_VAR_DIR']) if p.startswith('governance.sqlite3')))")
    r = subprocess.run([sys.executable, "-c", code], env={**env, "DJANGO_SETTINGS_MODULE": "governance.settings"},
                       capture_output=True, text=True, cwd=str(Path(__file__).parents[1]))
    assert r.returncode == 0, r.stderr
    modes = dict(ast.literal_eval(r.stdout))
    assert modes["governance.sqlite3"] == "0o600" and modes.get("governance.sqlite3-wal", "0o600") == "0o600", modes
    assert "governance.sqlite3-wal" in modes, modes  # the connection was open: its WAL was there to check

    other = tmp_path / "other.sqlite3"
    other.touch(mode=0o640)
    env["DATABASE_URL"] = f"sqlite:///{other}"
    r = subprocess.run([sys.executable, "-c", "import django; django.setup()"],
                       env={**env, "DJANGO_SETTINGS_MODULE": "governance.settings"},
                       capture_output=True, text=True, cwd=str(Path(__file__).parents[1]))
    assert r.returncode == 0, r.stderr
    assert oct(other.stat().st_mode & 0o777) == "0o640"


@pytest.mark.parametrize("argv, age", [(["manage.py", "runserver"], 0), (["manage.py", "worker"], 60)])
def test_runserver_keeps_no_database_connection_per_thread(argv, age):
    """``runserver`` starts a thread per client connection; with persistent connections each
    ended thread's SQLite connection stayed open until the collector ran (a probe's runserver:
    480 file descriptors, 850 MB after 2,000 calls on new connections)."""
    code = (f"import sys; sys.argv = {argv!r}; import django; django.setup(); "
            "from django.conf import settings; print(settings.DATABASES['default']['CONN_MAX_AGE'])")
    env = {k: v for k, v in os.environ.items() if k != "DB_CONN_MAX_AGE"}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "DJANGO_SETTINGS_MODULE": "governance.settings"},
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(age)


@pytest.mark.django_db
def test_expired_sessions_are_deleted_by_the_hourly_task(settings):
    """Django keeps a session row per sign-in until ``clearsessions``: nothing ran it, and a
    probe's table grew by one row per sign-in for good. Beat runs it hourly now."""
    from datetime import timedelta

    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from workers.tasks import clear_sessions

    live, old = SessionStore(), SessionStore()
    live.create()
    old.create()
    Session.objects.filter(session_key=old.session_key).update(expire_date=timezone.now() - timedelta(seconds=1))
    clear_sessions()
    assert list(Session.objects.values_list("session_key", flat=True)) == [live.session_key]
    assert settings.CELERY_BEAT_SCHEDULE["clear-expired-sessions"]["task"] == "workers.clear_sessions"
