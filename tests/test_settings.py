"""Configuration from the environment, and the system checks that refuse unsafe mixes."""

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from governance import checks
from governance.env import envbool, envint, envlist, envsecret


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
