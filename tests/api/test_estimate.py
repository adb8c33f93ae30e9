"""What a request would cost, whether the gate would admit it, how many more fit."""

import pytest

from governance.ledger import actions as ledger
from governance.core.errors import BudgetExceeded
from governance.models import Budget, Grant, LedgerEntry

from .conftest import assert_error

pytestmark = pytest.mark.django_db
LAPLACE = {"kind": "laplace", "epsilon": 0.1}


def url(name="clinic"):
    return f"/api/datasets/{name}/estimate/"


@pytest.fixture
def clinic(make_dataset):
    return make_dataset("clinic", epsilon=1.0)


def test_it_estimates_one_event_under_every_accountant(api, officer, clinic):
    r = api(officer).post(url(), {"event": LAPLACE}, format="json")
    assert r.status_code == 200, r.json()
    body = r.json()
    assert len(body["events"]) == 1
    assert body["events"][0]["event"] == LAPLACE
    charge = body["events"][0]["charge"]
    assert set(charge) == {"basic", "advanced", "rdp"}
    assert charge["basic"]["epsilon"] == pytest.approx(0.1)
    assert body["total"] == charge
    assert body["would_admit"] is True
    assert body["has_grant"] is False  # officers need none
    assert set(body["budget"]) == {"dataset"}
    assert body["budget"]["dataset"]["rdp"]["gates"] is True


def test_it_estimates_a_list_of_events(api, officer, clinic):
    events = [LAPLACE, {"kind": "laplace", "epsilon": 0.2}, {"kind": "gaussian", "noise_multiplier": 10.0}]
    body = api(officer).post(url(), {"events": events}, format="json").json()
    assert len(body["events"]) == 3
    assert body["events"][1]["charge"]["basic"]["epsilon"] == pytest.approx(0.2)
    assert body["events"][2]["event"]["delta"] > 0  # stamped as the gate would
    per_event = sum(e["charge"]["basic"]["epsilon"] for e in body["events"])
    assert body["total"]["basic"]["epsilon"] == pytest.approx(per_event)


def test_it_estimates_for_an_analyst_with_a_grant(api, analyst, clinic, grant):
    grant(analyst, clinic, cap_epsilon=0.5)
    body = api(analyst).post(url(), {"event": LAPLACE}, format="json").json()
    assert body["has_grant"] is True and body["would_admit"] is True
    assert set(body["budget"]) == {"dataset", "grant"}
    assert body["budget"]["grant"]["rdp"]["remaining_epsilon"] == pytest.approx(0.5)
    assert body["fits"] <= 5


@pytest.mark.parametrize("policy", ["basic", "advanced", "rdp"])
def test_it_counts_how_many_requests_still_fit(api, officer, make_dataset, policy):
    make_dataset("clinic", epsilon=1.0, policy=policy)
    client = api(officer)
    fits = client.post(url(), {"event": LAPLACE}, format="json").json()["fits"]
    assert 5 <= fits <= 20
    if policy == "basic":
        assert fits == 10
    for i in range(fits):
        r = client.post("/api/datasets/clinic/charges/", {"event": LAPLACE}, format="json")
        assert r.status_code == 201, (i, r.json())
    assert_error(client.post("/api/datasets/clinic/charges/", {"event": LAPLACE}, format="json"),
                 409, "budget.exceeded")
    body = client.post(url(), {"event": LAPLACE}, format="json").json()
    assert body["fits"] == 0 and body["would_admit"] is False


def test_it_counts_what_fits_after_earlier_charges(api, officer, clinic):
    client = api(officer)
    first = client.post(url(), {"event": LAPLACE}, format="json").json()["fits"]
    client.post("/api/datasets/clinic/charges/", {"event": {"kind": "laplace", "epsilon": 0.3}}, format="json")
    later = client.post(url(), {"event": LAPLACE}, format="json").json()["fits"]
    assert 0 < later < first


def test_it_counts_what_fits_within_an_analysts_cap(api, analyst, clinic, grant):
    grant(analyst, clinic, cap_epsilon=0.3)
    fits = api(analyst).post(url(), {"event": LAPLACE}, format="json").json()["fits"]
    assert fits >= 1
    for _ in range(fits):
        ledger.admit(clinic, analyst, LAPLACE)
    with pytest.raises(BudgetExceeded) as e:
        ledger.admit(clinic, analyst, LAPLACE)
    assert e.value.extra["scope"] == "grant"


def test_it_says_no_when_it_would_not_fit(api, officer, clinic):
    body = api(officer).post(url(), {"event": {"kind": "laplace", "epsilon": 1.5}}, format="json").json()
    assert body["would_admit"] is False and body["fits"] == 0


def test_it_says_no_for_a_non_private_release(api, officer, clinic):
    r = api(officer).post(url(), {"event": {"kind": "non_private"}}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["would_admit"] is False and r.json()["total"]["basic"]["epsilon"] == "inf"
    # beside a Gaussian-type event (which needs the dataset's delta to be priced): a no, not a 400
    mixed = {"kind": "composed", "events": [{"kind": "gaussian", "noise_multiplier": 3}, {"kind": "non_private"}]}
    r = api(officer).post(url(), {"event": mixed}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["would_admit"] is False and r.json()["total"]["basic"]["epsilon"] == "inf"


def test_it_says_no_on_a_draft(api, officer, make_dataset):
    make_dataset("clinic", activate=False)
    body = api(officer).post(url(), {"event": LAPLACE}, format="json").json()
    assert body["would_admit"] is False
    assert_error(api(officer).post("/api/datasets/clinic/charges/", {"event": LAPLACE}, format="json"),
                 409, "dataset.inactive")


def test_it_reports_no_limit_for_a_no_op(api, officer, clinic):
    body = api(officer).post(url(), {"event": {"kind": "no_op"}}, format="json").json()
    assert body["would_admit"] is True and body["fits"] is None


def test_it_writes_nothing(api, officer, analyst, clinic, grant):
    g = grant(analyst, clinic, cap_epsilon=0.5)
    ledger.admit(clinic, analyst, LAPLACE)
    before = (LedgerEntry.objects.count(), Budget.objects.get(pk=clinic.pk).state, Grant.objects.get(pk=g.pk).state)
    for client in (api(officer), api(analyst)):
        for data in ({"event": LAPLACE}, {"events": [LAPLACE] * 3}, {"event": {"kind": "laplace", "epsilon": 5}}):
            assert client.post(url(), data, format="json").status_code == 200
    after = (LedgerEntry.objects.count(), Budget.objects.get(pk=clinic.pk).state, Grant.objects.get(pk=g.pk).state)
    assert after == before


def test_it_says_no_to_an_analyst_whose_grant_was_revoked(api, analyst, clinic, grant):
    from django.utils import timezone

    g = grant(analyst, clinic)
    assert api(analyst).post(url(), {"event": LAPLACE}, format="json").json()["would_admit"] is True
    Grant.objects.filter(pk=g.pk).update(revoked_at=timezone.now())
    assert_error(api(analyst).post(url(), {"event": LAPLACE}, format="json"), 404)


@pytest.mark.parametrize("data", [
    {},
    {"event": LAPLACE, "events": [LAPLACE]},
    {"event": {"kind": "nope"}},
    {"event": {"kind": "laplace", "epsilon": "NaN"}},
    {"events": [LAPLACE, {"kind": "laplace", "epsilon": -1}]},
    {"events": "many"},
    {"events": [[LAPLACE]]},
    {"events": [LAPLACE] * 2001},
])
def test_it_refuses_bad_input(api, officer, clinic, data):
    r = api(officer).post(url(), data, format="json")
    assert_error(r, 400)
    if "event" in data and "events" not in data or "events" in data and "event" not in data:
        assert r.json()["code"] == "event.invalid"


def test_it_accepts_an_empty_list(api, officer, clinic):
    r = api(officer).post(url(), {"events": []}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["events"] == [] and r.json()["would_admit"] is True


def test_it_refuses_events_too_costly_to_price_before_pricing_any(api, officer, clinic, monkeypatch):
    """Bounded work (issue 22): 2,000 distinct subsampled Gaussians would take minutes."""
    from accounting import rdp_math, work
    from tests.accounting.test_work import SeriesCounter

    rdp_math._one_step_curve.cache_clear()
    rdp_math._SERIES.clear()
    series = SeriesCounter(monkeypatch)
    events = [{"kind": "subsampled_gaussian", "sample_rate": 0.001 + i * 1e-5, "noise_multiplier": 1.0 + i * 1e-3,
               "steps": 100} for i in range(2000)]
    body = assert_error(api(officer).post(url(), {"events": events}, format="json"), 400, "request.too_costly")
    assert body["max_work_units"] == work.MAX_UNITS
    assert series.orders == 0
    assert LedgerEntry.objects.count() == 0
    # the same pair 2,000 times is one curve
    same = [events[0]] * 2000
    r = api(officer).post(url(), {"events": same}, format="json")
    assert r.status_code == 200, r.json()
    assert series.orders <= len(rdp_math.FINITE_ORDERS)
