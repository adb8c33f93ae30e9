"""The ledger's reported RDP epsilon refined off the grid (governance/ledger/refined_reports.py,
limits.refined): a dataset's detail, a ledger entry's and a request's charge, the
officer's overview. The issue's case: a small DP-SGD charge, 0.0632 on the 56-order grid
and 0.0471 with the order refined (34% apart)."""

import pytest

from accounting import parse_event, rdp
from accounting.costs import Cost
from governance.ledger import actions as ledger, limits, refined_reports
from governance.models import Budget, Dataset, Request

pytestmark = pytest.mark.django_db

SMALL_SGD = {"kind": "subsampled_gaussian", "sample_rate": 0.001, "noise_multiplier": 3.0, "steps": 100}
DELTA = 1e-5


def events():
    return [SMALL_SGD, {"kind": "laplace", "epsilon": 0.01}, {"kind": "gaussian", "noise_multiplier": 30.0},
            {"kind": "laplace", "epsilon": 0.01}]


@pytest.fixture
def charged(make_dataset, officer):
    ds = make_dataset(epsilon=5.0, delta=DELTA)
    entries = [ledger.charge(ds, officer, e) for e in events()]
    ledger.release(ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 1.0}))  # refunded: not in the report
    ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 0.02})  # reserved: in the state, so in the report
    return ds, entries


def test_the_issue_case_one_small_dpsgd_charge(make_dataset, officer, api):
    ds = make_dataset(epsilon=5.0, delta=DELTA)
    entry = ledger.charge(ds, officer, SMALL_SGD)
    got = api(officer).get(f"/api/ledger/{entry.pk}/").json()["charge"]["rdp"]
    assert got["epsilon"] == pytest.approx(0.0632, abs=1e-4) and got["order"] == 96  # next grid order 128
    assert got["refined_epsilon"] == pytest.approx(0.0471, abs=1e-4) and 96 < got["refined_order"] < 128
    assert got["refined_epsilon"] == pytest.approx(rdp.compose([parse_event(SMALL_SGD)], DELTA).epsilon, rel=1e-12)
    detail = api(officer).get(f"/api/datasets/{ds.name}/").json()["budget"]["accountants"]["rdp"]
    assert detail["refined_epsilon"] == pytest.approx(got["refined_epsilon"], rel=1e-12)


def test_a_datasets_detail_reports_the_refined_composition_of_its_active_entries(charged, officer, api):
    ds, _ = charged
    report = api(officer).get(f"/api/datasets/{ds.name}/").json()["budget"]["accountants"]
    r = report["rdp"]
    active = [parse_event(e) for e in events()] + [parse_event({"kind": "laplace", "epsilon": 0.02})]
    assert r["refined_epsilon"] == pytest.approx(rdp.compose(active, DELTA).epsilon, rel=1e-12)
    assert r["refined_epsilon"] < r["epsilon"]  # the grid's, from the budget row's curve
    assert r["refined_filter_price_epsilon"] == pytest.approx(r["filter_epsilon"] - r["refined_epsilon"])
    assert r["refined_filter_price_epsilon"] > r["filter_price_epsilon"]
    assert "refined_epsilon" not in report["basic"]
    # the list does not read every dataset's entries: grid figures only
    listed = api(officer).get("/api/datasets/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert "refined_epsilon" not in rows[0]["budget"]["accountants"]["rdp"]


def test_the_report_is_the_budget_rows_state_composed_off_the_grid(charged):
    ds, _ = charged
    state = Cost.from_json(Budget.objects.get(pk=ds.pk).state)
    report = limits.budget_report(state, ledger.Limit.of_dataset(ds), refined_reports.active_event(ds))
    assert report["rdp"]["epsilon"] == rdp.spent(state, DELTA).epsilon
    fresh = Dataset.objects.select_related("budget").get(pk=ds.pk)
    assert report["rdp"]["refined_epsilon"] == refined_reports.dataset_report(fresh)["rdp"]["refined_epsilon"]


def test_each_ledger_entry_and_request_shows_its_refined_charge(charged, officer, analyst, api, grant,
                                                                django_capture_on_commit_callbacks):
    ds, entries = charged
    for entry in entries:
        got = api(officer).get(f"/api/ledger/{entry.pk}/").json()["charge"]["rdp"]
        assert got["refined_epsilon"] <= got["epsilon"]
        # the event as stamped by the ledger (a Gaussian with its share of delta)
        alone = rdp.compose([parse_event(entry.event)], DELTA).epsilon
        assert got["refined_epsilon"] == pytest.approx(alone, rel=1e-12)
    grant(analyst, ds)
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": 0.05}}, format="json")
    assert r.status_code == 202, r.content
    assert "refined_epsilon" not in r.json()["charge"]["rdp"]  # not computed on the admission path
    body = client.get(f"/api/requests/{r.json()['id']}/").json()
    entry = Request.objects.get(pk=body["id"]).ledger_entry
    assert body["charge"]["rdp"]["epsilon"] == pytest.approx(entry.charge["rdp"]["epsilon"])
    assert body["charge"]["rdp"]["refined_epsilon"] <= body["charge"]["rdp"]["epsilon"]


def test_the_officers_overview_shows_the_refined_plain_composition(charged, officer, client):
    ds, _ = charged
    client.force_login(officer)
    html = client.get(f"/admin/governance/dataset/{ds.pk}/overview/").content.decode()
    fresh = Dataset.objects.select_related("budget").get(pk=ds.pk)
    refined = refined_reports.dataset_report(fresh)["rdp"]["refined_epsilon"]
    assert f"plain composition {refined:.4f}" in html
    # the audit trail: each release's rdp charge beside its refined figure
    small = next(e for e in Dataset.objects.get(pk=ds.pk).ledger.all() if e.event["kind"] == "subsampled_gaussian")
    assert f"<td>{small.charge['rdp']['epsilon']:.4f}</td>\n    <td>0.0471</td>" in html


def test_an_analysts_grant_reports_the_refined_composition_of_their_entries(make_dataset, officer, analyst,
                                                                              analyst2, grant, api):
    ds = make_dataset(epsilon=5.0, delta=DELTA)
    mine = grant(analyst, ds)
    grant(analyst2, ds)
    ledger.commit(ledger.admit(ds, analyst, SMALL_SGD))
    ledger.commit(ledger.admit(ds, analyst2, {"kind": "laplace", "epsilon": 0.5}))
    got = api(officer).get(f"/api/grants/{mine.pk}/").json()["spent"]["rdp"]
    assert got["refined_epsilon"] == pytest.approx(0.0471, abs=1e-4)  # the other analyst's release not in it
    assert got["epsilon"] == pytest.approx(0.0632, abs=1e-4)
    listed = api(officer).get("/api/grants/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert all("refined_epsilon" not in r["spent"]["rdp"] for r in rows)


def test_equal_entries_are_read_once_and_counted(make_dataset, officer, monkeypatch):
    """The overview of a dataset with many equal releases reads each distinct event once
    (100,000 Laplace entries of three kinds: 1.0 s of the page before, 0.1 s after). A
    Gaussian's stamped delta differs from entry to entry: those stay one by one."""
    ds = make_dataset(epsilon=50.0, delta=DELTA)
    kinds = [{"kind": "laplace", "epsilon": 0.01}, {"kind": "epsilon_delta", "epsilon": 0.02, "delta": 1e-9},
             {"kind": "laplace", "epsilon": 0.03}]
    for i in range(30):
        ledger.charge(ds, officer, kinds[i % 3])
    parsed = []
    real = refined_reports.ev.parse_event
    monkeypatch.setattr(refined_reports.ev, "parse_event", lambda d: parsed.append(d) or real(d))
    got = refined_reports.active_event(ds)
    assert len(parsed) == 3
    one_by_one = [parse_event(kinds[i % 3]) for i in range(30)]
    state = Cost.from_json(Budget.objects.get(dataset=ds).state)
    assert limits.refined(state, DELTA, got)["refined_epsilon"] == pytest.approx(
        rdp.compose(one_by_one, DELTA).epsilon, rel=1e-12)
