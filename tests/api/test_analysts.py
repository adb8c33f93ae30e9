"""Analyst accounts and their tokens: /api/analysts/ (privacy officers only) and /api/me/."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from .conftest import assert_error

URL = "/api/analysts/"
pytestmark = pytest.mark.django_db


def token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_it_creates_an_analyst_whose_token_works(api, officer, django_user_model):
    r = api(officer).post(URL, {"username": "carol", "email": "carol@example.org"}, format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["username"] == "carol" and body["token"]
    user = django_user_model.objects.get(username="carol")
    assert user.pk == body["id"] and not user.is_staff and not user.has_usable_password()
    me = token_client(body["token"]).get("/api/me/")
    assert me.status_code == 200, me.json()
    assert me.json() == {"username": "carol", "role": "analyst", "grants": []}


def test_it_shows_me_my_grants(api, analyst, officer, make_dataset, grant):
    grant(analyst, make_dataset("clinic"), cap_epsilon=0.5)
    body = api(analyst).get("/api/me/").json()
    assert body["role"] == "analyst"
    assert [(g["dataset"], g["cap_epsilon"]) for g in body["grants"]] == [("clinic", 0.5)]
    assert api(officer).get("/api/me/").json()["role"] == "privacy_officer"


def test_it_rotates_a_token_and_the_old_one_stops_working(api, officer):
    client = api(officer)
    created = client.post(URL, {"username": "carol"}, format="json").json()
    old = created["token"]
    r = client.post(f"{URL}{created['id']}/token/")
    assert r.status_code == 200, r.json()
    new = r.json()["token"]
    assert new and new != old
    assert_error(token_client(old).get("/api/me/"), 401, "auth.failed")
    assert token_client(new).get("/api/me/").json()["username"] == "carol"
    assert Token.objects.filter(user_id=created["id"]).count() == 1


def test_it_lists_and_shows_analysts_to_officers(api, officer, analyst):
    body = api(officer).get(URL).json()
    names = {u["username"] for u in body["results"]}
    assert "ann" in names and "olivia" not in names  # officers' accounts are not managed here
    shown = api(officer).get(f"{URL}{analyst.pk}/").json()
    assert shown["username"] == "ann" and shown["is_staff"] is False
    assert "password" not in shown and "token" not in shown


@pytest.mark.parametrize("data", [{}, {"username": ""}, {"username": "has space"}, {"username": "x" * 151},
                                  {"username": "ann"}, {"username": "carol", "email": "not-an-email"}])
def test_it_refuses_bad_analysts(api, officer, analyst, django_user_model, data):
    before = django_user_model.objects.count()
    assert_error(api(officer).post(URL, data, format="json"), 400, "request.invalid")
    assert django_user_model.objects.count() == before


def test_it_forbids_analysts_to_manage_analysts(api, analyst, analyst2, django_user_model):
    client = api(analyst)
    assert_error(client.get(URL), 403, "permission.denied")
    assert_error(client.get(f"{URL}{analyst2.pk}/"), 403)
    assert_error(client.post(URL, {"username": "mallory"}, format="json"), 403)
    assert_error(client.post(f"{URL}{analyst2.pk}/token/"), 403)
    assert not django_user_model.objects.filter(username="mallory").exists()


def test_it_forbids_analysts_to_rotate_their_own_token_through_the_officer_route(api, analyst):
    key = Token.objects.get_or_create(user=analyst)[0].key
    assert_error(api(analyst).post(f"{URL}{analyst.pk}/token/"), 403)
    assert Token.objects.get(user=analyst).key == key


def test_it_answers_404_for_an_unknown_analyst(api, officer):
    assert_error(api(officer).post(f"{URL}999999/token/"), 404)
    assert_error(api(officer).get(f"{URL}not-a-number/"), 404)


@pytest.mark.parametrize("name", ["аnn", "ａnn", "Ann", "ANN", "josé", "ann\u200b"])
def test_a_username_that_reads_as_another_is_refused(api, officer, name):
    """Unicode letters were accepted: "аnn" (a Cyrillic а) became a second analyst who
    reads as ann in the audit trail; so did "Ann" beside "ann"."""
    boss = api(officer)
    assert boss.post("/api/analysts/", {"username": "ann"}, format="json").status_code == 201
    r = boss.post("/api/analysts/", {"username": name}, format="json")
    assert r.status_code == 400 and "username" in r.json()["errors"], r.content
