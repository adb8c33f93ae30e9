"""Logs never hold raw rows or unreleased results: every log record written while a
dataset is registered and requests run (in-process at DEBUG, and a real worker's own log)
is searched for values that only the private rows or the exact answers contain."""

import logging
import re

import pandas as pd
import pytest

from engines import plugins
from governance.models import Request
from tests.requests.conftest import ProbeEngine

from .conftest import wait_for

# Values that occur in the rows only (not in any name, schema or parameter).
CANARY_TEXT = "zq-canary-7f3a"
CANARY_NUMBER = 987654.3125  # one row's income
N_ROWS = 173


def canary_frame() -> pd.DataFrame:
    rows = [{"age": 20 + i % 60, "income": 50_000.0 + i, "site": ["north", "south"][i % 2],
             "note": f"{CANARY_TEXT}-{i}"} for i in range(N_ROWS)]
    rows[7]["income"] = CANARY_NUMBER
    rows[11]["age"] = 117  # the maximum age: the probe engine's failure message quotes it
    return pd.DataFrame(rows)


def exact_answers(frame: pd.DataFrame) -> list[str]:
    """The exact (unreleased) answers of the requests below, as they would be printed."""
    income = frame["income"]
    return [f"{income.sum():.4f}".rstrip("0"), f"{income.mean():.6f}", repr(float(income.sum())),
            repr(float(income.mean())), CANARY_TEXT, repr(CANARY_NUMBER), "117"]


def leaks(text: str, frame: pd.DataFrame) -> list[str]:
    """The answers found in ``text``; a number only as a whole number (``117``, ``117.0``),
    not inside another one or a word (a task's run time ``0.01176 s`` is no leak of the age
    117, nor its id ``ecd71d8e-117b-...``: a CI run failed on that one)."""
    def found(value: str) -> bool:
        if value[:1].isdigit():
            return re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w])", text) is not None
        return value in text

    return [value for value in exact_answers(frame) if found(value)]


SCHEMA = {"age": {"lower": 0, "upper": 200}, "income": {"lower": 0, "upper": 2_000_000},
          "note": {"type": "text"}}  # a free-text column: its values stay in the rows, not the schema
REQUESTS = [("aggregates", "count", {"epsilon": 0.5}),
            ("aggregates", "sum", {"epsilon": 0.5, "column": "income"}),
            ("aggregates", "mean", {"epsilon": 0.5, "column": "income"}),
            ("aggregates", "count", {"epsilon": 0.5, "group_by": "site"})]


@pytest.fixture
def probe():
    engine = ProbeEngine()
    plugins.pm.register(engine, name="probe-engine-logs")
    yield engine
    plugins.pm.unregister(engine)


@pytest.mark.django_db
def test_in_process_logs_at_debug_hold_no_rows_and_no_exact_answers(caplog, api, officer, analyst, make_dataset,
                                                                     grant, probe,
                                                                     django_capture_on_commit_callbacks):
    caplog.set_level(logging.DEBUG)
    for name in ("django", "django.db.backends", "celery", "governance", "engines", "workers"):
        caplog.set_level(logging.DEBUG, logger=name)
    frame = canary_frame()
    ds = make_dataset("ledgerlogs", frame=frame, epsilon=10.0, schema=SCHEMA)
    grant(analyst, ds)
    client = api(analyst)
    for engine, kind, params in REQUESTS + [("probe", "fail", {"epsilon": 0.5})]:
        with django_capture_on_commit_callbacks(execute=True):
            r = client.post("/api/requests/", {"dataset": ds.name, "engine": engine, "kind": kind,
                                               "params": params}, format="json")
        assert r.status_code == 202, r.content
        client.get(f"/api/requests/{r.json()['id']}/")
    assert Request.objects.filter(status="succeeded").count() == len(REQUESTS)
    failed = Request.objects.get(status="failed")
    assert failed.error["code"] == "request.failed_after_read"
    text = "\n".join(f"{rec.name} {rec.getMessage()} {rec.exc_text or ''}" for rec in caplog.records)
    assert "failed after reading data: RuntimeError (message withheld" in text  # the failure is logged
    # SQL at DEBUG holds parameters, but no statement carries the rows: they live in files
    assert not leaks(text, frame), leaks(text, frame)


@pytest.mark.django_db(transaction=True)
def test_a_real_workers_log_holds_no_rows_and_no_exact_answers(real_worker, api, analyst, make_dataset, grant,
                                                                tmp_path):
    frame = canary_frame()
    ds = make_dataset("workerlogs", frame=frame, epsilon=10.0, schema=SCHEMA)
    grant(analyst, ds)
    client = api(analyst)
    ids = []
    for engine, kind, params in REQUESTS:
        r = client.post("/api/requests/", {"dataset": ds.name, "engine": engine, "kind": kind, "params": params},
                        format="json")
        assert r.status_code == 202, r.content
        ids.append(r.json()["id"])
    wait_for(lambda: Request.objects.filter(pk__in=ids, status="succeeded").count() == len(ids), timeout=120)
    text = (tmp_path / "worker.log").read_text()
    assert "succeeded" in text  # the worker did log its tasks
    assert not leaks(text, frame), leaks(text, frame)
