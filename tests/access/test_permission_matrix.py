"""Issue 7, item 5: a permission matrix over every route, HTTP method, role and object.

Every URL pattern the resolver knows is listed in ``MATRIX`` with the methods its view
serves (``test_the_matrix_lists_every_route_and_method`` fails when a route or a method
appears that the matrix does not list, or when the matrix lists one that is gone). Each
cell is written out: for an object (own or another analyst's request, granted or not
granted dataset, an existing or a missing id), the status each role gets, in the order

    officer  ann  bob  auditor  anonymous

officer = a privacy officer (staff); ann = an analyst with a grant on dataset A (alpha)
(and on the draft D, gamma); bob = an analyst without a grant on A (his grant is on B,
beta); auditor = created with ``POST /api/analysts/ {"role": "auditor"}``; anonymous = no
credentials. The API is called with ``Authorization: Token ...``, the web pages with a
session. ``302L`` is a redirect to a login page (a refusal); ``a|b`` allows either.

Every response of every cell is also searched for what that role must never see
(``tests/access/conftest.py``: raw rows, other analysts' results, files and request
ids, officer-only reports, ungranted datasets' details, the audit trail's hashes), and
each ``/api/`` cell is repeated through its ``.json`` format-suffix route and as HEAD
(where the view offers it). Each call runs in a savepoint that is rolled back, so a
POST or DELETE that is allowed changes nothing for the next cell, and the world is built
once per test: 105 routes (130 patterns), 212 route-methods, 279 objects, 1,363 cells,
about 2,000 requests in some 15 s on SQLite.

``ACCESS_MATRIX_DUMP=FILE pytest tests/access`` writes the outcomes seen, in the
matrix's own notation, to FILE (to fill in the row of a new route).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from governance.models import Dataset

from .conftest import ROLES, body_of, leaks

pytestmark = pytest.mark.django_db

LOGIN = "302L"

# ----------------------------------------------------------------------------- the matrix
# (route, method): {object: "officer ann bob auditor anonymous"}. "-": a route without an
# object. Objects: datasets A (alpha: ann's grant), B (beta: bob's grant), D (gamma: a draft
# ann holds a grant on), X (missing); requests ra/rb (ann's/bob's, succeeded, with a
# result), qa/qb (queued), fa/fb (succeeded, with a released file and an officer report
# file); grants gA/gB; ledger entries eA/eB; accounts tess (an analyst) and officer.

API_MATRIX = {
    ("api-root", "GET"): {"-": "200 200 200 200 401"},
    # The OpenAPI schema and its viewer describe the API, hold no data: public.
    ("schema", "GET"): {"-": "200 200 200 200 200"},
    ("docs", "GET"): {"-": "200 200 200 200 200"},
    ("me", "GET"): {"-": "200 200 200 200 401"},
    ("compose", "POST"): {"-": "200 200 200 200 401"},
    ("engines", "GET"): {"-": "200 200 200 200 401"},

    ("dataset-list", "GET"): {"-": "200 200 200 200 401"},
    ("dataset-list", "POST"): {"-": "201 403 403 403 401"},
    ("dataset-detail", "GET"): {"A": "200 200 404 404 401", "B": "200 404 200 404 401",
                                "D": "200 404 404 404 401", "X": "404 404 404 404 401"},
    ("dataset-detail", "PATCH"): {"A": "200 403 403 403 401", "B": "200 403 403 403 401",
                                  "D": "200 403 403 403 401", "X": "404 403 403 403 401"},
    ("dataset-activate", "POST"): {"A": "200 403 403 403 401", "B": "200 403 403 403 401",
                                   "D": "200 403 403 403 401", "X": "404 403 403 403 401"},
    ("dataset-deactivate", "POST"): {"A": "200 403 403 403 401", "B": "200 403 403 403 401",
                                     "D": "200 403 403 403 401", "X": "404 403 403 403 401"},
    # an external release on a draft is refused by the gate (dataset.inactive)
    ("dataset-charges", "POST"): {"A": "201 403 403 403 401", "B": "201 403 403 403 401",
                                  "D": "409 403 403 403 401", "X": "404 403 403 403 401"},
    # a site secret: officers only (these datasets are not federated: 400, "it has no sites";
    # tests/api/test_federated_datasets.py hands one out)
    ("dataset-site-secret", "POST"): {"A": "400 403 403 403 401", "B": "400 403 403 403 401",
                                      "D": "400 403 403 403 401", "X": "404 403 403 403 401"},
    ("dataset-estimate", "POST"): {"A": "200 200 404 404 401", "B": "200 404 200 404 401",
                                   "D": "200 404 404 404 401", "X": "404 404 404 404 401"},
    ("dataset-recommendation", "GET"): {"A": "200 200 404 404 401", "B": "200 404 200 404 401",
                                        "D": "200 404 404 404 401", "X": "404 404 404 404 401"},
    # dummy rows from the public schema: whoever sees the dataset (no rows read, no charge)
    ("dataset-preview", "GET"): {"A": "200 200 404 404 401", "B": "200 404 200 404 401",
                                 "D": "200 404 404 404 401", "X": "404 404 404 404 401"},
    ("dataset-ledger", "GET"): {"A": "200 200 404 404 401", "B": "200 404 200 404 401",
                                "D": "200 404 404 404 401", "X": "404 404 404 404 401"},

    ("grant-list", "GET"): {"-": "200 200 200 200 401"},
    ("grant-list", "POST"): {"-": "201 403 403 403 401"},
    ("grant-detail", "GET"): {"gA": "200 200 404 404 401", "gB": "200 404 200 404 401",
                              "X": "404 404 404 404 401"},
    # PUT is routed but not offered (GrantViewSet.http_method_names): 405 after the permission check
    ("grant-detail", "PUT"): {"gA": "405 403 403 403 401", "X": "405 403 403 403 401"},
    ("grant-detail", "PATCH"): {"gA": "200 403 403 403 401", "gB": "200 403 403 403 401",
                                "X": "404 403 403 403 401"},
    ("grant-detail", "DELETE"): {"gA": "204 403 403 403 401", "gB": "204 403 403 403 401",
                                 "X": "404 403 403 403 401"},

    ("ledger-list", "GET"): {"-": "200 200 200 200 401"},
    ("ledger-detail", "GET"): {"eA": "200 200 404 404 401", "eB": "200 404 200 404 401",
                               "X": "404 404 404 404 401"},

    ("analyst-list", "GET"): {"-": "200 403 403 403 401"},
    ("analyst-list", "POST"): {"-": "201 403 403 403 401"},
    # officers' own accounts are not managed here (404)
    ("analyst-detail", "GET"): {"tess": "200 403 403 403 401", "officer": "404 403 403 403 401",
                                "X": "404 403 403 403 401"},
    ("analyst-token", "POST"): {"tess": "200 403 403 403 401", "officer": "404 403 403 403 401",
                                "X": "404 403 403 403 401"},
    ("analyst-token", "DELETE"): {"tess": "204 403 403 403 401", "officer": "404 403 403 403 401",
                                  "X": "404 403 403 403 401"},

    ("request-list", "GET"): {"-": "200 200 200 200 401"},
    # a dataset one may not use is "not found" (400 request.invalid, the same as a missing
    # one); officers need no grant; a draft is refused by the gate
    ("request-list", "POST"): {"A": "202 202 400 400 401", "B": "202 400 202 400 401",
                               "D": "409 400 400 400 401", "X": "400 400 400 400 401"},
    # officers see every request, without its result
    ("request-detail", "GET"): {"ra": "200 200 404 404 401", "rb": "200 404 200 404 401",
                                "X": "404 404 404 404 401"},
    ("request-cancel", "POST"): {"qa": "200 200 404 404 401", "qb": "200 404 200 404 401",
                                 "ra": "409 409 404 404 401", "X": "404 404 404 404 401"},
    # released files: the analyst who asked, and no one else (officers neither)
    ("request-files", "GET"): {"fa:answer.csv": "404 200 404 404 401", "fb:answer.csv": "404 404 200 404 401",
                               "fa:report.html": "404 404 404 404 401", "X:answer.csv": "404 404 404 404 401"},
    # the officer's report on the private rows: officers only
    ("request-officer-files", "GET"): {"fa:report.html": "200 403 403 403 401",
                                       "fb:report.html": "200 403 403 403 401",
                                       "fa:answer.csv": "404 403 403 403 401",
                                       "X:report.html": "404 403 403 403 401"},

    ("audit-list", "GET"): {"-": "200 403 403 200 401"},
    ("audit-detail", "GET"): {"rec": "200 403 403 200 401", "X": "404 403 403 404 401"},
    ("audit-export", "GET"): {"A": "200 403 403 200 401", "X": "400 403 403 400 401"},
    ("audit-verify", "GET"): {"-": "200 403 403 200 401"},
}

L4 = f"{LOGIN} {LOGIN} {LOGIN} {LOGIN}"  # ann, bob, auditor, anonymous: sent to the admin's login

WEB_MATRIX = {
    ("healthz", "GET"): {"-": "200 200 200 200 200"},
    ("favicon.ico", "GET"): {"-": "204 204 204 204 204"},

    # the analyst's page: any signed-in account sees its own grants and requests; an
    # auditor is sent to the auditor's pages
    ("analyst-home", "GET"): {"-": f"200 200 200 302 {LOGIN}"},
    ("analyst-home", "POST"): {"-": f"200 200 200 302 {LOGIN}"},
    # a new API token for whoever is signed in (POST only), shown once
    ("new-token", "GET"): {"-": f"405 405 405 405 {LOGIN}"},
    ("new-token", "POST"): {"-": f"200 200 200 200 {LOGIN}"},
    # the auditor's pages: auditors only (analysts and officers 403; officers have the admin's)
    ("auditor-home", "GET"): {"-": f"403 403 403 200 {LOGIN}"},
    ("auditor-home", "POST"): {"-": f"403 403 403 200 {LOGIN}"},
    ("auditor-trail", "GET"): {"A": f"403 403 403 200 {LOGIN}", "X": f"403 403 403 404 {LOGIN}"},
    ("auditor-trail", "POST"): {"A": f"403 403 403 200 {LOGIN}"},
    ("auditor-verify", "GET"): {"A": f"403 403 403 200 {LOGIN}", "X": f"403 403 403 404 {LOGIN}"},
    ("auditor-verify", "POST"): {"A": f"403 403 403 200 {LOGIN}"},
    ("auditor-export", "GET"): {"A": f"403 403 403 200 {LOGIN}", "X": f"403 403 403 404 {LOGIN}"},
    ("auditor-export", "POST"): {"A": f"403 403 403 200 {LOGIN}"},
    ("analyst-login", "GET"): {"-": "200 200 200 200 200"},
    # signing in with a token: an analyst's live token opens a session (whoever was signed
    # in); an expired, revoked or unknown token, or a privacy officer's (officers sign in
    # at /admin/ with their password) is refused with the form again
    ("analyst-login", "POST"): {"ann-token": "302 302 302 302 302", "expired-token": "200 200 200 200 200",
                                "revoked-token": "200 200 200 200 200", "officer-token": "200 200 200 200 200"},
    ("analyst-logout", "POST"): {"-": f"{LOGIN} {LOGIN} {LOGIN} {LOGIN} {LOGIN}"},

    # the officer's web UI: custom pages
    ("admin:index", "GET"): {"-": f"200 {L4}"},
    ("admin:index", "POST"): {"-": f"200 {L4}"},
    ("admin:governance_overview", "GET"): {"A": f"200 {L4}", "D": f"200 {L4}", "A+estimate": f"200 {L4}",
                                           "X": f"404 {L4}"},
    ("admin:governance_overview", "POST"): {"A": f"200 {L4}"},
    ("admin:governance_audit_export", "GET"): {"A": f"200 {L4}", "X": f"404 {L4}"},
    ("admin:governance_audit_export", "POST"): {"A": f"200 {L4}"},
    ("admin:governance_audit_verify", "GET"): {"A": f"302 {L4}"},
    ("admin:governance_audit_verify", "POST"): {"A": f"302 {L4}"},
    ("admin:governance_token", "GET"): {"-": f"200 {L4}"},
    ("admin:governance_token", "POST"): {"-": f"400 {L4}"},  # no "for": whose token?
    ("admin:governance_dataset_register", "GET"): {"-": f"200 {L4}"},
    ("admin:governance_dataset_register", "POST"): {"-": f"200 {L4}"},
    # the admin's own pages
    ("admin:login", "GET"): {"-": "302 200 200 200 200"},
    ("admin:login", "POST"): {"-": "200 200 200 200 200"},  # the form again (no credentials)
    ("admin:logout", "GET"): {"-": "405 302 302 302 302"},
    ("admin:logout", "POST"): {"-": "200 302 302 302 302"},
    ("admin:password_change", "GET"): {"-": f"200 {L4}"},
    ("admin:password_change", "POST"): {"-": f"200 {L4}"},
    ("admin:password_change_done", "GET"): {"-": f"200 {L4}"},
    ("admin:password_change_done", "POST"): {"-": f"405 {L4}"},
    ("admin:autocomplete", "GET"): {"-": f"403 {L4}"},
    ("admin:autocomplete", "POST"): {"-": f"405 {L4}"},
    ("admin:jsi18n", "GET"): {"-": f"200 {L4}"},
    ("admin:jsi18n", "POST"): {"-": f"405 {L4}"},
    ("admin:view_on_site", "GET"): {"A": f"404 {L4}"},
    ("admin:view_on_site", "POST"): {"A": f"404 {L4}"},
    ("admin:app_list", "GET"): {"governance": f"200 {L4}", "auth": f"404 {L4}"},
    ("admin:app_list", "POST"): {"governance": f"200 {L4}"},
    ("admin/(?P<url>.*)$", "GET"): {"-": f"404 {L4}"},
    ("admin/(?P<url>.*)$", "POST"): {"-": f"404 {L4}"},
}

# The admin's model pages: the officer's status per page; every other role is sent to the
# login. Officers are staff without Django model permissions: the account models (users,
# groups, tokens; managed through /api/analysts/) are closed to them, the governance models
# open, nothing deletable (the ledger needs its history), ledger, requests and audit
# records read-only.
# Pages answer GET and POST (listed as "GET POST"); <id>/ is a RedirectView to the change
# page, which answers every method (GET POST PUT PATCH DELETE, one status for all).
#            model                 changelist add  history delete change  <id>/ (redirect)
ADMIN_MODELS = {
    "auth/group":               ("403 403", "403 403", "403 403", "403 403", "403 403", "302"),
    "auth/user":                ("403 403", "403 403", "403 403", "403 403", "403 403", "302"),
    "governance/dataset":       ("200 200", "302 302", "200 200", "403 403", "200 200", "302"),
    "governance/budget":        ("200 200", "403 403", "200 200", "403 403", "200 403", "302"),
    "governance/grant":         ("200 200", "200 200", "200 200", "403 403", "200 302", "302"),
    "governance/ledgerentry":   ("200 200", "403 403", "200 200", "403 403", "200 403", "302"),
    "governance/request":       ("200 200", "403 403", "200 200", "403 403", "200 403", "302"),
    "governance/auditrecord":   ("200 200", "403 403", "200 200", "403 403", "200 403", "302"),
}
ADMIN_PAGES = ("changelist", "add", "history", "delete", "change", None)
# the user admin's password form: GET, POST
ADMIN_USER_PASSWORD = ("403", "403")

for _model, _pages in ADMIN_MODELS.items():
    _app, _name = _model.split("/")
    for _page, _statuses in zip(ADMIN_PAGES, _pages):
        _key = f"admin:{_app}_{_name}_{_page}" if _page else f"admin/{_model}/<path:object_id>/"
        _obj = "-" if _page in ("changelist", "add") else "obj"
        assert len(_statuses.split()) == (2 if _page else 1), _model
        _methods = ("GET", "POST") if _page else ("GET", "POST", "PUT", "PATCH", "DELETE")
        _split = _statuses.split() if _page else _statuses.split() * len(_methods)
        for _method, _status in zip(_methods, _split, strict=True):
            WEB_MATRIX[(_key, _method)] = {_obj: f"{_status} {L4}"}
for _method, _status in zip(("GET", "POST"), ADMIN_USER_PASSWORD):
    WEB_MATRIX[("admin:auth_user_password_change", _method)] = {"obj": f"{_status} {L4}"}

MATRIX = {**API_MATRIX, **WEB_MATRIX}

# ----------------------------------------------------------------------------- requests

MISSING_UUID = "00000000-0000-4000-8000-000000000000"
MISSING_INT = 999_999


def _ds(w, o):
    return "nope" if o == "X" else w.datasets[o].name


def _req(w, o):
    return MISSING_UUID if o == "X" else w.requests[o].pk


def _file(w, o, route):
    key, name = o.split(":")
    return f"/api/requests/{_req(w, key)}/{route}/{name}/"


API_PATHS = {
    "api-root": "/api/",
    "schema": "/api/schema/",
    "docs": "/api/docs/",
    "me": "/api/me/",
    "compose": "/api/compose/",
    "engines": "/api/engines/",
    "dataset-list": "/api/datasets/",
    "dataset-detail": lambda w, o: f"/api/datasets/{_ds(w, o)}/",
    "dataset-activate": lambda w, o: f"/api/datasets/{_ds(w, o)}/activate/",
    "dataset-deactivate": lambda w, o: f"/api/datasets/{_ds(w, o)}/deactivate/",
    "dataset-charges": lambda w, o: f"/api/datasets/{_ds(w, o)}/charges/",
    "dataset-site-secret": lambda w, o: f"/api/datasets/{_ds(w, o)}/sites/h1/secret/",
    "dataset-estimate": lambda w, o: f"/api/datasets/{_ds(w, o)}/estimate/",
    "dataset-recommendation": lambda w, o: f"/api/datasets/{_ds(w, o)}/recommendation/?sensitivity=high",
    "dataset-preview": lambda w, o: f"/api/datasets/{_ds(w, o)}/preview/?rows=20&seed=1",
    "dataset-ledger": lambda w, o: f"/api/datasets/{_ds(w, o)}/ledger/",
    "grant-list": "/api/grants/",
    "grant-detail": lambda w, o: f"/api/grants/{MISSING_INT if o == 'X' else w.grants[o].pk}/",
    "ledger-list": "/api/ledger/",
    "ledger-detail": lambda w, o: f"/api/ledger/{MISSING_INT if o == 'X' else w.entries[o].pk}/",
    "analyst-list": "/api/analysts/",
    "analyst-detail": lambda w, o: f"/api/analysts/{_account(w, o)}/",
    "analyst-token": lambda w, o: f"/api/analysts/{_account(w, o)}/token/",
    "request-list": "/api/requests/",
    "request-detail": lambda w, o: f"/api/requests/{_req(w, o)}/",
    "request-cancel": lambda w, o: f"/api/requests/{_req(w, o)}/cancel/",
    "request-files": lambda w, o: _file(w, o, "files"),
    "request-officer-files": lambda w, o: _file(w, o, "officer-files"),
    "audit-list": "/api/audit/",
    "audit-detail": lambda w, o: f"/api/audit/{MISSING_INT if o == 'X' else w.record.pk}/",
    "audit-export": lambda w, o: f"/api/audit/export/?dataset={_ds(w, o)}&format=json",
    "audit-verify": "/api/audit/verify/",
}


def _account(w, o):
    return {"tess": w.tess.pk, "officer": w.users["officer"].pk}.get(o, MISSING_INT)


API_BODIES = {
    ("compose", "POST"): {"events": [{"kind": "laplace", "epsilon": 0.1}], "delta": 1e-6},
    ("dataset-list", "POST"): lambda w, o: {"name": "fresh", "path": str(w.import_dir / "fresh.csv"),
                                            "budget_epsilon": 1.0},
    ("dataset-detail", "PATCH"): {"title": "renamed"},
    ("dataset-charges", "POST"): {"event": {"kind": "laplace", "epsilon": 0.01}, "reference": "matrix"},
    ("dataset-estimate", "POST"): {"event": {"kind": "laplace", "epsilon": 0.1}},
    ("grant-list", "POST"): {"analyst": "tess", "dataset": "alpha", "cap_epsilon": 1.0},
    ("grant-detail", "PUT"): {"cap_epsilon": 2.0},
    ("grant-detail", "PATCH"): {"cap_epsilon": 2.0},
    ("analyst-list", "POST"): {"username": "newcomer"},
    ("request-list", "POST"): lambda w, o: {"dataset": _ds(w, o), "engine": "aggregates", "kind": "count",
                                            "params": {"epsilon": 0.05}},
}


def _admin_obj(w, key):
    """The id of an existing object for an admin model page."""
    return {
        "auth_group": lambda: Group.objects.get(name="auditors").pk,
        "auth_user": lambda: w.tess.pk,
        "governance_dataset": lambda: w.datasets["A"].pk,
        "governance_budget": lambda: w.datasets["A"].budget.pk,
        "governance_grant": lambda: w.grants["gA"].pk,
        "governance_ledgerentry": lambda: w.entries["eA"].pk,
        "governance_request": lambda: w.requests["ra"].pk,
        "governance_auditrecord": lambda: w.record.pk,
    }[key]()


def web_path(w, key, o):
    fixed = {"healthz": "/healthz", "favicon.ico": "/favicon.ico", "analyst-home": "/analyst/",
             "analyst-login": "/analyst/login/", "analyst-logout": "/analyst/logout/",
             "admin/(?P<url>.*)$": "/admin/no-such-page/"}
    if key in fixed:
        return fixed[key]
    if key == "admin:governance_overview":
        pk = MISSING_INT if o == "X" else w.datasets[o.split("+")[0]].pk
        query = '?event={"kind": "laplace", "epsilon": 0.05}' if o.endswith("+estimate") else ""
        return reverse(key, args=[pk]) + query
    if key == "admin:governance_audit_export":
        return reverse(key) + f"?dataset={_ds(w, o)}&format=json"
    if key == "admin:governance_audit_verify":
        return reverse(key) + f"?dataset={_ds(w, o)}&next=/admin/"
    if key == "auditor-trail":
        return reverse(key, args=[_ds(w, o)])
    if key == "auditor-verify":
        return reverse(key) + f"?dataset={_ds(w, o)}"
    if key == "auditor-export":
        return reverse(key) + f"?dataset={_ds(w, o)}&format=json"
    if key == "admin:view_on_site":
        return reverse(key, args=[ContentType.objects.get_for_model(Dataset).pk, w.datasets["A"].pk])
    if key == "admin:app_list":
        return reverse(key, kwargs={"app_label": o})
    if key.startswith("admin/"):  # a model's <id>/: redirects to its change page
        app, model = key.split("/")[1:3]
        return f"/admin/{app}/{model}/{_admin_obj(w, f'{app}_{model}')}/"
    if o == "obj":  # a model page of one object
        model = re.match(r"admin:(\w+?_\w+?)_(history|delete|change|password_change)$", key).group(1)
        return reverse(key, args=[_admin_obj(w, model)])
    return reverse(key)


def web_body(w, key, method, o):
    if key == "analyst-login" and method == "POST":
        return {"token": w.login_tokens[o]}
    return {}


# ----------------------------------------------------------------------------- running cells

def outcome(resp) -> str:
    if resp.status_code in (301, 302) and urlsplit(resp["Location"]).path in ("/admin/login/", "/analyst/login/"):
        return LOGIN
    return str(resp.status_code)


def with_suffix(path: str) -> str:
    """The same call through the route's ``.json`` format-suffix pattern."""
    base, _, query = path.partition("?")
    base = base + ".json" if base == "/api/" else base.rstrip("/") + ".json"
    return base + (f"?{query}" if query else "")


def send(w, role, method, path, body, *, web):
    """One call, undone afterwards (a savepoint rolled back), so cells do not interfere."""
    with transaction.atomic():
        try:
            if web:
                client = w.web(role)
                resp = client.generic(method, path) if method not in ("GET", "POST") else \
                    getattr(client, method.lower())(path, body)
            else:
                client = w.api(role)
                fn = getattr(client, method.lower())
                resp = fn(path, body, format="json") if method in ("POST", "PUT", "PATCH") else fn(path)
            return outcome(resp), body_of(resp)
        except Exception as e:  # noqa: BLE001 - an exception is a 500: report it in the table
            return "500", f"{type(e).__name__}: {e}"
        finally:
            transaction.set_rollback(True)


def cells(keys):
    for key, method in keys:
        for obj, row in MATRIX[(key, method)].items():
            expected = row.split()
            assert len(expected) == len(ROLES), (key, method, obj, row)
            yield key, method, obj, dict(zip(ROLES, expected))


def check(w, keys, *, suffixed=frozenset(), no_head=frozenset()):
    """Run the cells of ``keys``; return the mismatches and leaks, one line each."""
    problems, seen = [], {}
    for key, method, obj, expected in cells(keys):
        web = (key, method) in WEB_MATRIX
        if web:
            path, body = web_path(w, key, obj), web_body(w, key, method, obj)
        else:
            path = API_PATHS[key] if isinstance(API_PATHS[key], str) else API_PATHS[key](w, obj)
            body = API_BODIES.get((key, method))
            body = body(w, obj) if callable(body) else body
        variants = [(method, path)]
        if not web and key in suffixed:
            variants.append((method, with_suffix(path)))
        if not web and method == "GET" and key not in no_head:
            variants.append(("HEAD", path))
        for role in ROLES:
            for verb, url in variants:
                got, text = send(w, role, verb, url, body, web=web)
                if (verb, url) == (method, path):
                    seen.setdefault((key, method), {}).setdefault(obj, {})[role] = got
                if got not in expected[role].split("|"):
                    problems.append(f"{verb:6} {url:70} {role:8} expected {expected[role]:5} got {got}"
                                    + (f"  {text[:200]!r}" if got == "500" else ""))
                found = leaks(w, role, text)
                if found:
                    problems.append(f"{verb:6} {url:70} {role:8} LEAKS {found[:3]}")
    _dump(seen)
    return problems


def _dump(seen):
    target = os.environ.get("ACCESS_MATRIX_DUMP")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as f:
        for (key, method), objs in seen.items():
            row = ", ".join(f'"{o}": "{" ".join(r[role] for role in ROLES)}"' for o, r in objs.items())
            f.write(f'    ("{key}", "{method}"): {{{row}}},\n')


# ----------------------------------------------------------------------------- route enumeration

def enumerate_routes() -> dict:
    """{route key: {"patterns": [...], "methods": set of methods or None}} for every URL
    pattern of the project. The key is the route's (namespaced) name, or its pattern when
    it has none; ``.json`` format-suffix patterns share their route's name. ``methods``
    is what a DRF view routes (its action map, or its handlers); None for a plain Django
    view (it takes any method: the matrix lists GET and POST, or what it serves)."""
    out: dict = {}

    def walk(patterns, prefix, namespace):
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = ":".join(filter(None, [namespace, p.namespace])) or None
                walk(p.url_patterns, prefix + str(p.pattern), ns)
                continue
            assert isinstance(p, URLPattern)
            route = prefix + str(p.pattern)
            key = f"{namespace}:{p.name}" if namespace and p.name else (p.name or route)
            cb = p.callback
            methods = None
            if getattr(cb, "actions", None):
                # DRF's ViewSet view adds 'head' to this shared dict on the first HEAD request
                # it serves (viewsets.py), so which tests ran before would change the answer.
                methods = {m.upper() for m in cb.actions if m not in ("head", "options", "trace")}
            elif getattr(cb, "cls", None) or getattr(cb, "view_class", None):
                cls = getattr(cb, "cls", None) or cb.view_class
                methods = {m.upper() for m in cls.http_method_names
                           if hasattr(cls, m) and m not in ("head", "options", "trace")}
            head = getattr(getattr(cb, "cls", None), "http_method_names", ["head"])
            entry = out.setdefault(key, {"patterns": [], "methods": methods, "head": "head" in head})
            entry["patterns"].append(route)
            if methods is not None:
                entry["methods"] = (entry["methods"] or set()) | methods
    walk(get_resolver().url_patterns, "", None)
    return out


def routes_without_head() -> frozenset:
    """DRF function views (@api_view) that do not offer HEAD (405): /api/me/, /api/engines/."""
    return frozenset(k for k, v in enumerate_routes().items() if not v["head"])


def suffixed_routes() -> frozenset:
    return frozenset(k for k, v in enumerate_routes().items() if any("(?P<format>" in p or "drf_format_suffix" in p
                                                                     for p in v["patterns"]))


# ----------------------------------------------------------------------------- tests

def test_the_matrix_lists_every_route_and_method():
    routes = enumerate_routes()
    listed: dict = {}
    for key, method in MATRIX:
        listed.setdefault(key, set()).add(method)
    unlisted = sorted(set(routes) - set(listed))
    stale = sorted(set(listed) - set(routes))
    assert not unlisted, f"routes the permission matrix does not list: {unlisted}"
    assert not stale, f"the permission matrix lists routes that are gone: {stale}"
    for key, info in routes.items():
        if info["methods"] is not None:  # a DRF view: exactly the methods it routes
            assert listed[key] == info["methods"], (key, sorted(listed[key]), sorted(info["methods"]))
        else:  # a plain Django view: GET and POST, or only what it serves (require_POST)
            assert listed[key] <= {"GET", "POST"}, (key, listed[key])
    # ... and every cell names every role
    for (key, method), objs in MATRIX.items():
        assert objs and all(len(row.split()) == len(ROLES) for row in objs.values()), (key, method)


API_GROUPS = {
    "datasets": lambda k: k.startswith("dataset-"),
    "grants-ledger-analysts": lambda k: k.startswith(("grant-", "ledger-", "analyst-")),
    "requests": lambda k: k.startswith("request-"),
    "audit": lambda k: k.startswith("audit-"),
    "misc": lambda k: "-" not in k or k == "api-root",
}


@pytest.mark.parametrize("group", list(API_GROUPS))
def test_api_matrix(world, group):
    keys = [km for km in API_MATRIX if API_GROUPS[group](km[0])]
    assert keys
    problems = check(world, keys, suffixed=suffixed_routes(), no_head=routes_without_head())
    assert not problems, "\n" + "\n".join(problems)


def test_api_groups_cover_the_api_matrix():
    assert {km for km in API_MATRIX if any(f(km[0]) for f in API_GROUPS.values())} == set(API_MATRIX)


@pytest.mark.parametrize("part", ["analyst-and-health", "admin-custom", "admin-models"])
def test_web_matrix(world, part):
    def which(key):
        if not key.startswith("admin"):
            return "analyst-and-health"
        custom = key.startswith("admin:governance_") and not re.search(
            r"_(changelist|add|history|delete|change)$", key) or key in (
            "admin:index", "admin:login", "admin:logout", "admin:password_change", "admin:password_change_done",
            "admin:autocomplete", "admin:jsi18n", "admin:view_on_site", "admin:app_list", "admin/(?P<url>.*)$")
        return "admin-custom" if custom else "admin-models"
    keys = [km for km in WEB_MATRIX if which(km[0]) == part]
    assert keys
    problems = check(world, keys)
    assert not problems, "\n" + "\n".join(problems)
