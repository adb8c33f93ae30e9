"""Access control around the matrix (issue 7, item 5): what each role's lists hold, token
revocation and expiry (for the API and for the web sessions a token opens), CSRF on the
web forms, OPTIONS, security headers on every kind of answer (error pages included), and
the production settings (DEBUG, secrets from the environment or *_FILE).

The plain API cases of tokens (an expired token is a 401, a revoked one too) are in
tests/test_security.py; here they are checked together with the sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from .conftest import ROLES, leaks
from .test_permission_matrix import API_MATRIX, API_PATHS, WEB_MATRIX, send, web_path

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def token_client(key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def signed_in(key) -> Client:
    """A browser that signed in at /analyst/login/ with an API token (CSRF enforced)."""
    client = Client(enforce_csrf_checks=True)
    client.get("/analyst/login/")
    r = client.post("/analyst/login/", {"token": key, "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert r.status_code == 302 and r["Location"] == "/analyst/", r.content[:300]
    return client


# ----------------------------------------------------------------------------- lists

def results(client, url):
    r = client.get(url, {"page_size": 1000})
    assert r.status_code == 200, r.content[:300]
    return r.json()["results"]


def test_lists_hold_only_what_each_role_may_see(world):
    reqs = {k: str(v.pk) for k, v in world.requests.items()}
    expected_datasets = {"officer": {"alpha", "beta", "gamma"}, "ann": {"alpha"}, "bob": {"beta"}, "auditor": set()}
    expected_requests = {"officer": set(reqs.values()), "ann": {reqs[k] for k in ("ra", "fa", "qa")},
                         "bob": {reqs[k] for k in ("rb", "fb", "qb")}, "auditor": set()}
    for role in ("officer", "ann", "bob", "auditor"):
        c = world.api(role)
        assert {d["name"] for d in results(c, "/api/datasets/")} == expected_datasets[role], role
        listed = results(c, "/api/requests/")
        assert {r["id"] for r in listed} == expected_requests[role], role
        for r in listed:  # results only to the analyst who asked; officer reports only to officers
            assert (r["result"] is not None) == (role != "officer" and r["status"] == "succeeded"), (role, r["id"])
            assert (r["officer_report"] is not None) == (role == "officer" and r["engine"] == "filedrop"), r["id"]
        mine = {"ann", "bob"} & {role}
        ledger = {e["analyst"] for e in results(c, "/api/ledger/")}
        grants = {g["analyst"] for g in results(c, "/api/grants/")}
        if role == "officer":
            assert {"ann", "bob", "cara", "olivia"} <= ledger and {"ann", "bob", "cara"} <= grants
        else:
            assert ledger == mine and grants == mine, role
    # the dataset's own ledger: ann's entries only, not her neighbour cara's nor the officer's
    ann_ledger = results(world.api("ann"), "/api/datasets/alpha/ledger/")
    assert ann_ledger and {e["analyst"] for e in ann_ledger} == {"ann"}
    officer_ledger = {e["analyst"] for e in results(world.api("officer"), "/api/datasets/alpha/ledger/")}
    assert {"ann", "cara", "olivia"} <= officer_ledger


def test_the_analyst_page_shows_only_active_granted_datasets_and_own_requests(world):
    html = world.web("ann").get("/analyst/").content.decode()
    assert world.datasets["A"].title in html
    assert world.datasets["D"].title not in html and world.datasets["B"].title not in html  # draft, ungranted
    assert all(str(world.requests[k].pk) in html for k in ("ra", "fa", "qa"))
    assert not leaks(world, "ann", html)
    assert not any(str(world.requests[k].pk) in world.web("bob").get("/analyst/").content.decode()
                   for k in ("ra", "fa", "qa", "rc"))


def test_an_idempotency_key_never_returns_another_analysts_request(world):
    body = {"engine": "aggregates", "kind": "count", "params": {"epsilon": 0.02}}
    key = {"HTTP_IDEMPOTENCY_KEY": "shared-key-1"}
    first = world.api("ann").post("/api/requests/", {**body, "dataset": "alpha"}, format="json", **key)
    assert first.status_code == 202, first.content
    other = world.api("bob").post("/api/requests/", {**body, "dataset": "beta"}, format="json", **key)
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"], other.content
    assert first.json()["id"] not in other.content.decode() and other.json()["analyst"] == "bob"
    # the same key and body from bob on ann's dataset: refused as an unusable dataset, not ann's request
    r = world.api("bob").post("/api/requests/", {**body, "dataset": "alpha"}, format="json", **key)
    assert r.status_code in (400, 422) and first.json()["id"] not in r.content.decode()


# ----------------------------------------------------------------------------- OPTIONS

def test_options_needs_credentials_and_tells_nothing_about_objects(world):
    """OPTIONS answers 401 without credentials; with them 200 or 403, the same for an
    existing and a missing object (no oracle), and never any object's content."""
    problems = []
    for (key, method), objects in API_MATRIX.items():
        if key in ("schema", "docs"):
            continue
        for role in ROLES:
            seen = set()
            for obj in objects:
                path = API_PATHS[key] if isinstance(API_PATHS[key], str) else API_PATHS[key](world, obj)
                got, text = send(world, role, "OPTIONS", path, None, web=False)
                seen.add(got)
                ok = {"401"} if role == "anon" else {"200", "403"}
                if got not in ok or leaks(world, role, text):
                    problems.append((key, obj, role, got, leaks(world, role, text)))
            if len(seen) > 1:
                problems.append((key, role, "differs between objects", seen))
    assert not problems, problems


# ----------------------------------------------------------------------------- tokens and sessions

@pytest.mark.parametrize("how", ["revoke", "reissue"])
def test_revoking_or_reissuing_a_token_ends_the_api_and_the_web_session(api, officer, analyst, how):
    key = Token.objects.create(user=analyst).key
    by_token, browser = token_client(key), signed_in(key)
    assert by_token.get("/api/me/").status_code == 200
    assert browser.get("/analyst/").status_code == 200
    assert browser.get("/api/requests/").status_code == 200  # the API through the session (SessionAuthentication)

    r = getattr(api(officer), "delete" if how == "revoke" else "post")(f"/api/analysts/{analyst.pk}/token/")
    assert r.status_code == (204 if how == "revoke" else 200)

    r = by_token.get("/api/me/")
    assert r.status_code == 401 and r.json()["code"] == "auth.failed"
    assert browser.get("/analyst/")["Location"].startswith("/analyst/login/")
    assert browser.get("/api/requests/").status_code in (401, 403)
    if how == "reissue":
        fresh = token_client(api(officer).post(f"/api/analysts/{analyst.pk}/token/").json()["token"])
        assert fresh.get("/api/me/").json()["username"] == analyst.username
    else:
        r = Client().post("/analyst/login/", {"token": key})
        assert r.status_code == 200 and "Unknown token" in r.content.decode()


def test_an_expired_token_opens_nothing(settings, analyst):
    settings.API_TOKEN_TTL_DAYS = 30
    token = Token.objects.create(user=analyst)
    Token.objects.filter(pk=token.pk).update(created=timezone.now() - timedelta(days=30, minutes=1))
    r = token_client(token.key).get("/api/me/")
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    client = Client()
    r = client.post("/analyst/login/", {"token": token.key})
    assert r.status_code == 200 and "expired" in r.content.decode()
    assert client.get("/api/me/").status_code in (401, 403) and client.get("/analyst/").status_code == 302


def test_a_token_session_ends_when_the_token_expires(settings, analyst):
    settings.API_TOKEN_TTL_DAYS = 30
    token = Token.objects.create(user=analyst)
    Token.objects.filter(pk=token.pk).update(created=timezone.now() - timedelta(days=29, hours=12))
    token.refresh_from_db()
    browser = signed_in(token.key)
    ends = browser.session.get_expiry_date()
    assert abs((ends - (token.created + timedelta(days=30))).total_seconds()) < 5, ends
    settings.API_TOKEN_TTL_DAYS = 0  # tokens that never expire: the usual session lifetime
    browser = signed_in(token.key)
    assert browser.session.get_expiry_date() > timezone.now() + timedelta(days=settings.SESSION_COOKIE_AGE // 86400 - 1)


def test_an_officers_token_does_not_open_the_admin(api, officer):
    key = Token.objects.get_or_create(user=officer)[0].key
    assert token_client(key).get("/api/analysts/").status_code == 200  # the token is good for the API
    client = Client()
    r = client.post("/analyst/login/", {"token": key})
    assert r.status_code == 200 and "/admin/" in r.content.decode()
    r = client.get("/admin/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")


# ----------------------------------------------------------------------------- CSRF

def test_every_web_form_refuses_a_post_without_its_csrf_token(world):
    """A session's POST to any page (the officer's admin, the analyst's sign-in and
    sign-out) without the CSRF token is a 403, whoever is signed in; so is an unsafe API
    call made through a session rather than a token."""
    problems = []
    for key, method in WEB_MATRIX:
        if method != "POST" or key in ("healthz", "favicon.ico"):
            continue
        for obj in WEB_MATRIX[(key, method)]:
            path = web_path(world, key, obj)
            for role in ("officer", "ann", "anon"):
                client = world.web(role, enforce_csrf_checks=True)
                r = client.post(path, {"token": world.tokens["ann"]} if key == "analyst-login" else {})
                if r.status_code != 403:
                    problems.append((path, role, r.status_code))
    assert not problems, problems
    # the API through a session: DRF's CSRF check
    for role in ("officer", "ann"):
        client = world.web(role, enforce_csrf_checks=True)
        r = client.post("/api/requests/", {"dataset": "alpha", "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": 0.05}}, content_type="application/json")
        assert r.status_code == 403 and "CSRF" in r.json()["detail"], (role, r.content[:200])
    # ...while the token is not subject to it
    r = world.api("ann").post("/api/datasets/alpha/estimate/", {"event": {"kind": "laplace", "epsilon": 0.1}},
                              format="json")
    assert r.status_code == 200


# ----------------------------------------------------------------------------- headers

def assert_security_headers(r, what):
    assert "default-src 'self'" in r.get("Content-Security-Policy", "") and \
        "frame-ancestors 'none'" in r["Content-Security-Policy"], what
    assert r.get("X-Frame-Options") == "DENY", what
    assert r.get("X-Content-Type-Options") == "nosniff", what
    assert r.get("Referrer-Policy") == "same-origin", what
    assert "camera=()" in r.get("Permissions-Policy", ""), what


def test_security_headers_on_api_admin_files_and_error_pages(world, monkeypatch):
    A = world.datasets["A"]
    officer, ann = world.web("officer"), world.web("ann")
    cases = {
        "API JSON 200": world.api("ann").get("/api/datasets/"),
        "API 401": world.api("anon").get("/api/datasets/"),
        "API 403": world.api("ann").get("/api/audit/"),
        "API 404": world.api("ann").get("/api/datasets/beta/"),
        "API 405": world.api("ann").put("/api/requests/"),
        "API 400": world.api("ann").post("/api/requests/", {}, format="json"),
        "API file download": world.api("ann").get(f"/api/requests/{world.requests['fa'].pk}/files/answer.csv/"),
        "audit export": world.api("auditor").get("/api/audit/export/", {"dataset": "alpha", "format": "csv"}),
        "admin dashboard": officer.get("/admin/"),
        "admin dataset page": officer.get(f"/admin/governance/dataset/{A.pk}/overview/"),
        "admin 404": officer.get("/admin/governance/dataset/999999/overview/"),
        "admin login redirect": ann.get("/admin/"),
        "analyst page": ann.get("/analyst/"),
        "page 404": Client().get("/no-such-page/"),
        "page 405": ann.get("/analyst/logout/"),
        "CSRF 403": world.web("ann", enforce_csrf_checks=True).post("/analyst/logout/"),
    }
    # a server error: the handler's page, without the exception (DEBUG is off under test)
    from governance.api import dataset_views as views

    def boom(*a, **k):
        raise RuntimeError("SECRET-DETAIL-OF-A-CRASH")
    monkeypatch.setattr(views, "recommend", boom)
    crash = APIClient(raise_request_exception=False)
    crash.credentials(HTTP_AUTHORIZATION=f"Token {world.tokens['ann']}")
    cases["API 500"] = r500 = crash.get("/api/datasets/alpha/recommendation/")
    assert r500.status_code == 500 and b"SECRET-DETAIL" not in r500.content and b"Traceback" not in r500.content
    # the health check without its database
    def down(*a, **k):
        raise RuntimeError("database down")
    monkeypatch.setattr(connection, "cursor", down)
    cases["healthz 503"] = r503 = Client().get("/healthz")
    monkeypatch.undo()
    assert r503.status_code == 503
    statuses = {name: r.status_code for name, r in cases.items()}
    assert statuses["API 405"] == 405 and statuses["page 404"] == 404 and statuses["CSRF 403"] == 403, statuses
    assert statuses["API file download"] == 200 and statuses["admin 404"] == 404, statuses
    for name, r in cases.items():
        assert_security_headers(r, (name, r.status_code))


# ----------------------------------------------------------------------------- settings

def settings_in_a_process(env: dict) -> dict:
    code = ("import django, json, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'governance.settings'; django.setup(); "
            "from django.conf import settings as s; "
            "print(json.dumps({'DEBUG': s.DEBUG, 'SECRET_KEY': s.SECRET_KEY, 'DB': s.DATABASES['default']['NAME'], "
            "'SESSION_COOKIE_SECURE': s.SESSION_COOKIE_SECURE, 'CSRF_COOKIE_SECURE': s.CSRF_COOKIE_SECURE, "
            "'TTL': s.API_TOKEN_TTL_DAYS}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env},
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_production_settings_read_secrets_from_files_and_turn_debug_off(tmp_path):
    """The settings module itself (not only governance.core.env) reads SECRET_KEY_FILE and
    DATABASE_URL_FILE, and they win over the plain variables; DEBUG=false makes the
    cookies secure. (Deploy files set DEBUG=false: tests/deploy; the deploy checks refuse
    DEBUG on and the development key: tests/test_settings.py.)"""
    (tmp_path / "key").write_text("k" * 60 + "\n")
    (tmp_path / "db").write_text(f"sqlite:///{tmp_path / 'from-file.sqlite3'}\n")
    base = {"GOVERNANCE_VAR_DIR": str(tmp_path / "var")}
    prod = settings_in_a_process({**base, "DEBUG": "false", "SECRET_KEY_FILE": str(tmp_path / "key"),
                                  "SECRET_KEY": "ignored-plain-value", "DATABASE_URL_FILE": str(tmp_path / "db")})
    assert prod["DEBUG"] is False and prod["SECRET_KEY"] == "k" * 60
    assert prod["DB"] == str(tmp_path / "from-file.sqlite3")
    assert prod["SESSION_COOKIE_SECURE"] is True and prod["CSRF_COOKIE_SECURE"] is True and prod["TTL"] == 90
    plain = settings_in_a_process({**base, "DEBUG": "false", "SECRET_KEY": "p" * 60})
    assert plain["SECRET_KEY"] == "p" * 60
    dev = settings_in_a_process(base)  # nothing set: the development defaults, which the deploy checks refuse
    assert dev["DEBUG"] is True and dev["SESSION_COOKIE_SECURE"] is False


@pytest.mark.parametrize("who", ["auditor", "officer"])
def test_the_admin_grant_form_refuses_auditors_and_officers(world, who):
    """The API refuses a grant to an auditor or an officer (tests/audit); the admin's grant
    form must too, or an auditor would see the dataset and could ask for results."""
    from governance.models import Grant

    world.web("officer").post("/admin/governance/grant/add/", {"analyst": world.users[who].pk,
                                                               "dataset": world.datasets["B"].pk})
    assert not Grant.objects.filter(analyst=world.users[who]).exists()
    assert results(world.api("auditor"), "/api/datasets/") == []


def test_a_file_path_without_its_trailing_slash_is_the_same_download(world):
    """The router's format suffixes read ``files/answer.csv`` as the file ``answer`` in the
    format ``csv``: a 404, where the docs promise a path without its slash is the same route."""
    fa = world.requests["fa"].pk
    for who, path in (("ann", f"/api/requests/{fa}/files/answer.csv"),
                      ("officer", f"/api/requests/{fa}/officer-files/report.html")):
        with_slash, without = world.api(who).get(path + "/"), world.api(who).get(path)
        assert with_slash.status_code == without.status_code == 200, (path, without.status_code)
        assert b"".join(without.streaming_content if without.streaming else [without.content]) == b"".join(
            with_slash.streaming_content if with_slash.streaming else [with_slash.content])
