"""Security headers, the health endpoint, expiring and revocable API tokens, and the
per-analyst rate limit on request creation."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/admin/login/", "/analyst/login/", "/api/me/", "/healthz"])
def test_security_headers(client, url):
    r = client.get(url)
    assert "default-src 'self'" in r["Content-Security-Policy"] and "frame-ancestors 'none'" in \
        r["Content-Security-Policy"]
    assert r["X-Content-Type-Options"] == "nosniff" and r["Referrer-Policy"] == "same-origin"
    assert r["X-Frame-Options"] == "DENY" and "camera=()" in r["Permissions-Policy"]


def test_answers_to_a_signed_in_caller_are_not_stored_by_caches(api, client, analyst, auditor, officer):
    """A shared browser's or a proxy's cache kept an analyst's results and tokens (a probe:
    /analyst/, /auditor/ and every API answer carried no Cache-Control)."""
    assert api(analyst).get("/api/me/")["Cache-Control"] == "private, no-store"
    assert api(analyst).get("/api/requests/")["Cache-Control"] == "private, no-store"
    client.force_login(auditor)
    assert client.get("/auditor/")["Cache-Control"] == "private, no-store"
    client.force_login(officer)
    assert "no-store" in client.get("/admin/")["Cache-Control"]  # the admin's own (never_cache)
    assert "Cache-Control" not in api().get("/healthz")  # nobody signed in: nothing private


def test_the_officer_ui_forms_carry_csrf_protection(client, officer):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(officer)
    r = strict.post("/admin/governance/dataset/register/", {"name": "x"})
    assert r.status_code == 403  # no CSRF token


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok"}


def test_an_expired_token_is_refused(api, analyst, settings):
    settings.API_TOKEN_TTL_DAYS = 30
    client = api(analyst)
    assert client.get("/api/me/").status_code == 200
    Token.objects.filter(user=analyst).update(created=timezone.now() - timedelta(days=31))
    r = client.get("/api/me/")
    assert r.status_code == 401 and r.json()["code"] == "auth.failed" and "expired" in r.json()["detail"]
    settings.API_TOKEN_TTL_DAYS = 0  # never expire
    assert client.get("/api/me/").status_code == 200


def test_an_officer_revokes_and_reissues_a_token(api, officer, analyst):
    client = api(analyst)
    assert client.get("/api/me/").status_code == 200
    assert api(officer).delete(f"/api/analysts/{analyst.pk}/token/").status_code == 204
    assert client.get("/api/me/").status_code == 401
    new = api(officer).post(f"/api/analysts/{analyst.pk}/token/").json()["token"]
    from rest_framework.test import APIClient

    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Token {new}")
    assert fresh.get("/api/me/").status_code == 200
    assert api(analyst).delete(f"/api/analysts/{analyst.pk}/token/").status_code == 403  # not an officer


def test_request_creation_is_rate_limited_per_analyst(api, analyst, analyst2, make_dataset, grant, settings):
    from django.core.cache import cache

    cache.clear()
    settings.REQUEST_RATE_LIMIT = "3/min"
    ds = make_dataset(epsilon=100.0)
    grant(analyst, ds)
    grant(analyst2, ds)

    def ask(user, i):
        return api(user).post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                                 "params": {"epsilon": 0.01 + i / 1000}}, format="json")
    codes = [ask(analyst, i).status_code for i in range(4)]
    assert codes[:3] != [429] * 3 and codes[3] == 429
    r = ask(analyst, 5)
    assert r.json()["code"] == "rate.limited" and int(r["Retry-After"]) > 0
    assert ask(analyst2, 0).status_code != 429  # per analyst
    assert api(analyst).get("/api/requests/").status_code == 200  # reading is not limited
    cache.clear()


def test_a_retry_with_the_key_of_an_admitted_post_is_not_rate_limited(api, analyst, make_dataset, grant, settings):
    """A client whose answer was lost retries with its Idempotency-Key: refused with a 429
    it could not learn whether the first was charged (a probe). It gets the request back."""
    from django.core.cache import cache

    from governance.models import Request

    cache.clear()
    settings.REQUEST_RATE_LIMIT = "2/min"
    ds = make_dataset(epsilon=100.0)
    grant(analyst, ds)
    client = api(analyst)

    def ask(i, key):
        return client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                              "params": {"epsilon": 0.01 + i / 1000}}, format="json",
                           headers={"Idempotency-Key": key})
    first = ask(0, "k0")
    assert ask(1, "k1").status_code != 429
    assert ask(2, "k2").status_code == 429  # a new request past the limit
    again = ask(0, "k0")
    assert again.status_code in (200, 202) and again.json()["id"] == first.json()["id"]
    assert Request.objects.count() == 2
    cache.clear()


def test_json_text_carries_no_del_or_c1_raw_and_keeps_its_values():
    import json

    from governance.core.security import json_c1_escaped

    for value in ("a\x7fb", "a\x7fb\u009bc\u0085", "plain", "caf\u00e9 \u0430"):
        text = json_c1_escaped(json.dumps(value, ensure_ascii=False))
        assert json.loads(text) == value
        assert not [c for c in text if 0x7f <= ord(c) < 0xa0], text
