"""Settings, read from the environment (see README, "Configuration").

The embedded default needs nothing: SQLite under ./var, DEBUG on, a development secret.
Production sets DATABASE_URL (PostgreSQL), SECRET_KEY (or SECRET_KEY_FILE), DEBUG=false
and ALLOWED_HOSTS; the system checks in ``governance.core.checks`` refuse unsafe mixes.
"""

import os
import sys
from pathlib import Path

import dj_database_url

from django.core.exceptions import ImproperlyConfigured

from .core.env import envbool, envint, envlist, envsecret, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("GOVERNANCE_VAR_DIR", str(BASE_DIR / "var")))

DEV_SECRET_KEY = "dev-insecure-secret-key-do-not-use-in-production"
SECRET_KEY = envsecret("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = envbool("DEBUG", True)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,testserver")

INSTALLED_APPS = [
    "governance.apps.GovernanceAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # before rest_framework and authtoken: their generateschema and drf_create_token are replaced
    "governance.shell_commands",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    # Swagger UI's files as our own static files: /api/docs/ works offline, under the CSP
    "drf_spectacular_sidecar",
    "governance",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # static files (the admin's CSS) served by the app itself when DEBUG is off
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # /api/requests served as /api/requests/ (a POST never redirected), JSON 404s under DEBUG
    "governance.api.paths.ApiPaths",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "governance.core.security.SecurityHeaders",
    "governance.core.security.NeutralBidi",
    "governance.core.security.StorageFull",
    "governance.core.security.BadQuery",
]

ROOT_URLCONF = "governance.urls"
WSGI_APPLICATION = "governance.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = envsecret("DATABASE_URL", f"sqlite:///{VAR_DIR / 'governance.sqlite3'}")
# Persistent connections: a new PostgreSQL connection per HTTP request or task cost ~35 ms
# of CPU per DP request in bench/bench_requests.py; health checks drop broken ones. Not under
# `manage.py runserver`, which starts a thread per client connection: each thread's
# connection stayed open after it ended, until the collector ran (a probe's runserver held
# 480 file descriptors and 850 MB after 2,000 calls on new connections; flat at 0).
_RUNSERVER = len(sys.argv) > 1 and sys.argv[1] == "runserver"
try:
    DATABASES = {"default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", 0 if _RUNSERVER else 60), conn_health_checks=True)}
except ValueError as _e:  # an unknown scheme, a port that is not a number (no password in the message)
    raise ImproperlyConfigured(f"DATABASE_URL is not a database URL (postgres://user@host:5432/db or "
                               f"sqlite:///path): {type(_e).__name__}, scheme {DATABASE_URL.partition(':')[0]!r}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # BEGIN IMMEDIATE takes SQLite's write lock when a transaction starts, so the gate's
        # read-check-write cannot interleave with another writer (SQLite ignores
        # SELECT ... FOR UPDATE); waiting writers queue for up to `timeout` seconds.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        # FULL: a commit is on disk before the answer it admits or releases leaves (NORMAL, in
        # WAL mode, can lose the last commits to a power loss: a release answered, its charge
        # gone from the ledger). About 0.25 ms per commit here (bench/README.md, admission).
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
    }
    # Tests run threads against the database: a file, not a shared in-memory cache; one per
    # test process so that parallel test runs never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-governance-{os.getpid()}.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Prepared statements on the persistent connections: parameters bound by the server
    # (psycopg's Cursor, not Django's default ClientCursor, which quotes every value in
    # Python) and a statement prepared once run DB_PREPARE_THRESHOLD times on a connection,
    # so PostgreSQL parses and plans it once. bench/bench_request_path.py: the backend's
    # CPU per DP request 5.2 -> 2.9 ms, the request's wall time in one process 23.2 -> 19.5 ms.
    # Behind a pooler in transaction mode without prepared-statement support (PgBouncer
    # < 1.21) set DB_PREPARE_THRESHOLD=off. A migration that changes a table's columns
    # while old processes run fails their prepared statements on it ("cached plan must not
    # change result type") until they reconnect or are replaced (deploy/: new pods wait for
    # the migrate job; old ones still running meanwhile can see this error).
    _prepare_off = envstr("DB_PREPARE_THRESHOLD", "").strip().lower() == "off"
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "server_side_binding": envbool("DB_SERVER_SIDE_BINDING", True),
        "prepare_threshold": None if _prepare_off else envint("DB_PREPARE_THRESHOLD", 5),
    })

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# Behind TLS (production): cookies only over HTTPS, HSTS and the HTTPS redirect when asked.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = envbool("SECURE_COOKIES", not DEBUG)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
X_FRAME_OPTIONS = "DENY"

# API tokens expire this many days after they are issued (0: never); new requests per
# analyst are limited to REQUEST_RATE_LIMIT ("N/sec|min|hour|day"; empty: no limit),
# counted in the cache: Redis when REDIS_URL is set (shared by every web process), else
# this process's memory.
API_TOKEN_TTL_DAYS = envint("API_TOKEN_TTL_DAYS", 90)
REQUEST_RATE_LIMIT = envstr("REQUEST_RATE_LIMIT", "600/min")
# Requests one analyst may have queued or running at once (0: no limit): past it a new
# request is a 429 until one ends. It bounds one analyst's backlog; analysts take turns on
# each queue (governance.requests.turns), so another's request does not wait behind it (a
# probe's count waited 218 s behind 100 grouped quantiles when the queue was first in,
# first out).
MAX_ACTIVE_REQUESTS = envint("MAX_ACTIVE_REQUESTS", 100)
# ?wait= calls one analyst may hold at once in one web process (0: no limit); past it a
# call answers at once with the request as it is. Each wait holds a web thread: a probe's
# four waits of one analyst held all four threads, and another's GET /api/me/ took 28 s.
WAITS_PER_ANALYST = envint("WAITS_PER_ANALYST", 2)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Where registered tables are stored, and the server directories a privacy officer may
# register a table from by path (anything outside them is refused).
DATA_DIR = Path(envstr("DATA_DIR", str(VAR_DIR / "data")))
# Files a request releases (trained models, synthetic tables, plots), one directory per request.
RESULTS_DIR = Path(envstr("RESULTS_DIR", str(VAR_DIR / "results")))
# a run starts only with this much free on the results disk (else failed before the read, refunded)
RESULTS_MIN_FREE_MB = envint("RESULTS_MIN_FREE_MB", 64)
DATASET_IMPORT_DIRS = [Path(p) for p in envlist("DATASET_IMPORT_DIRS", str(DATA_DIR / "import"))]
MAX_UPLOAD_BYTES = envint("MAX_UPLOAD_BYTES", 2 * 1024**3)
# A stored table larger than this is read by a worker, not on the request thread (about a
# CPU second per 50 MB here): the dataset is "pending" until then (governance.datasets.registry).
REGISTER_INLINE_BYTES = envint("REGISTER_INLINE_BYTES", 32 * 1024**2)
# A request's parameters are kept in its row and in its audit record for good, a refusal's
# and a replay's too (no charge): a larger one is a 400 before anything is planned.
MAX_REQUEST_PARAMS_BYTES = envint("MAX_REQUEST_PARAMS_BYTES", 64 * 1024)
# Distributed datasets (execution "distributed", engines/distributed): Parquet partitions
# registered where they are (not copied), under DATASET_IMPORT_DIRS or an object-store
# prefix listed in DATASET_IMPORT_URIS ("s3://bucket/tables/", read by pyarrow's filesystems
# with the worker's own credentials); runs go to the Dask scheduler at DASK_SCHEDULER_ADDRESS
# (empty: threads in the worker process, no cluster), a failed cluster task retried
# DASK_TASK_RETRIES times (tasks are pure; the noise is drawn once, by the Celery worker).
DATASET_IMPORT_URIS = envlist("DATASET_IMPORT_URIS", "")
DASK_SCHEDULER_ADDRESS = envstr("DASK_SCHEDULER_ADDRESS", "")
DASK_TASK_RETRIES = envint("DASK_TASK_RETRIES", 2)
# Federated datasets (execution "federated", engines/federated): the rows stay at the sites;
# runs go to the Flower SuperLink at FEDERATED_SUPERLINK (host:port; the worker must run on
# its host: the ServerApp reads the job directory the worker writes). TLS to it with the CA
# bundle FEDERATED_ROOT_CERTIFICATES (empty: plain HTTP, a trusted network only). A run waits
# FEDERATED_WAIT_SITES_SECONDS for the registered sites to connect, and drops a sampled site
# that has not replied within FEDERATED_ROUND_TIMEOUT_SECONDS.
FEDERATED_SUPERLINK = envstr("FEDERATED_SUPERLINK", "")
FEDERATED_ROOT_CERTIFICATES = envstr("FEDERATED_ROOT_CERTIFICATES", "")
FEDERATED_WAIT_SITES_SECONDS = envint("FEDERATED_WAIT_SITES_SECONDS", 60)
FEDERATED_ROUND_TIMEOUT_SECONDS = envint("FEDERATED_ROUND_TIMEOUT_SECONDS", 120)
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024**2
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024**2
# A larger upload is spooled to a file while it is read: beside the registered copies (0700),
# where the recovery sweep removes one a killed web process left (TMPDIR kept its rows for good)
FILE_UPLOAD_TEMP_DIR = str(DATA_DIR / "uploads")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "governance.core.security.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's parsers with limits on nesting, NUL, lone surrogates and upload size (parsers.py)
    "DEFAULT_PARSER_CLASSES": [
        "governance.api.parsers.JSONParser",
        "governance.api.parsers.FormParser",
        "governance.api.parsers.MultiPartParser",
    ],
    # DRF's renderers; JSON with non-finite numbers written as strings, never a 500 (renderers.py)
    "DEFAULT_RENDERER_CLASSES": [
        "governance.api.renderers.SafeJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "governance.api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": [
        "governance.api.filtering.StrictFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "EXCEPTION_HANDLER": "governance.api.errors.exception_handler",
    "PAGE_SIZE": 50,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Privacy-budget governance API",
    "DESCRIPTION": (
        "Datasets, grants, the privacy ledger and its gate. Every charge is a mechanism "
        "event composed under basic, advanced and Rényi accounting; see the README."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ from our own static files (drf-spectacular-sidecar), never a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # no badge fetched from validator.swagger.io (another origin: the CSP refuses it)
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "COMPONENT_SPLIT_REQUEST": True,
    # every operation's error answers, {"code", "detail", ...} (governance/api/openapi.py)
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "governance.api.openapi.add_error_responses"],
    # Three models have a `status`: name each enum after its model.
    "ENUM_NAME_OVERRIDES": {
        "LedgerStatusEnum": "governance.models.LedgerEntry.Status",
        "RequestStatusEnum": "governance.models.Request.Status",
        "DatasetExecutionEnum": "governance.models.Dataset.Execution",
    },
}

# ---------------------------------------------------------------------------- Celery
# Production: Redis (REDIS_URL). Embedded default: a filesystem transport, which needs no
# server -- producers and a real worker process exchange messages as files in var/broker.
# filesystem:// is workers.broker's transport (registered by workers.celery), not kombu's
# own: kombu's wrote a file under its final name and filled it afterwards, so a polling
# worker could read it half-written and die ("Unrecoverable error: JSONDecodeError", exit 0).
# Ours writes to a name no reader matches, fsyncs and renames; a file that cannot be parsed
# is moved to var/broker/bad/ and logged, and the worker goes on.
REDIS_URL = envsecret("REDIS_URL")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "KEY_PREFIX": "governance"}} if REDIS_URL else \
    {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_BROKER_URL = envsecret("CELERY_BROKER_URL") or REDIS_URL or "filesystem://localhost/"
BROKER_DIR = VAR_DIR / "broker"
EMBEDDED_BROKER = CELERY_BROKER_URL.startswith("filesystem://")
if EMBEDDED_BROKER:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR),
        "data_folder_out": str(BROKER_DIR),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.05,  # seconds: a DP count should not wait a whole second
        "fsync": envbool("BROKER_FSYNC", True),  # each message on disk before it is visible
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis re-delivers a message not acknowledged within this time. With acks_late a
        # task is acknowledged when it ends, so this must exceed the longest task (the hard
        # time limit below), or a long training run would be delivered twice while running.
        "visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 4 * 3600),
    }
# Acknowledge after the task ran: a worker that dies mid-task leaves the message to be
# delivered again (the claim in governance.requests.execution makes the second delivery harmless).
CELERY_TASK_ACKS_LATE = True
# One message at a time per worker process: training runs are long, and a prefetched
# message would wait behind one while another worker sits idle.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# `--pool prefork` is Celery's prefork pool with locks a killed pool process cannot keep
# (workers/pool.py: on the embedded broker an idle process killed held the task pipe's lock,
# and the worker wedged for good); on Redis it is Celery's own.
CELERY_WORKER_POOL = "workers.pool:TaskPool"
# Celery's Django fix-up closes the database connections before and after every task unless
# this is set: a new PostgreSQL connection per request (bench_request_path: the server's CPU
# for it, ~8 ms, was most of PostgreSQL's share of a DP count). The fix-up now closes them
# every CELERY_DB_REUSE_MAX tasks; before each task workers.tasks applies Django's own rules
# (CONN_MAX_AGE, health checks, a connection broken by an error), as for a web request.
CELERY_DB_REUSE_MAX = envint("CELERY_DB_REUSE_MAX", 1000)
# A prefork pool process left holding more than this after a task is replaced by a fresh one
# (Celery's worker_max_memory_per_child, in KiB): a guard against memory a run failed to give
# back (a DP-SGD leak once left idle pool processes at 9-11 GB); 0: off. Solo and threads
# pools ignore it.
WORKER_MAX_MEMORY_MB = envint("WORKER_MAX_MEMORY_MB", 4096)
CELERY_WORKER_MAX_MEMORY_PER_CHILD = WORKER_MAX_MEMORY_MB * 1024 if WORKER_MAX_MEMORY_MB > 0 else None
# Soft limit raises inside the task so it can record a failure (the charge stands once data
# was read); the hard limit kills a task that ignores it. DP-SGD runs need hours, not days.
CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", 3 * 3600)
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 3 * 3600 + 300)
# Recovery (governance/requests/recovery.py): a running request's worker writes a heartbeat every
# REQUEST_HEARTBEAT_SECONDS; one silent for REQUEST_LOST_AFTER_SECONDS is declared lost by
# the sweep (the periodic task workers.sweep, or manage.py recover). A queued request not
# picked up within REQUEST_REQUEUE_AFTER_SECONDS (60 s) has its task sent again if the
# broker holds no message of it: on the embedded broker no file in var/broker (a message is
# a file or in a worker's memory, gone if the worker died); on Redis none in its queues or
# its unacknowledged hash (a message taken by a dead worker waits there for the visibility
# timeout, after which Redis delivers it again). A message Redis lost (restarted without its
# append-only file) or never got (the web process killed between its commit and its publish)
# is re-sent within about two minutes; before, the Redis default was 6 h with no look.
REQUEST_HEARTBEAT_SECONDS = envint("REQUEST_HEARTBEAT_SECONDS", 15)
REQUEST_LOST_AFTER_SECONDS = envint("REQUEST_LOST_AFTER_SECONDS", 120)
# A finished run's outcome whose write finds the database away (locked past its timeout,
# restarting, unreachable) is written again every few seconds for this long, its result kept
# in the worker's memory; then the sweep finishes the request as lost.
OUTCOME_RETRY_SECONDS = envint("OUTCOME_RETRY_SECONDS", 3600)
REQUEST_REQUEUE_AFTER_SECONDS = envint("REQUEST_REQUEUE_AFTER_SECONDS", 60)
# Worker liveness (governance/core/liveness.py): each worker writes a record every
# WORKER_HEARTBEAT_SECONDS (Redis with REDIS_URL, else files in var/workers); it counts as
# alive while the record is younger than WORKER_ALIVE_SECONDS. `manage.py workers` and the
# officer's dashboard read them.
WORKER_HEARTBEAT_SECONDS = envint("WORKER_HEARTBEAT_SECONDS", 10)
WORKER_ALIVE_SECONDS = envint("WORKER_ALIVE_SECONDS", 3 * WORKER_HEARTBEAT_SECONDS)
# A worker's embedded beat (the recovery sweep's clock) stopped (SIGSTOP) this long is
# killed and started again (workers/tasks.py BeatWatch), as one that died is.
EMBEDDED_BEAT_STOPPED_SECONDS = envint("EMBEDDED_BEAT_STOPPED_SECONDS", 60)
# Release-path side channels (governance/requests/execution.py RunClock; README): what an analyst
# sees of a run that reads data (progress, the outcome) changes only on ticks this many
# milliseconds apart from the claim, never when a sampler or query happens to finish.
RELEASE_QUANTUM_MS = envint("RELEASE_QUANTUM_MS", 1000)
# No "expires": Celery dates it on beat's clock and a worker judges it on its own, so a beat
# a minute behind the workers had every sweep discarded as expired (a probe). A backlog of
# sweeps is harmless: each is a set of compare-and-sets. The sweep has a queue of its own,
# which every `manage.py worker` consumes beside its own: on the cpu queue it waited behind
# every request queued before it (a probe's lost request stayed "running", its reservation
# held, 8 minutes past its deadline behind 500 queued ones).
SWEEP_QUEUE = "sweep"
# Expired web sessions are deleted once an hour (Django keeps a row per sign-in until
# `clearsessions` runs: a probe's table grew by one row per sign-in, for good).
CELERY_BEAT_SCHEDULE = {"sweep-lost-requests": {"task": "workers.sweep", "schedule": 60.0,
                                                "options": {"queue": SWEEP_QUEUE}},
                        "clear-expired-sessions": {"task": "workers.clear_sessions", "schedule": 3600.0,
                                                   "options": {"queue": SWEEP_QUEUE}}}
# Results live in the database (Request rows), not in a Celery result backend.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "cpu"
# Tests run tasks in-process (CELERY_TASK_ALWAYS_EAGER=true) unless they start a real worker.
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

LOG_LEVEL = envstr("LOG_LEVEL", "WARNING").strip().upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    # Django configures logging before the system checks run: a bad level would be a traceback
    raise ImproperlyConfigured(f"LOG_LEVEL={LOG_LEVEL!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # 4xx answers are the API working as designed (a refused request is a 409): log 5xx only.
    "loggers": {"django.request": {"level": "ERROR"},
                # a request for another host name is answered 400; no traceback per probe
                "django.security.DisallowedHost": {"handlers": [], "propagate": False}},
}
