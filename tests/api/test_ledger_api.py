"""Reading the ledger: /api/ledger/ and /api/datasets/{name}/ledger/."""

import pytest

from governance.ledger import actions as ledger
from governance.models import LedgerEntry

from .conftest import assert_error

pytestmark = pytest.mark.django_db
LAPLACE = {"kind": "laplace", "epsilon": 0.01}


@pytest.fixture
def entries(make_dataset, grant, officer, analyst, analyst2):
    """clinic: ann 3 (committed, released, reserved), bob 2 reserved, officer 1 committed;
    visits: ann 1 committed."""
    clinic, visits = make_dataset("clinic", epsilon=5.0), make_dataset("visits", epsilon=5.0)
    for ds in (clinic, visits):
        grant(analyst, ds)
    grant(analyst2, clinic)
    ledger.commit(ledger.admit(clinic, analyst, LAPLACE, reference="ann-1"))
    ledger.release(ledger.admit(clinic, analyst, LAPLACE, reference="ann-2"))
    ledger.admit(clinic, analyst, LAPLACE, reference="ann-3")
    ledger.admit(clinic, analyst2, LAPLACE, reference="bob-1")
    ledger.admit(clinic, analyst2, LAPLACE, reference="bob-2")
    ledger.charge(clinic, officer, LAPLACE, reference="olivia-1")
    ledger.commit(ledger.admit(visits, analyst, LAPLACE, reference="ann-visits"))
    return clinic, visits


def refs(resp) -> list[str]:
    assert resp.status_code == 200, resp.json()
    return [e["reference"] for e in resp.json()["results"]]


ALL = ["ann-1", "ann-2", "ann-3", "bob-1", "bob-2", "olivia-1", "ann-visits"]
ANN = ["ann-1", "ann-2", "ann-3", "ann-visits"]


def test_it_shows_officers_every_entry(api, officer, entries):
    r = api(officer).get("/api/ledger/")
    assert refs(r) == ALL
    assert r.json()["count"] == 7
    entry = r.json()["results"][0]
    assert set(entry) >= {"id", "dataset", "analyst", "reference", "status", "event", "charge", "created_at"}
    assert (entry["dataset"], entry["analyst"], entry["status"]) == ("clinic", "ann", "committed")


def test_it_shows_analysts_only_their_own(api, analyst, analyst2, outsider, entries):
    assert refs(api(analyst).get("/api/ledger/")) == ANN
    assert refs(api(analyst2).get("/api/ledger/")) == ["bob-1", "bob-2"]
    assert refs(api(outsider).get("/api/ledger/")) == []


def test_it_hides_other_analysts_entries_by_id(api, analyst, entries):
    theirs = LedgerEntry.objects.get(reference="bob-1")
    mine = LedgerEntry.objects.get(reference="ann-1")
    assert_error(api(analyst).get(f"/api/ledger/{theirs.pk}/"), 404)
    assert api(analyst).get(f"/api/ledger/{mine.pk}/").json()["reference"] == "ann-1"


@pytest.mark.parametrize("params, officer_sees, ann_sees", [
    ({"status": "committed"}, ["ann-1", "olivia-1", "ann-visits"], ["ann-1", "ann-visits"]),
    ({"status": "released"}, ["ann-2"], ["ann-2"]),
    ({"status": "reserved"}, ["ann-3", "bob-1", "bob-2"], ["ann-3"]),
    ({"dataset__name": "visits"}, ["ann-visits"], ["ann-visits"]),
    ({"dataset__name": "clinic", "status": "reserved"}, ["ann-3", "bob-1", "bob-2"], ["ann-3"]),
    ({"analyst__username": "bob"}, ["bob-1", "bob-2"], []),
    ({"dataset__name": "nothing"}, [], []),
])
def test_it_filters(api, officer, analyst, entries, params, officer_sees, ann_sees):
    assert refs(api(officer).get("/api/ledger/", params)) == officer_sees
    assert refs(api(analyst).get("/api/ledger/", params)) == ann_sees


def test_it_refuses_an_unknown_status_filter(api, officer, entries):
    assert_error(api(officer).get("/api/ledger/", {"status": "spent"}), 400)
    assert_error(api(officer).get("/api/datasets/clinic/ledger/", {"status": "spent"}), 400, "request.invalid")


def test_it_paginates(api, officer, entries):
    client = api(officer)
    page1 = client.get("/api/ledger/", {"page_size": 3}).json()
    assert page1["count"] == 7 and len(page1["results"]) == 3 and page1["previous"] is None
    assert page1["next"] and "page=2" in page1["next"]
    page3 = client.get("/api/ledger/", {"page_size": 3, "page": 3}).json()
    assert [e["reference"] for e in page3["results"]] == ["ann-visits"] and page3["next"] is None
    seen = []
    url = "/api/ledger/?page_size=2"
    while url:
        body = client.get(url).json()
        seen += [e["reference"] for e in body["results"]]
        url = body["next"]
    assert seen == ALL
    assert_error(client.get("/api/ledger/", {"page_size": 3, "page": 4}), 404)
    assert len(client.get("/api/ledger/", {"page_size": 100_000}).json()["results"]) == 7
    for bad in ("garbage", "0", "-3", "2.5", "NaN", "\u0663"):  # DRF ignored these: the default page (a probe)
        r = client.get("/api/ledger/", {"page_size": bad})
        assert_error(r, 400)
        assert "page_size" in r.json()["errors"], (bad, r.json())


def test_it_lists_one_datasets_ledger(api, officer, analyst, analyst2, entries):
    assert refs(api(officer).get("/api/datasets/clinic/ledger/")) == ALL[:6]
    assert refs(api(officer).get("/api/datasets/visits/ledger/")) == ["ann-visits"]
    assert refs(api(analyst).get("/api/datasets/clinic/ledger/")) == ["ann-1", "ann-2", "ann-3"]
    assert refs(api(analyst2).get("/api/datasets/clinic/ledger/")) == ["bob-1", "bob-2"]
    assert refs(api(officer).get("/api/datasets/clinic/ledger/", {"status": "reserved"})) == ["ann-3", "bob-1", "bob-2"]
    assert refs(api(analyst).get("/api/datasets/clinic/ledger/", {"status": "released"})) == ["ann-2"]
    page = api(officer).get("/api/datasets/clinic/ledger/", {"page_size": 4}).json()
    assert page["count"] == 6 and len(page["results"]) == 4


def test_it_reads_status_on_a_datasets_ledger_as_the_entries_status(api, officer, entries):
    # not as the dataset's status (draft/active), which only filters the dataset list
    assert refs(api(officer).get("/api/datasets/clinic/ledger/", {"status": "committed"})) == ["ann-1", "olivia-1"]
    assert refs(api(officer).get("/api/datasets/clinic/ledger/", {"policy": "basic"})) == ALL[:6]


def test_it_hides_a_datasets_ledger_from_analysts_without_a_grant(api, analyst2, entries):
    assert_error(api(analyst2).get("/api/datasets/visits/ledger/"), 404)


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_it_is_read_only(api, officer, entries, method):
    entry = LedgerEntry.objects.first()
    path = "/api/ledger/" if method == "post" else f"/api/ledger/{entry.pk}/"
    assert_error(getattr(api(officer), method)(path, {"status": "released"}, format="json"), 405)
    assert LedgerEntry.objects.get(pk=entry.pk).status == entry.status
    assert LedgerEntry.objects.count() == 7
