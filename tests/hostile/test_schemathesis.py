"""Schemathesis against the app's own OpenAPI schema (``/api/schema/``), in-process.

Every operation of the schema (GET, POST, PATCH, DELETE) is fuzzed through the WSGI
application with schema-valid and schema-violating data, as a privacy officer, as an
analyst with a grant, as an analyst without one and anonymously, against a real
registered dataset (path parameters are often replaced by the real dataset's name, a real
grant, ledger entry, request, analyst and audit record, so the handlers past the 404 are
reached). Each role (analyst, officer, auditor, and an outsider or anonymous caller) is
fuzzed on its own. Checks after every case: no 5xx (``not_a_server_error``); where the
schema documents the status code, the body conforms to it (``response_schema_conformance``);
a refused case (4xx) left the ledger as it was; ``audit verify`` passes. DEBUG is off
(pytest-django's default), as in production.

Settings (the same switch for every module in tests/hostile/):

- default (CI): ``CI_EXAMPLES`` (4) cases per operation and role, derandomized (the same
  cases every run).
- ``HOSTILE_FULL=1``: ``FULL_EXAMPLES`` (150) random cases per operation and role, over
  5,000 for each role. ``HOSTILE_FULL=1 pytest tests/hostile`` runs every hostile test in its
  full setting; ``HOSTILE_STATS=FILE`` writes one line per case (operation, role, status,
  engine, start of the body) to see what the fuzzing reached.

The schema is loaded at import through the WSGI app (an anonymous GET of /api/schema/,
which touches no database). Requests go through the WSGI app too (werkzeug's client), in
the test's database transaction.

``POST /api/requests/`` runs the aggregates engine in-process (Celery eager, the on-commit
callbacks executed). DP-SGD and synthesis requests are planned, gated and queued like any
other, but their training is not run here: a fuzzed training request may legitimately
take minutes (tests/requests covers their runs).
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest
import schemathesis
from hypothesis import assume
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from governance.wsgi import application

from .conftest import fuzz_settings
from .strategies import plausible_events, plausible_params

CI_EXAMPLES = 4
FULL_EXAMPLES = 150
RUN_ENGINES = {"aggregates"}  # engines whose queued requests are executed in-process here
STATS = os.environ.get("HOSTILE_STATS")  # a file: one line per case (operation, role, status), to see coverage

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)

# Each role fuzzed on its own (CI_EXAMPLES / FULL_EXAMPLES cases per operation each); an
# outsider (an analyst without a grant) and an anonymous caller share the fourth.
ROLES = {"analyst": ("analyst",), "officer": ("officer",), "auditor": ("auditor",),
         "stranger": ("outsider", "anonymous")}
API_NUMERIC, API_CATEGORICAL = ["age", "income"], ["site"]  # the registered dataset's queryable columns


@contextlib.contextmanager
def keep_connection():
    """Django's WSGI handler closes the database connection at the start and end of each
    request (``close_old_connections``); inside a test transaction that would close the test
    database. Django's own test client disconnects it the same way, around each request
    (and connects it again after, so this is done around each call too)."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(officer, analyst, outsider, make_dataset, grant, api, no_rate_limit, django_capture_on_commit_callbacks,
          django_user_model):
    """A real dataset with a grant, a finished request, ledger entries and audit records."""
    from governance.models import AuditRecord, LedgerEntry, Request

    ds = make_dataset("clinic", epsilon=1000.0, unit_column="patient_id")
    g = grant(analyst, ds)
    with django_capture_on_commit_callbacks(execute=True):
        r = api(analyst).post("/api/requests/", {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                                 "params": {"epsilon": 0.1, "group_by": "site"}}, format="json")
    assert r.status_code == 202, r.content
    req = Request.objects.get(pk=r.json()["id"])
    assert req.status == Request.Status.SUCCEEDED, req.error
    api(officer).post("/api/datasets/clinic/charges/", {"event": {"kind": "laplace", "epsilon": 0.1}}, format="json")
    return {
        "users": {"officer": officer, "analyst": analyst, "outsider": outsider, "auditor": _auditor(django_user_model)},
        "dataset": ds, "grant": g, "ids": {
            "grants": g.pk, "ledger": LedgerEntry.objects.first().pk, "requests": str(req.pk),
            "analysts": analyst.pk, "audit": AuditRecord.objects.first().pk},
    }


def _auditor(user_model):
    from django.contrib.auth.models import Group

    from governance.core.roles import AUDITORS_GROUP

    user = user_model.objects.create_user("audrey")
    user.groups.add(Group.objects.get_or_create(name=AUDITORS_GROUP)[0])
    return user


def _headers(world, role: str) -> dict:
    if role == "anonymous":
        return {}
    user = world["users"][role]
    # A fuzzed POST/DELETE .../token/ may have rotated or revoked the token: fetch it each time.
    token, _ = Token.objects.get_or_create(user=user)
    return {"Authorization": f"Token {token.key}"}


def _restore(world):
    """Undo what earlier cases may have changed that would stop later ones reaching the handlers
    (a revoked grant given again as an officer gives it: with its record in the chain, which
    ``audit verify`` checks the grant against)."""
    from governance.ledger import grants
    from governance.models import Dataset, Grant

    g = Grant.objects.get(pk=world["grant"].pk)
    if not g.active:
        grants.give(g.analyst, g.dataset, world["users"]["officer"])
    Dataset.objects.filter(pk=world["dataset"].pk).update(status=Dataset.Status.ACTIVE)


def _aim(case, data, world) -> None:
    """Mostly point the case at real objects, so that the handlers past the lookup are
    fuzzed too: the dataset's name, a real grant, ledger entry, request, analyst or audit
    record; for a new request a real engine and kind, often with plausible (but hostile)
    aggregates parameters; for an estimate, a charge or a composition, often events that
    parse (the schema says only "JSON" for them)."""
    often = st.integers(0, 3).map(lambda i: i != 2)  # 3 in 4
    params = case.path_parameters or {}
    if "name" in params and case.path.startswith("/api/datasets/") and data.draw(often, label="real name"):
        params["name"] = "clinic"
    collection = case.path.split("/")[2]
    if "id" in params and collection in world["ids"] and data.draw(often, label="real id"):
        params["id"] = world["ids"][collection]
    body = case.body
    if case.path == "/api/requests/" and case.method.upper() == "POST" and isinstance(body, dict):
        if data.draw(often, label="real dataset"):
            body["dataset"] = "clinic"
        if data.draw(often, label="real engine"):
            from engines import plugins

            engines = plugins.engines()
            body["engine"] = data.draw(st.sampled_from(["aggregates", "aggregates", *sorted(engines)]), label="engine")
            body["kind"] = data.draw(st.sampled_from(engines[body["engine"]]["kinds"]), label="kind")
            if body["engine"] == "aggregates" and data.draw(st.booleans(), label="plausible params"):
                body["kind"], body["params"] = data.draw(plausible_params(API_NUMERIC, API_CATEGORICAL), label="params")
    elif isinstance(body, dict) and case.path.endswith(("/estimate/", "/charges/")):
        if data.draw(st.booleans(), label="plausible event"):  # past the event parser, to the gate and ledger
            body.pop("events", None)
            body["event"] = data.draw(plausible_events(), label="event")
    elif isinstance(body, dict) and case.path == "/api/compose/" and data.draw(st.booleans(), label="events"):
        body["events"] = data.draw(st.lists(plausible_events(), max_size=4), label="plausible events")


def _sendable(body) -> bool:
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError):
        return not isinstance(body, (dict, list))  # bytes or text bodies are sent as they are
    return True


def _ledger(world):
    from governance.models import Budget, Grant, LedgerEntry

    ds = world["dataset"]
    budget = Budget.objects.get(pk=ds.pk)
    return (budget.state, budget.committed, LedgerEntry.objects.filter(dataset=ds).count(),
            list(Grant.objects.filter(dataset=ds).values_list("state", flat=True)))


@pytest.mark.parametrize("roles", list(ROLES))
@schema.parametrize()
@schema.given(data=st.data())
@fuzz_settings(CI_EXAMPLES, FULL_EXAMPLES)
@pytest.mark.django_db
def test_no_server_errors(case, data, world, roles, django_capture_on_commit_callbacks):
    from governance.audit import verification

    _restore(world)
    _aim(case, data, world)
    # an infinite or NaN float the strategies drew cannot be sent as JSON (the HTTP client
    # refuses it before the server sees anything; the parser tests send such text raw)
    assume(_sendable(case.body))
    role = data.draw(st.sampled_from(ROLES[roles]), label="role")
    before = _ledger(world)
    with django_capture_on_commit_callbacks(execute=False) as callbacks, keep_connection():
        response = case.call(headers=_headers(world, role))
    engine = case.body.get("engine") if isinstance(case.body, dict) else None
    if case.path != "/api/requests/" or (isinstance(engine, str) and engine in RUN_ENGINES):
        for callback in callbacks:  # the queued request runs now (Celery is eager), as on commit
            callback()
    if STATS:
        with open(STATS, "a") as f:
            f.write(f"{case.method.upper()} {case.path}\t{role}\t{response.status_code}\t{engine}\t"
                    f"{response.text[:150]!r}\n")
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
    if response.status_code >= 400:
        assert _ledger(world) == before, f"a refused {case.method} {case.path} changed the ledger"
    verified = verification.verify(stop_at_first=False)
    assert verified.ok, verified.as_dict()
