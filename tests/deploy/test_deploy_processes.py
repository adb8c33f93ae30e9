"""The image's processes, started directly: deploy/entrypoint.sh web, worker and beat.

What the containers run, without a container: the files deploy/Dockerfile copies into /app
(and only those) are staged in a temporary directory, static files are collected there as
the image build does, and the same script runs from it, on a temporary SQLite database,
temporary data directories and the embedded filesystem broker (no Redis, no PostgreSQL),
with DEBUG=false and a real SECRET_KEY as in production. Each process is stopped with
SIGTERM, as Docker and Kubernetes stop containers, and must exit cleanly.
"""

import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from .conftest import DEPLOY, ROOT

pytestmark = pytest.mark.deploy_process


def dockerfile_copies() -> list[tuple[str, str]]:
    """(source, destination under /app) of the runtime stage's COPY lines from the context."""
    text = (DEPLOY / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime"):]
    return re.findall(r"^COPY (?:--chown=\S+ )?([^-\s]\S*) \./(\S*)$", runtime, flags=re.M)


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory):
    """/app as the image has it: the Dockerfile's COPY sources, then its collectstatic."""
    app = tmp_path_factory.mktemp("image") / "app"
    copies = dockerfile_copies()
    assert {src for src, _ in copies} >= {"manage.py", "accounting", "governance", "engines", "workers", "deploy/entrypoint.sh"}
    for src, dest in copies:
        target = app / dest if dest and not dest.endswith("/") else app / dest / os.path.basename(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / src).is_dir():
            shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / src, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SECRET_KEY", "DEBUG"))}
    env.update({"GOVERNANCE_VAR_DIR": str(app / "var"), "SECRET_KEY": "collectstatic-only", "DEBUG": "false"})
    r = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"], cwd=app,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (app / "var" / "static" / "admin" / "css" / "base.css").exists()  # STATIC_ROOT = GOVERNANCE_VAR_DIR/static
    return app


@pytest.fixture
def entrypoint(app_dir):
    return str(app_dir / "deploy" / "entrypoint.sh")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def deploy_env(tmp_path):
    """The environment compose gives a container, pointed at temporary files."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER",
                        "SECRET_KEY_FILE", "DJANGO_SETTINGS_MODULE")}
    (tmp_path / "data" / "import").mkdir(parents=True)
    (tmp_path / "results").mkdir()
    env.update({
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}",  # the venv's python first
        "DATABASE_URL": f"sqlite:///{tmp_path / 'governance.sqlite3'}",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "false",
        "ALLOWED_HOSTS": "localhost,governance.example.org",
        "GOVERNANCE_VAR_DIR": str(tmp_path / "var"),
        "DATA_DIR": str(tmp_path / "data"),
        "DATASET_IMPORT_DIRS": str(tmp_path / "data" / "import"),
        "RESULTS_DIR": str(tmp_path / "results"),
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
        "BEAT_SCHEDULE_FILE": str(tmp_path / "celerybeat-schedule"),
    })
    return env


class Started:
    """A process started in its own session, its output in a file; stopped like a container."""

    def __init__(self, args, env, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(args, cwd=log_path.parent, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {what}:\n{self.output()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no {what} after {timeout}s:\n{self.output()[-4000:]}")

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM (docker stop): the process must exit by itself within `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            self.log.close()


def http_status(port: int, path: str, host: str = "localhost") -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def officer_login_behind_tls_proxy(port: int) -> int:
    """The officer UI's login form, POSTed as a browser does through a TLS-terminating proxy:
    Origin https://..., the proxy adding X-Forwarded-Proto. Django's CSRF check compares the
    Origin with the request's scheme: gunicorn must take the scheme from the proxy's header."""
    host = "governance.example.org"
    page = urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/login/", headers={"Host": host, "X-Forwarded-Proto": "https"}), timeout=10)
    cookie = page.headers["Set-Cookie"].split(";", 1)[0]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.read().decode()).group(1)
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": "nobody", "password": "wrong"}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/login/", data=body, method="POST", headers={
        "Host": host, "X-Forwarded-Proto": "https", "Origin": f"https://{host}",
        "Referer": f"https://{host}/admin/login/", "Cookie": cookie,
        "Content-Type": "application/x-www-form-urlencoded"})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def health(entrypoint: str, role: str | None, env) -> subprocess.CompletedProcess:
    return subprocess.run([entrypoint, "health", *([role] if role else [])], env=env,
                          capture_output=True, text=True, timeout=60)


def test_web_migrates_then_serves_with_gunicorn_and_stops_on_sigterm(entrypoint, deploy_env, tmp_path):
    port = free_port()
    env = {**deploy_env, "PORT": str(port), "GUNICORN_WORKERS": "1", "GUNICORN_THREADS": "2",
           "GUNICORN_FORWARDED_ALLOW_IPS": "*"}  # as compose.yaml and the ConfigMap set it
    web = Started([entrypoint, "web"], env, tmp_path / "web.log")
    try:
        web.wait_for(lambda: health(entrypoint, "web", env).returncode == 0, 60, "healthy web service")
        out = health(entrypoint, "web", env)
        assert f"http://127.0.0.1:{port}/healthz: 200" in out.stdout
        # the image's HEALTHCHECK: no role given, read from the process's command line
        out = health(entrypoint, None, {**env, "HEALTHCHECK_PID": str(web.proc.pid)})
        assert out.returncode == 0 and "/healthz: 200" in out.stdout, out.stderr
        assert http_status(port, "/api/datasets/") == 401  # the API answers, and wants a token
        assert http_status(port, "/no-such-page/") == 404
        assert officer_login_behind_tls_proxy(port) == 200  # the form again ("wrong password"), not 403 (CSRF)
        log = web.output()
        assert "gunicorn governance.wsgi on 0.0.0.0:" in log and "Booting worker" in log
        assert "Traceback" not in log
        assert http_status(port, "/api/datasets/", host="evil.example.com") == 400  # ALLOWED_HOSTS holds
    finally:
        code = web.terminate()
    assert code == 0, web.output()[-3000:]
    with sqlite3.connect(tmp_path / "governance.sqlite3") as db:  # `web` ran the migrations first
        applied = {r[0] for r in db.execute("SELECT app FROM django_migrations")}
    assert {"governance", "auth", "authtoken"} <= applied


def test_web_refuses_to_start_with_debug_on_or_the_development_key(entrypoint, deploy_env):
    for override in ({"DEBUG": "true"}, {"SECRET_KEY": ""}):
        env = {**deploy_env, **override, "PORT": str(free_port())}
        if override.get("SECRET_KEY") == "":
            del env["SECRET_KEY"]
        r = subprocess.run([entrypoint, "web"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert "governance.E00" in r.stderr and "gunicorn" not in r.stderr, r.stderr[-2000:]


def test_worker_starts_answers_ping_and_stops_on_sigterm(entrypoint, deploy_env, tmp_path):
    env = {**deploy_env, "WORKER_QUEUES": "cpu,gpu", "WORKER_CONCURRENCY": "1"}
    worker = Started([entrypoint, "worker"], env, tmp_path / "worker.log")
    try:
        worker.wait_for(lambda: " ready." in worker.output(), 40, "'ready' from the Celery worker")
        log = worker.output()
        assert "worker: broker filesystem://localhost/, queues sweep,cpu,gpu" in log
        assert "Traceback" not in log
        out = health(entrypoint, "worker", env)  # `celery inspect ping` of this host's node, over the broker
        assert out.returncode == 0, out.stdout + out.stderr
        assert "pong" in out.stdout
        out = health(entrypoint, None, {**env, "HEALTHCHECK_PID": str(worker.proc.pid)})  # the image's HEALTHCHECK
        assert out.returncode == 0 and "pong" in out.stdout, out.stdout + out.stderr
    finally:
        code = worker.terminate()
    assert code == 0, worker.output()[-3000:]


def test_beat_starts_and_stops_on_sigterm(entrypoint, deploy_env, tmp_path):
    beat = Started([entrypoint, "beat"], deploy_env, tmp_path / "beat.log")
    try:
        beat.wait_for(lambda: "beat: ready" in beat.output(), 40, "'beat: ready'")
        assert "Traceback" not in beat.output()
    finally:
        code = beat.terminate()
    assert code == 0, beat.output()[-3000:]
    assert (tmp_path / "celerybeat-schedule").exists() or list(tmp_path.glob("celerybeat-schedule*"))


def test_migrate_and_wait_migrations(entrypoint, deploy_env):
    def run(*args):
        return subprocess.run([entrypoint, *args], env={**deploy_env, "MIGRATE_WAIT_SECONDS": "0"},
                              capture_output=True, text=True, timeout=60)

    pending = run("wait-migrations")  # nothing applied yet: gives up at once (MIGRATE_WAIT_SECONDS=0)
    assert pending.returncode == 1 and "migrations still not applied" in pending.stderr
    assert run("migrate").returncode == 0
    done = run("wait-migrations")
    assert done.returncode == 0 and "database migrated" in done.stderr
