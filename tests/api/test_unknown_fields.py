"""A field an endpoint does not take is refused with a 400 naming it, never accepted and
ignored: an officer who PATCHes a grant's ``active`` must not believe it revoked."""

import pytest

from governance.models import LedgerEntry, Request


@pytest.fixture
def clinic(make_dataset):
    return make_dataset("clinic")


def _refused(r, field):
    assert r.status_code == 400, r.content
    assert field in r.json().get("errors", r.json()) or field in str(r.json())


def test_a_grant_patch_with_active_is_refused_and_revokes_nothing(api, officer, analyst, clinic, grant):
    g = grant(analyst, clinic)
    _refused(api(officer).patch(f"/api/grants/{g.pk}/", {"active": False}, format="json"), "active")
    g.refresh_from_db()
    assert g.revoked_at is None


def test_a_charge_naming_an_analyst_is_refused_and_books_nothing(api, officer, clinic):
    event = {"kind": "laplace", "epsilon": 0.1}
    r = api(officer).post("/api/datasets/clinic/charges/", {"event": event, "analyst": "bob"}, format="json")
    _refused(r, "analyst")
    assert not LedgerEntry.objects.exists()


@pytest.mark.parametrize("field, value", [("name", "other"), ("status", "active"), ("n_units", 1),
                                          ("sha256", "0" * 64), ("unit_column", "patient_id")])
def test_a_dataset_patch_of_a_read_only_field_is_refused(api, officer, clinic, field, value):
    _refused(api(officer).patch("/api/datasets/clinic/", {field: value}, format="json"), field)


def test_a_request_with_an_unknown_top_level_field_is_refused(api, analyst, clinic, grant):
    grant(analyst, clinic)
    r = api(analyst).post("/api/requests/", {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                             "params": {"epsilon": 0.1}, "priority": "high"}, format="json")
    _refused(r, "priority")
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()


def test_the_browsable_apis_form_token_is_not_an_unknown_field(api, officer, analyst, clinic):
    r = api(officer).post("/api/grants/", {"analyst": analyst.username, "dataset": "clinic",
                                           "csrfmiddlewaretoken": "x"}, format="multipart")
    assert r.status_code == 201, r.content
