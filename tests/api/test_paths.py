"""Paths under /api/ without their trailing slash, and paths no route matches, whatever
DEBUG says (the embedded default runs with DEBUG on): a POST to ``/api/requests`` is the
same request as to ``/api/requests/`` (never redirected into a GET, never a 500), and an
unknown path is the API's JSON 404, not Django's HTML page."""

import pytest
from django.test import override_settings

from governance.models import LedgerEntry, Request
from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db
COUNT = {"dataset": "clinic", "engine": "aggregates", "kind": "count", "params": {"epsilon": 0.5}}


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=10.0)
    grant(analyst, ds)
    return ds


@pytest.mark.parametrize("debug", [True, False])
def test_a_post_without_the_trailing_slash_is_the_same_request(api, analyst, clinic, debug,
                                                               django_capture_on_commit_callbacks):
    client = api(analyst)
    with override_settings(DEBUG=debug), django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests", COUNT, format="json")
    assert r.status_code == 202, r.content
    body = client.get(f"/api/requests/{r.json()['id']}").json()
    assert body["status"] == "succeeded" and "value" in body["result"], body
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1
    # and a bad one is the same 400 with its reason, nothing stored
    with override_settings(DEBUG=debug):
        bad = client.post("/api/requests", {**COUNT, "params": {"epsilon": -1}}, format="json")
    assert_error(bad, 400)
    assert "epsilon" in bad.content.decode() and Request.objects.count() == 1


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("path", ["/api/nothing/", "/api/nothing", "/api/requests/x/y/z/", "/api/schema.yaml/"])
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_an_unknown_path_is_a_json_404(api, analyst, debug, path, method):
    with override_settings(DEBUG=debug):
        r = getattr(api(analyst), method)(path)
    body = assert_error(r, 404, "not_found")
    assert r["Content-Type"].startswith("application/json") and path in body["detail"]


@pytest.mark.parametrize("debug", [True, False])
def test_lists_answer_without_the_slash(api, analyst, clinic, debug):
    with override_settings(DEBUG=debug):
        r = api(analyst).get("/api/datasets")
    assert r.status_code == 200 and [d["name"] for d in r.json()["results"]] == ["clinic"], r.content
