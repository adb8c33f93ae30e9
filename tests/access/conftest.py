"""The world the permission matrix runs in (issue 7, item 5).

Built on the shared fixtures (``tests/conftest.py``: ``officer``, ``analyst`` = ann,
``analyst2`` = bob, ``api``, ``make_dataset``, ``grant``) and on the audit tests' history
builder (``tests/audit/conftest.py``); the auditor is created the documented way,
``POST /api/analysts/ {"role": "auditor"}``, as the earlier role matrix's ``auditor`` does
by hand (``tests/audit/test_audit_api.py``).

- datasets: ``alpha`` (active; ann holds a grant, and so does cara, her neighbour),
  ``beta`` (active; bob holds a grant), ``gamma`` (a draft; ann holds a grant, so only its
  status hides it); alpha has a history (``build_history``) and an officer's external charge;
- requests, run for real (Celery eager) on the aggregates engine: ann's and bob's ``mean``
  of income (a succeeded result), ann's and bob's ``files`` request on the ``filedrop``
  test engine (a succeeded result, a released file and an officer-only report file),
  ann's and bob's queued ``count`` (its task never sent: on_commit is not run), and cara's
  ``mean`` on alpha;
- every value a role must never see is kept as a *marker* string: result values, file
  contents, officer-report contents, request ids, titles of datasets, audit hashes, and
  the raw income cells of the tables.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pandas as pd
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from engines import plugins
from engines.hookspecs import hookimpl
from engines.types import Plan, PlanError, Release
from governance.models import AuditRecord, Dataset, Request
from tests.audit.conftest import build_history
from tests.conftest import small_frame

ROLES = ("officer", "ann", "bob", "auditor", "anon")


class FileDropEngine:
    """A test double that releases files: ``answer.csv`` for the analyst and
    ``officer/report.html`` for the officers, each with a marker unique to the run."""

    NAME = "filedrop"

    @hookimpl
    def engine_info(self):
        return {"name": self.NAME, "kinds": ["files"], "queue": "cpu", "description": "test engine",
                "params_schema": {}}

    @hookimpl
    def plan(self, engine, request, dataset):
        if engine != self.NAME:
            return None
        if request.kind != "files":
            raise PlanError("kind must be files", {"kind": "unknown"})
        return Plan(event={"kind": "laplace", "epsilon": 0.1}, columns=["age"])

    @hookimpl
    def run(self, engine, request, dataset, data, plan, progress, workdir):
        if engine != self.NAME:
            return None
        tags = [uuid.uuid4().hex for _ in range(4)]
        (workdir / "answer.csv").write_text(f"marker\nFILE-{tags[0]}\n")
        (workdir / "officer").mkdir()
        (workdir / "officer" / "report.html").write_text(f"<p>OFFICER-FILE-{tags[1]}</p>")
        return Release(result={"marker": f"RESULT-{tags[2]}", "rows": data.num_rows},
                       officer_report={"marker": f"OFFICER-REPORT-{tags[3]}"})


@pytest.fixture
def filedrop_engine():
    engine = FileDropEngine()
    plugins.pm.register(engine, name="filedrop-engine")
    yield engine
    plugins.pm.unregister(engine)


@dataclass
class World:
    users: dict                       # role -> user (anon: None)
    tokens: dict                      # role -> API token key (anon: None)
    datasets: dict                    # "A", "B", "D" -> Dataset
    requests: dict                    # "ra", "rb", "fa", "fb", "qa", "qb" -> Request
    grants: dict                      # "gA", "gB" -> Grant
    entries: dict                     # "eA", "eB" -> LedgerEntry
    record: AuditRecord
    tess: object                      # a plain analyst: the target of the token routes
    import_dir: object                # where fresh.csv waits to be registered
    login_tokens: dict                # tokens tried at /analyst/login/
    markers: dict = field(default_factory=dict)   # name -> set of strings
    forbidden: dict = field(default_factory=dict)  # role -> {marker: why}

    def api(self, role):
        from rest_framework.test import APIClient

        client = APIClient()
        if self.tokens.get(role):
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[role]}")
        return client

    def web(self, role, **kw):
        client = Client(**kw)
        if self.users.get(role) is not None:
            client.force_login(self.users[role])
        return client


def _raw_cells(path) -> set[str]:
    """The income cells of a table as written in its file: never in any response."""
    return set(pd.read_csv(path, dtype=str)["income"])


def _result_strings(result) -> set[str]:
    """The released numbers (``value``, ``ci95``) and markers of a request's result, as a
    JSON body spells them (its public parameters, bounds and noise scale, are left out)."""
    out: set[str] = set()

    def walk(x, released=False):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, released or k in ("value", "ci95"))
        elif isinstance(x, list):
            for v in x:
                walk(v, released)
        elif isinstance(x, float) and released:
            out.add(repr(x))
        elif isinstance(x, str) and x.startswith(("RESULT-", "OFFICER-")):
            out.add(x)
    walk(result)
    return out


@pytest.fixture
def world(db, officer, analyst, analyst2, api, make_dataset, grant, import_dir, filedrop_engine,
          django_capture_on_commit_callbacks) -> World:
    cache.clear()  # the request-creation throttle counts in the cache
    A = make_dataset("alpha", epsilon=50.0)
    raw = _raw_cells(import_dir / "alpha.csv")
    B = make_dataset("beta", epsilon=50.0, frame=small_frame(seed=1))
    raw |= _raw_cells(import_dir / "beta.csv")
    D = make_dataset("gamma", epsilon=5.0, activate=False, frame=small_frame(seed=2))
    raw |= _raw_cells(import_dir / "gamma.csv")
    titles = {}
    for key, ds in {"A": A, "B": B, "D": D}.items():
        titles[key] = f"TITLE-{key}-{uuid.uuid4().hex[:12]}"
        Dataset.objects.filter(pk=ds.pk).update(title=titles[key], description=f"DESCRIPTION-{titles[key]}")
        ds.refresh_from_db()
    # a table an officer may register by path in the matrix (POST /api/datasets/)
    small_frame(seed=3).to_csv(import_dir / "fresh.csv", index=False)

    gA, gB = grant(analyst, A), grant(analyst2, B)
    grant(analyst, D)
    cara = get_user_model().objects.create_user("cara")  # another analyst on alpha: ann's neighbour
    grant(cara, A)
    build_history(A, [analyst], n=6)  # ledger entries and audit records on alpha (commits, a refund)

    boss = api(officer)
    r = boss.post("/api/analysts/", {"username": "audrey", "role": "auditor"}, format="json")
    assert r.status_code == 201 and r.json()["role"] == "auditor", r.content
    auditor_token = r.json()["token"]
    r = boss.post("/api/analysts/", {"username": "tess"}, format="json")
    assert r.status_code == 201, r.content
    r = boss.post(f"/api/datasets/{A.name}/charges/", {"event": {"kind": "laplace", "epsilon": 0.01},
                                                      "reference": f"OFFICER-CHARGE-{uuid.uuid4().hex}"}, format="json")
    assert r.status_code == 201, r.content
    officer_charge = r.json()["reference"]
    eve = get_user_model().objects.create_user("eve")
    expired = Token.objects.create(user=eve)
    Token.objects.filter(pk=expired.pk).update(created=timezone.now() - timedelta(days=settings.API_TOKEN_TTL_DAYS + 1))
    revoked = Token.objects.create(user=get_user_model().objects.create_user("rex"))
    Token.objects.filter(pk=revoked.pk).delete()
    users = {"officer": officer, "ann": analyst, "bob": analyst2,
             "auditor": get_user_model().objects.get(username="audrey"), "anon": None}
    tokens = {"officer": Token.objects.get_or_create(user=officer)[0].key,
              "ann": Token.objects.get_or_create(user=analyst)[0].key,
              "bob": Token.objects.get_or_create(user=analyst2)[0].key,
              "auditor": auditor_token, "anon": None}

    def ask(role, ds, engine, kind, params):
        resp = api(users[role] if role != "cara" else cara).post("/api/requests/", {"dataset": ds.name, "engine": engine, "kind": kind,
                                                        "params": params}, format="json")
        assert resp.status_code == 202, resp.content
        return resp.json()["id"]

    with django_capture_on_commit_callbacks(execute=True):
        ids = {"ra": ask("ann", A, "aggregates", "mean", {"column": "income", "epsilon": 0.5}),
               "rb": ask("bob", B, "aggregates", "mean", {"column": "income", "epsilon": 0.5}),
               "fa": ask("ann", A, "filedrop", "files", {}),
               "fb": ask("bob", B, "filedrop", "files", {}),
               "rc": ask("cara", A, "aggregates", "mean", {"column": "income", "epsilon": 0.5})}
    ids["qa"] = ask("ann", A, "aggregates", "count", {"epsilon": 0.1})
    ids["qb"] = ask("bob", B, "aggregates", "count", {"epsilon": 0.1})
    reqs = {k: Request.objects.select_related("ledger_entry").get(pk=v) for k, v in ids.items()}
    for k in ("ra", "rb", "fa", "fb", "rc"):
        assert reqs[k].status == Request.Status.SUCCEEDED, (k, reqs[k].error)
    for k in ("qa", "qb"):
        assert reqs[k].status == Request.Status.QUEUED, k
    assert [f["name"] for f in reqs["fa"].result["files"]] == ["answer.csv"]
    assert [f["name"] for f in reqs["fa"].officer_report["files"]] == ["report.html"]

    from governance.requests.result_files import results_dir

    def file_marker(key, sub):
        return (results_dir(reqs[key].pk) / sub).read_text().strip().splitlines()[-1].removeprefix("<p>") \
            .removesuffix("</p>")

    markers = {
        "raw rows": raw,
        "ann's results": _result_strings(reqs["ra"].result) | _result_strings(reqs["fa"].result)
        | {file_marker("fa", "answer.csv")},
        "bob's results": _result_strings(reqs["rb"].result) | _result_strings(reqs["fb"].result)
        | {file_marker("fb", "answer.csv")},
        "officer reports": _result_strings(reqs["fa"].officer_report) | _result_strings(reqs["fb"].officer_report)
        | {file_marker("fa", "officer/report.html"), file_marker("fb", "officer/report.html")},
        "ann's request ids": {str(reqs[k].pk) for k in ("ra", "fa", "qa")},
        "bob's request ids": {str(reqs[k].pk) for k in ("rb", "fb", "qb")},
        "cara's results": _result_strings(reqs["rc"].result),
        "cara's request ids": {str(reqs["rc"].pk)},
        "officer's charges": {officer_charge},
        "alpha details": {titles["A"]}, "beta details": {titles["B"]}, "gamma details": {titles["D"]},
        "audit hashes": set(AuditRecord.objects.values_list("hash", flat=True)),
    }
    assert all(markers.values()), {k: v for k, v in markers.items() if not v}
    assert len(markers["ann's results"]) >= 4 and len(markers["bob's results"]) >= 4, markers
    never_for = {
        "officer": ["raw rows", "ann's results", "bob's results", "cara's results"],
        "ann": ["raw rows", "bob's results", "cara's results", "officer reports", "bob's request ids",
                "cara's request ids", "officer's charges", "beta details", "gamma details", "audit hashes"],
        "bob": ["raw rows", "ann's results", "cara's results", "officer reports", "ann's request ids",
                "cara's request ids", "officer's charges", "alpha details", "gamma details", "audit hashes"],
        # auditors read audit records (request ids, titles and hashes are in them), nothing else
        "auditor": ["raw rows", "ann's results", "bob's results", "cara's results", "officer reports"],
        "anon": list(markers),
    }
    forbidden = {role: {m: name for name in names for m in markers[name]} for role, names in never_for.items()}
    return World(
        users=users, tokens=tokens, datasets={"A": A, "B": B, "D": D}, requests=reqs,
        grants={"gA": gA, "gB": gB},
        entries={"eA": reqs["ra"].ledger_entry, "eB": reqs["rb"].ledger_entry},
        record=AuditRecord.objects.filter(dataset=A).order_by("seq").first(),
        tess=get_user_model().objects.get(username="tess"), import_dir=import_dir,
        login_tokens={"ann-token": tokens["ann"], "officer-token": tokens["officer"], "expired-token": expired.key,
                      "revoked-token": revoked.key},
        markers=markers, forbidden=forbidden)


def body_of(response) -> str:
    """A response's body as text (streamed files read whole)."""
    if getattr(response, "streaming", False):
        # the test client closes the file when the content is read through (closing the
        # response again would fire request_finished and close the test's connection)
        data = b"".join(response.streaming_content)
    else:
        data = response.content
    return data.decode("utf-8", errors="replace")


NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def leaks(world: World, role: str, text: str) -> list[str]:
    """Which markers ``role`` must never see occur in ``text``. Numbers (raw cells, result
    values) count only as whole numbers of the text, not as a part of a longer one."""
    forbidden = world.forbidden[role]
    found = {f"{forbidden[n]}: {n}" for n in set(NUMBER.findall(text)) if n in forbidden}
    found |= {f"{why}: {m[:40]}" for m, why in forbidden.items() if not NUMBER.fullmatch(m) and m in text}
    return sorted(found)
