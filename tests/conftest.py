"""Shared fixtures: an owner (privacy officer), an analyst with a grant, an outsider.

Every permission test reads the same: ``officer``, ``analyst``, ``outsider`` users and
``api(user)`` for a REST client authenticated with that user's token.
"""

import io

import pandas as pd
import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


@pytest.fixture(autouse=True)
def _data_dirs(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "data" / "uploads")
    (tmp_path / "data" / "uploads").mkdir(parents=True)
    settings.DATASET_IMPORT_DIRS = [tmp_path / "import"]
    settings.RESULTS_DIR = tmp_path / "results"
    settings.RELEASE_QUANTUM_MS = 0  # no waiting for ticks in-process (tests/workers/test_release_timing.py has them)
    (tmp_path / "import").mkdir()
    return tmp_path


@pytest.fixture
def import_dir(tmp_path):
    return tmp_path / "import"


@pytest.fixture
def officer(django_user_model):
    return django_user_model.objects.create_user("olivia", is_staff=True)


@pytest.fixture
def analyst(django_user_model):
    return django_user_model.objects.create_user("ann")


@pytest.fixture
def analyst2(django_user_model):
    return django_user_model.objects.create_user("bob")


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("oscar")


@pytest.fixture
def auditor(django_user_model):
    from django.contrib.auth.models import Group

    from governance.core import roles

    user = django_user_model.objects.create_user("audrey")
    user.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
    return user


@pytest.fixture
def api():
    def make(user=None):
        client = APIClient()
        if user is not None:
            token, _ = Token.objects.get_or_create(user=user)
            client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client
    return make


def small_frame(n=200, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "patient_id": rng.integers(0, n // 4, n),
        "age": rng.integers(18, 90, n),
        "income": rng.normal(50_000, 10_000, n).round(2),
        "site": rng.choice(["north", "south", "east"], n),
    })


@pytest.fixture
def csv_bytes():
    buf = io.StringIO()
    small_frame().to_csv(buf, index=False)
    return buf.getvalue().encode()


@pytest.fixture
def make_dataset(officer, import_dir):
    """Register a dataset through the action layer: ``make_dataset(name, epsilon=1.0, ...)``."""
    from governance.datasets import registry as datasets

    def make(name="clinic", *, epsilon=1.0, delta="auto", policy="rdp", unit_column="", activate=True,
             frame=None, schema=None):
        path = import_dir / f"{name}.csv"
        (frame if frame is not None else small_frame()).to_csv(path, index=False)
        schema = schema if schema is not None else {"age": {"lower": 18, "upper": 90},
                                                    "income": {"lower": 0, "upper": 200_000}}
        return datasets.register(name=name, created_by=officer, path=str(path), budget_epsilon=epsilon,
                                 budget_delta=delta, policy=policy, unit_column=unit_column,
                                 schema=schema, activate=activate)
    return make


@pytest.fixture
def grant(officer):
    """Give a grant as an officer does (``grants.give``: with its audit record, which
    ``audit verify`` requires on a dataset registered since grants are recorded)."""
    from governance.ledger import grants

    def make(analyst, dataset, cap_epsilon=None, cap_delta=None):
        return grants.give(analyst, dataset, officer, cap_epsilon=cap_epsilon, cap_delta=cap_delta)
    return make


def is_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


@pytest.fixture(autouse=True)
def _no_database_restart(monkeypatch):
    """The test database server's start is no outage to the in-process sweeps: their tests
    judge heartbeats by the clocks they set (tests/requests/test_recovery_clocks.py tests
    the restart's grace period with ``recovery.db_started`` of its own)."""
    from governance.requests import recovery

    monkeypatch.setattr(recovery, "db_started", lambda: None)


@pytest.fixture(autouse=True, scope="session")
def _celery_eager():
    """Tasks run in-process unless a test starts a real worker (tests/workers)."""
    from workers import app

    app.conf.task_always_eager = True
    yield


@pytest.fixture(autouse=True)
def _audit_triggers_and_flush(request):
    """The audit table's append-only triggers (migration 0006) would stop the flush that
    ends a transactional test on SQLite (PostgreSQL flushes with TRUNCATE, which row
    triggers do not see): drop them just before that flush, and make sure they exist when
    each database test starts."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None and not {"db", "transactional_db", "live_server"} & set(request.fixturenames):
        yield
        return
    transactional = bool(marker and marker.kwargs.get("transaction")) or \
        {"transactional_db", "live_server"} & set(request.fixturenames)
    request.getfixturevalue("transactional_db" if transactional else "db")
    from importlib import import_module

    from django.db import connection

    migration = import_module("governance.migrations.0006_audit_append_only")
    if connection.vendor == "sqlite":
        with connection.cursor() as cur:
            for statement in migration.SQLITE:
                cur.execute(statement.replace("CREATE TRIGGER", "CREATE TRIGGER IF NOT EXISTS"))
    yield
    if transactional and connection.vendor == "sqlite":
        with connection.cursor() as cur:
            for statement in migration.SQLITE_REVERSE:
                cur.execute(statement)


# The pure layers (engines, accounting, the federated engine, the distributed engine on its
# Dask cluster, DP-SGD's ranks, the client's own pieces) import no Django, and the settings,
# docs and file checks set their own environment: their tests read no database, so the
# PostgreSQL pass of scripts/test.sh (DB_TESTS_ONLY=1) leaves out those of them that ask
# for none (no django_db mark, no DB_FIXTURES); the SQLite pass ran them already.
PURE_DIRS = ("tests/engines/", "tests/accounting/", "tests/federated/", "tests/distributed/", "tests/dpsgd/",
             "tests/client/", "tests/test_setting_checks.py", "tests/test_settings.py", "tests/test_docs.py",
             "tests/test_import_contracts.py", "tests/hostile/test_parser_fuzz.py",
             "tests/deploy/test_deploy_files.py", "tests/audit/test_pdf_report.py",
             "tests/test_demo.py")  # the demo: its own SQLite database, as scripts/demo.sh runs it
# Tests that read a database but whose subject is not it (the embedded filesystem broker's
# files, a federated run's Flower processes, which queue a real worker takes an engine's
# work from, an engine's output through the API, where its charge is also tested on
# PostgreSQL by the cheaper requests of the same file): the SQLite pass runs them, the
# PostgreSQL pass would repeat their minutes for nothing the database decides.
NOT_ABOUT_THE_DATABASE = (
    "tests/workers/test_federated_run.py",
    "tests/workers/test_embedded_broker_bench.py",
    "tests/workers/test_embedded_broker.py::test_a_real_worker_on_the_embedded_broker_survives_bad_files",
    "tests/workers/test_real_worker.py::test_a_synthetic_table_is_made_on_the_gpu_queue_by_a_real_worker",
    "tests/workers/test_real_worker.py::test_a_model_is_trained_on_the_gpu_queue_by_a_real_worker",
    "tests/requests/test_synthesis_api.py::test_mst_makes_a_table_charged_exactly_as_planned",
    # the Dask cluster's runs through the API (their charges: tests/requests on PostgreSQL),
    # the officer's pages in Chromium (their views: tests/web), the client against a real
    # worker, a pool process out of memory, null parameters (validation), the third-party
    # recomposition tool (it reads an export file): about 430 s the PostgreSQL pass repeated
    "tests/distributed/",
    "tests/browser/",
    "tests/client/test_real_worker.py",
    "tests/workers/test_out_of_memory.py",
    "tests/hostile/test_null_params.py",
    "tests/audit/test_recompose_tool.py",
)
DB_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server", "django_user_model", "client",
               "admin_client", "api", "officer", "analyst", "make_dataset"}


# When scripts/test.sh runs the two passes side by side (PASSES_SIDE_BY_SIDE=1), these
# minutes of tests that read no database run in the PostgreSQL pass instead of the SQLite
# one, so that the two end at about the same time (measured: 2,193 s and 1,601 s before the
# synthesis engine's tests moved, 2,028 s and 2,013 s after).
MOVED_TO_THE_POSTGRES_PASS = ("tests/federated/test_processes.py", "tests/test_demo.py",
                              "tests/engines/test_synthesis_")


def pytest_collection_modifyitems(config, items):
    import os

    side_by_side = os.environ.get("PASSES_SIDE_BY_SIDE") == "1"
    if os.environ.get("DB_TESTS_ONLY") != "1":
        if side_by_side:
            left = [item for item in items if item.nodeid.startswith(MOVED_TO_THE_POSTGRES_PASS)]
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if not item.nodeid.startswith(MOVED_TO_THE_POSTGRES_PASS)]
        return
    kept, left = [], []
    for item in items:
        pure = item.nodeid.startswith(PURE_DIRS) and item.get_closest_marker("django_db") is None \
            and not DB_FIXTURES & set(getattr(item, "fixturenames", ()))
        pure = pure or item.nodeid.startswith(NOT_ABOUT_THE_DATABASE)
        pure = pure and not (side_by_side and item.nodeid.startswith(MOVED_TO_THE_POSTGRES_PASS))
        (left if pure else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
