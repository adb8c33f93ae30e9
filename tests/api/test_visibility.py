"""Who sees which datasets: officers all; analysts active ones they hold an active grant on."""

import pytest
from django.utils import timezone

from .conftest import assert_error

URL = "/api/datasets/"
pytestmark = pytest.mark.django_db


def names(resp) -> list[str]:
    assert resp.status_code == 200, resp.json()
    return [d["name"] for d in resp.json()["results"]]


@pytest.fixture
def world(make_dataset, grant, analyst, analyst2):
    """granted (active), draft (granted, not active), other (active, analyst2 only), revoked."""
    granted = make_dataset("granted")
    draft = make_dataset("draft", activate=False)
    other = make_dataset("other")
    revoked = make_dataset("revoked")
    grant(analyst, granted)
    grant(analyst, draft)
    grant(analyst2, other)
    g = grant(analyst, revoked)
    g.revoked_at = timezone.now()
    g.save()
    return {"granted": granted, "draft": draft, "other": other, "revoked": revoked}


def test_it_shows_officers_every_dataset(api, officer, world):
    assert names(api(officer).get(URL)) == ["draft", "granted", "other", "revoked"]
    for name in world:
        assert api(officer).get(f"{URL}{name}/").status_code == 200


def test_it_shows_analysts_only_active_granted_datasets(api, analyst, world):
    assert names(api(analyst).get(URL)) == ["granted"]
    assert api(analyst).get(f"{URL}granted/").status_code == 200


@pytest.mark.parametrize("name", ["draft", "other", "revoked", "nonexistent"])
def test_it_answers_404_for_datasets_an_analyst_may_not_see(api, analyst, world, name):
    client = api(analyst)
    assert_error(client.get(f"{URL}{name}/"), 404, "not_found")
    assert_error(client.get(f"{URL}{name}/ledger/"), 404)
    assert_error(client.get(f"{URL}{name}/recommendation/"), 404)
    assert_error(client.post(f"{URL}{name}/estimate/", {"event": {"kind": "laplace", "epsilon": 0.1}},
                             format="json"), 404)


def test_it_hides_a_draft_until_it_is_activated(api, officer, analyst, world):
    assert "draft" not in names(api(analyst).get(URL))
    assert api(officer).post(f"{URL}draft/activate/").status_code == 200
    assert names(api(analyst).get(URL)) == ["draft", "granted"]
    assert api(analyst).get(f"{URL}draft/").status_code == 200


def test_it_hides_a_dataset_once_the_grant_is_revoked(api, officer, analyst, world):
    grant_id = api(officer).get("/api/grants/", {"dataset__name": "granted", "analyst__username": "ann"}
                                ).json()["results"][0]["id"]
    assert api(officer).delete(f"/api/grants/{grant_id}/").status_code == 204
    assert names(api(analyst).get(URL)) == []
    assert_error(api(analyst).get(f"{URL}granted/"), 404)


def test_it_shows_each_analyst_their_own(api, analyst2, world):
    assert names(api(analyst2).get(URL)) == ["other"]
    assert_error(api(analyst2).get(f"{URL}granted/"), 404)


def test_it_shows_an_outsider_nothing(api, outsider, world):
    assert names(api(outsider).get(URL)) == []
    for name in world:
        assert_error(api(outsider).get(f"{URL}{name}/"), 404)


@pytest.mark.parametrize("method, path", [
    ("get", URL), ("get", f"{URL}granted/"), ("post", URL), ("get", f"{URL}granted/ledger/"),
    ("post", f"{URL}granted/estimate/"), ("post", f"{URL}granted/charges/"), ("get", "/api/grants/"),
    ("get", "/api/ledger/"), ("get", "/api/me/"), ("post", "/api/compose/"), ("get", "/api/analysts/"),
])
def test_it_requires_authentication(api, world, method, path):
    r = getattr(api(), method)(path)
    assert_error(r, 401, "auth.required")
    assert r["WWW-Authenticate"].startswith("Token")


def test_it_refuses_a_bad_token(api, world):
    client = api()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert_error(client.get(URL), 401, "auth.failed")


def test_it_hides_the_data_sources_columns_provenance_from_analysts(api, officer, analyst, world):
    officer_view = api(officer).get(f"{URL}granted/").json()
    analyst_view = api(analyst).get(f"{URL}granted/").json()
    assert {"sha256", "created_by", "max_rows_per_unit"} <= set(officer_view)
    assert not {"sha256", "created_by", "max_rows_per_unit", "file"} & set(analyst_view)
    for flag in ("domain_from_data", "integer_from_data"):
        assert any(flag in c for c in officer_view["columns"]), flag
        assert not any(flag in c for c in analyst_view["columns"]), flag


def test_a_draft_or_deactivated_dataset_shows_in_no_grant_of_an_analyst(api, officer, analyst, world):
    """Its grant listed it in /api/grants/ and /api/me/: the name, budget and "auto" delta,
    whence the exact unit count, of a dataset the analyst cannot see (probe CO)."""
    def granted_names(client):
        listed = {g["dataset"] for g in client.get("/api/grants/").json()["results"]}
        filtered = {g["dataset"] for g in client.get("/api/grants/?dataset__name=draft").json()["results"]}
        return listed | filtered, {g["dataset"] for g in client.get("/api/me/").json()["grants"]}

    assert granted_names(api(analyst)) == ({"granted", "revoked"}, {"granted"})  # (a revoked grant: her history)
    assert api(officer).post(f"{URL}granted/deactivate/").status_code == 200
    assert granted_names(api(analyst)) == ({"revoked"}, set())
    assert "draft" in {g["dataset"] for g in api(officer).get("/api/grants/").json()["results"]}
    assert api(officer).post(f"{URL}draft/activate/").status_code == 200
    assert granted_names(api(analyst))[1] == {"draft"}
