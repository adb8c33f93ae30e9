"""System checks with stable ids: misconfiguration is caught at start-up, not at 3 a.m."""

import math
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs):
    problems = []
    if settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        problems.append(Error(
            "SECRET_KEY is the development default.",
            hint="Set SECRET_KEY or SECRET_KEY_FILE.", id="governance.E001"))
    if settings.DEBUG:
        problems.append(Error("DEBUG is on.", hint="Set DEBUG=false in production.", id="governance.E002"))
    return problems


@register()
def check_configuration(app_configs, **kwargs):
    problems = []
    if not settings.DEBUG and settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        problems.append(Error(
            "DEBUG is off but SECRET_KEY is the development default.",
            hint="Set SECRET_KEY or SECRET_KEY_FILE.", id="governance.E003"))
    if not settings.DEBUG and not settings.ALLOWED_HOSTS:
        problems.append(Error("ALLOWED_HOSTS is empty with DEBUG off.", id="governance.E004"))
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
        problems.append(Error(
            f"Database engine {engine} is not supported.",
            hint="Use PostgreSQL (DATABASE_URL=postgres://...) or the embedded SQLite default.",
            id="governance.E005"))
    if not settings.DEBUG and engine == "django.db.backends.sqlite3":
        problems.append(Warning(
            "SQLite in production serialises every admission; use PostgreSQL for many analysts.",
            id="governance.W001"))
    if settings.MAX_UPLOAD_BYTES <= 0 or not math.isfinite(settings.MAX_UPLOAD_BYTES):
        problems.append(Error("MAX_UPLOAD_BYTES must be positive.", id="governance.E006"))
    return problems


# ------------------------------------------------------------------ every setting's value
# README "Configuration": each setting that can be malformed is refused here, at start-up
# (`manage.py check`, which `deploy/entrypoint.sh web` runs before gunicorn), with the
# setting's name, rather than as a 500 on the first request that reads it. The environment
# readers in governance.core.env already refuse what is not a boolean or an integer.

RATE_RE = re.compile(r"^([1-9][0-9]*)/(s|sec|second|m|min|minute|h|hour|d|day)$")
DASK_PROTOCOLS = ("tcp", "tls", "inproc", "ucx", "ws", "wss")
POSITIVE = {  # setting: (smallest value, what it is)
    "API_TOKEN_TTL_DAYS": (0, "days a token lives (0: never expires)"),
    "DASK_TASK_RETRIES": (0, "retries of a failed cluster task"),
    "CELERY_DB_REUSE_MAX": (1, "tasks before a worker reopens its database connection"),
    "SECURE_HSTS_SECONDS": (0, "seconds of HSTS (0: off)"),
    "REQUEST_REQUEUE_AFTER_SECONDS": (1, "seconds before a queued request's task is sent again"),
    "RELEASE_QUANTUM_MS": (0, "milliseconds between release ticks (0: off)"),
    "REGISTER_INLINE_BYTES": (0, "bytes of a table read on the request thread (larger: by a worker)"),
    "FEDERATED_WAIT_SITES_SECONDS": (1, "seconds a federated run waits for its sites to connect"),
    "FEDERATED_ROUND_TIMEOUT_SECONDS": (1, "seconds a federated round waits for a sampled site's reply"),
    "WORKER_MAX_MEMORY_MB": (0, "MB a pool process may hold after a task before it is replaced (0: off)"),
    "MAX_ACTIVE_REQUESTS": (0, "requests one analyst may have queued or running (0: no limit)"),
    "MAX_REQUEST_PARAMS_BYTES": (1, "bytes of a request's parameters"),
    "RESULTS_MIN_FREE_MB": (0, "MB free on the results disk for a run to start"),
    "OUTCOME_RETRY_SECONDS": (0, "seconds a run's outcome is written again while the database is away"),
    "WAITS_PER_ANALYST": (0, "?wait= calls one analyst may hold in one web process at once (0: no limit)"),
}
POSITIVE_IDS = {"API_TOKEN_TTL_DAYS": "governance.E008",
                "DASK_TASK_RETRIES": "governance.E015", "CELERY_DB_REUSE_MAX": "governance.E017",
                "SECURE_HSTS_SECONDS": "governance.E023", "REQUEST_REQUEUE_AFTER_SECONDS": "governance.E021",
                "RELEASE_QUANTUM_MS": "governance.E022", "REGISTER_INLINE_BYTES": "governance.E030",
                "FEDERATED_WAIT_SITES_SECONDS": "governance.E034", "FEDERATED_ROUND_TIMEOUT_SECONDS": "governance.E034",
                "WORKER_MAX_MEMORY_MB": "governance.E035", "MAX_ACTIVE_REQUESTS": "governance.E036",
                "MAX_REQUEST_PARAMS_BYTES": "governance.E036", "RESULTS_MIN_FREE_MB": "governance.E036",
                "OUTCOME_RETRY_SECONDS": "governance.E036", "WAITS_PER_ANALYST": "governance.E036"}


def rate_problem(rate) -> str | None:
    """Why REQUEST_RATE_LIMIT cannot be used, or None (empty: no limit). Accepts exactly
    what DRF's throttle parses: ``N/period`` with a positive N and a period it knows."""
    if rate in (None, ""):
        return None
    if not isinstance(rate, str) or not RATE_RE.match(rate):
        return (f"REQUEST_RATE_LIMIT={rate!r} is not N/period (N a positive integer, period one of "
                "sec, min, hour, day; e.g. 600/min), nor empty for no limit.")
    return None


@register()
def check_settings(app_configs, **kwargs):
    s = settings
    problems = []

    def error(msg, id, hint=None):
        problems.append(Error(msg, hint=hint, id=id))

    if problem := rate_problem(getattr(s, "REQUEST_RATE_LIMIT", "")):
        error(problem, "governance.E007", "Every POST /api/requests/ would fail with it.")
    for name, (low, meaning) in POSITIVE.items():
        value = getattr(s, name, low)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            error(f"{name}={value!r} must be an integer >= {low} ({meaning}).", POSITIVE_IDS[name])
    age = s.DATABASES["default"].get("CONN_MAX_AGE")
    if age is not None and (not isinstance(age, int) or age < 0):
        error(f"DB_CONN_MAX_AGE={age!r} must be an integer >= 0 (seconds a connection is reused; 0: one per "
              "request).", "governance.E009")
    options = s.DATABASES["default"].get("OPTIONS", {})
    threshold = options.get("prepare_threshold")
    if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
        error(f"DB_PREPARE_THRESHOLD={threshold!r} must be an integer >= 0, or off.", "governance.E010")

    for name in ("VAR_DIR", "DATA_DIR", "RESULTS_DIR"):
        path = Path(getattr(s, name))
        label = "GOVERNANCE_VAR_DIR" if name == "VAR_DIR" else name
        if path.exists() and not path.is_dir():
            error(f"{label}={str(path)!r} exists and is not a directory.", "governance.E011")
        elif not path.is_absolute():
            problems.append(Warning(f"{label}={str(path)!r} is relative: each process resolves it from its own "
                                    "working directory.", hint="Give an absolute path.", id="governance.W002"))
    for path in s.DATASET_IMPORT_DIRS:
        path = Path(path)
        if path.exists() and not path.is_dir():
            error(f"DATASET_IMPORT_DIRS: {str(path)!r} exists and is not a directory.", "governance.E012")
        elif not path.is_absolute():
            error(f"DATASET_IMPORT_DIRS: {str(path)!r} is not an absolute path.", "governance.E012")
    for uri in s.DATASET_IMPORT_URIS:
        parts = urlsplit(uri)
        if not parts.scheme or parts.scheme == "file" or not parts.netloc or "://" not in uri:
            error(f"DATASET_IMPORT_URIS: {uri!r} is not an object-store prefix (scheme://bucket/path/, "
                  "e.g. s3://bucket/tables/).", "governance.E013",
                  "Server directories go in DATASET_IMPORT_DIRS.")
    if problem := dask_address_problem(getattr(s, "DASK_SCHEDULER_ADDRESS", "")):
        error(problem, "governance.E014")
    if problem := superlink_problem(getattr(s, "FEDERATED_SUPERLINK", "")):
        error(problem, "governance.E032", "Federated runs would fail before reaching a site (refunded).")
    ca = getattr(s, "FEDERATED_ROOT_CERTIFICATES", "")
    if ca and not (Path(ca).is_absolute() and Path(ca).is_file()):
        error(f"FEDERATED_ROOT_CERTIFICATES={ca!r} is not an absolute path of a file (the CA bundle of the "
              "SuperLink's TLS certificate; empty: plain HTTP).", "governance.E033")

    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        url = getattr(s, name, None)
        if url and (problem := url_problem(url, name, broker=name == "CELERY_BROKER_URL")):
            error(problem, "governance.E016")

    soft, hard = s.CELERY_TASK_SOFT_TIME_LIMIT, s.CELERY_TASK_TIME_LIMIT
    if not (isinstance(soft, int) and isinstance(hard, int) and 0 < soft < hard):
        error(f"CELERY_TASK_SOFT_TIME_LIMIT={soft!r} and CELERY_TASK_TIME_LIMIT={hard!r}: both must be positive "
              "and the soft limit below the hard one (the soft limit lets a task record its failure).",
              "governance.E018")
    else:
        from engines.synthesis.planner import AIM_ROUNDS_SECONDS

        if soft < 2 * AIM_ROUNDS_SECONDS:  # the rounds, then their last round, the fit and the files
            problems.append(Warning(
                f"CELERY_TASK_SOFT_TIME_LIMIT={soft} s is under twice AIM's rounds allowance ({AIM_ROUNDS_SECONDS} s, "
                "after which it ends its rounds and fits): an AIM synthesis of a wide table can reach the limit "
                "after the read, charged with nothing released.",
                hint=f"Give the workers at least {2 * AIM_ROUNDS_SECONDS} s, or have analysts ask for MST.",
                id="governance.W003"))
    visibility = (getattr(s, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}).get("visibility_timeout")
    if visibility is not None and isinstance(hard, int) and (not isinstance(visibility, int) or visibility <= hard):
        error(f"CELERY_VISIBILITY_TIMEOUT={visibility!r} must exceed CELERY_TASK_TIME_LIMIT={hard!r}: Redis "
              "would deliver a running task again.", "governance.E019")

    beat, lost = s.REQUEST_HEARTBEAT_SECONDS, s.REQUEST_LOST_AFTER_SECONDS
    if not (isinstance(beat, int) and isinstance(lost, int) and 0 < beat < lost):
        error(f"REQUEST_HEARTBEAT_SECONDS={beat!r} and REQUEST_LOST_AFTER_SECONDS={lost!r}: the heartbeat must be "
              "positive and shorter than the grace period, or running requests are declared lost.",
              "governance.E020")
    quantum = s.RELEASE_QUANTUM_MS
    if isinstance(quantum, int) and isinstance(lost, int) and quantum > 0 and quantum >= lost * 1000:
        error(f"RELEASE_QUANTUM_MS={quantum} is not shorter than REQUEST_LOST_AFTER_SECONDS={lost}: a run's "
              "heartbeat is written on its ticks, so every run would be declared lost.", "governance.E022")

    every, alive = s.WORKER_HEARTBEAT_SECONDS, s.WORKER_ALIVE_SECONDS
    if not (isinstance(every, int) and isinstance(alive, int) and 0 < every < alive):
        error(f"WORKER_HEARTBEAT_SECONDS={every!r} and WORKER_ALIVE_SECONDS={alive!r}: both positive and the "
              "heartbeat shorter than the time a worker counts as alive, or every worker would be shown dead.",
              "governance.E031")

    for name in ("PRIVACY_ENGINES_DISABLE_ENTRYPOINTS",):
        raw = os.environ.get(name, "")
        if raw not in ("", "0", "1", "true", "false"):
            error(f"{name}={raw!r} is not one of 1, true, 0, false (engines/plugins.py reads 1 and true only).",
                  "governance.E024")
    return problems


def dask_address_problem(address) -> str | None:
    """Why DASK_SCHEDULER_ADDRESS cannot be a scheduler's address, or None (empty: no cluster)."""
    if not address:
        return None
    if not isinstance(address, str):
        return f"DASK_SCHEDULER_ADDRESS={address!r} is not an address."
    protocol, sep, rest = address.partition("://")
    if not sep:
        protocol, rest = "tcp", address
    if protocol not in DASK_PROTOCOLS:
        return (f"DASK_SCHEDULER_ADDRESS={address!r}: unknown protocol {protocol!r} "
                f"(one of {', '.join(DASK_PROTOCOLS)}; e.g. tcp://scheduler:8786).")
    if protocol == "inproc":
        return None
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or not parts.hostname or port is None or parts.path not in ("", "/"):
        return f"DASK_SCHEDULER_ADDRESS={address!r} is not protocol://host:port (e.g. tcp://scheduler:8786)."
    return None


def superlink_problem(address) -> str | None:
    """Why FEDERATED_SUPERLINK cannot be a SuperLink's address, or None (empty: no federated
    runs). Flower takes host:port, no scheme."""
    if not address:
        return None
    if not isinstance(address, str) or "://" in address:
        return f"FEDERATED_SUPERLINK={address!r} is not host:port (no scheme; e.g. superlink:9093)."
    try:
        parts = urlsplit(f"//{address}")
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or not parts.hostname or port is None or parts.path or parts.query or parts.username:
        return f"FEDERATED_SUPERLINK={address!r} is not host:port (e.g. superlink:9093 or 127.0.0.1:9093)."
    return None


def url_problem(url: str, name: str, *, broker: bool) -> str | None:
    """Why a Redis (or, for the broker, any kombu transport's) URL cannot be used, or None.
    The message names the scheme and host only, never a password."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return f"{name} is not a URL (redis://host:6379/0)."
    scheme = parts.scheme.lower()
    if broker:
        from kombu.transport import resolve_transport

        try:
            resolve_transport(scheme.split("+")[0] or "-")
        except (KeyError, ValueError, ImportError):
            return f"{name}: {scheme or '(no scheme)'!r} is not a broker transport (redis://host:6379/0)."
        return None
    if scheme not in ("redis", "rediss", "unix"):
        return f"{name}: scheme {scheme or '(none)'!r} is not redis://, rediss:// or unix:// (redis://host:6379/0)."
    if scheme != "unix" and not parts.hostname:
        return f"{name} names no host (redis://host:6379/0)."
    return None
