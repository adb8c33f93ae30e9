"""Pure composition maths: POST /api/compose/ (no ledger)."""

import pytest

from governance.models import LedgerEntry

from .conftest import assert_error

URL = "/api/compose/"
pytestmark = pytest.mark.django_db


def test_it_composes_under_every_accountant(api, analyst):
    events = [{"kind": "laplace", "epsilon": 0.1}] * 10
    r = api(analyst).post(URL, {"events": events, "delta": 1e-6}, format="json")
    assert r.status_code == 200, r.json()
    body = r.json()
    assert set(body) == {"basic", "advanced", "rdp"}
    assert body["basic"]["epsilon"] == pytest.approx(1.0)
    for name in body:
        assert 0 < body[name]["epsilon"] <= 1.0 + 1e-9
        assert 0 <= body[name]["delta"] <= 1e-6 + 1e-18
    assert "order" in body["rdp"]


def test_it_composes_one_event(api, officer):
    body = api(officer).post(URL, {"events": {"kind": "laplace", "epsilon": 0.5}, "delta": 0}, format="json").json()
    assert body["basic"] == {"epsilon": 0.5, "delta": 0}


def test_it_composes_gaussians(api, analyst):
    events = [{"kind": "gaussian", "noise_multiplier": 2.0}, {"kind": "subsampled_gaussian", "sample_rate": 0.01,
                                                            "noise_multiplier": 1.1, "steps": 1000}]
    r = api(analyst).post(URL, {"events": events, "delta": 1e-5}, format="json")
    assert r.status_code == 200, r.json()
    body = r.json()
    assert body["rdp"]["epsilon"] <= body["basic"]["epsilon"]


def test_it_composes_nothing_to_zero(api, analyst):
    body = api(analyst).post(URL, {"events": [], "delta": 1e-6}, format="json").json()
    assert all(v["epsilon"] == 0 for v in body.values())


def test_it_reports_a_non_private_release_as_infinite(api, analyst):
    r = api(analyst).post(URL, {"events": [{"kind": "non_private"}], "delta": 1e-6}, format="json")
    assert r.status_code == 200, r.json()
    assert all(v["epsilon"] == "inf" for v in r.json().values())


def test_it_writes_nothing(api, officer, make_dataset):
    make_dataset("clinic")
    api(officer).post(URL, {"events": [{"kind": "laplace", "epsilon": 5}], "delta": 1e-6}, format="json")
    assert LedgerEntry.objects.count() == 0


@pytest.mark.parametrize("events", [
    [{"kind": "cauchy"}],
    [{"kind": "laplace", "epsilon": "NaN"}],
    [{"kind": "laplace", "epsilon": -1}],
    [{"kind": "laplace"}],
    [{"kind": "laplace", "epsilon": 0.1}, "laplace"],
    [{"kind": "gaussian", "noise_multiplier": 1, "delta": 2}],
    "laplace",
    7,
    None,
    [{"kind": "laplace", "epsilon": 0.1}] * 2001,
    # valid one by one, but their deltas add up past 1: a composition that guarantees nothing
    [{"kind": "epsilon_delta", "epsilon": 0.5, "delta": 0.9}] * 2,
    [{"kind": "self_composed", "count": 3, "event": {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 0.4}}],
])
def test_it_refuses_bad_events(api, analyst, events):
    r = api(analyst).post(URL, {"events": events, "delta": 1e-6}, format="json")
    assert_error(r, 400, "request.invalid" if events is None else "event.invalid")


@pytest.mark.parametrize("data", [
    {"events": [{"kind": "no_op"}]},
    {"events": [{"kind": "no_op"}], "delta": 1},
    {"events": [{"kind": "no_op"}], "delta": -1e-6},
    {"events": [{"kind": "no_op"}], "delta": "NaN"},
    {"events": [{"kind": "no_op"}], "delta": "tiny"},
    {"delta": 1e-6},
])
def test_it_refuses_a_bad_request(api, analyst, data):
    assert_error(api(analyst).post(URL, data, format="json"), 400, "request.invalid")


def test_it_refuses_get(api, analyst):
    assert_error(api(analyst).get(URL), 405, "method.not_allowed")


# ------------------------------------------------------------------ bounded work (issue 22)


def _distinct(n):
    return [{"kind": "subsampled_gaussian", "sample_rate": 0.001 + i * 1e-5, "noise_multiplier": 1.0 + i * 1e-3,
             "steps": 100} for i in range(n)]


@pytest.fixture
def series(monkeypatch):
    """Opacus's series with its terms counted, and no curve cached."""
    from accounting import rdp_math
    from tests.accounting.test_work import SeriesCounter

    rdp_math._one_step_curve.cache_clear()
    rdp_math._SERIES.clear()
    return SeriesCounter(monkeypatch)


def test_the_documented_maximum_of_distinct_subsampled_events_is_refused_before_any_series(api, analyst, series):
    """2,000 distinct subsampled Gaussians held a web worker for about 200 CPU seconds."""
    from accounting import work

    r = api(analyst).post(URL, {"events": _distinct(2000), "delta": 1e-5}, format="json")
    body = assert_error(r, 400, "request.too_costly")
    assert body["max_work_units"] == work.MAX_UNITS and body["work_units"] > work.MAX_UNITS
    assert f"{work.MAX_UNITS:,}" in body["detail"]
    assert series.orders == 0  # not one order of one curve was computed


def test_a_call_within_the_budget_runs_at_most_its_budget(api, analyst, series):
    from accounting import work

    r = api(analyst).post(URL, {"events": _distinct(8), "delta": 1e-5}, format="json")
    assert r.status_code == 200, r.json()
    assert 0 < series.units + work.PER_ORDER * series.orders <= work.MAX_UNITS


def test_the_documented_maximum_of_equal_subsampled_events_is_one_curve(api, analyst, series):
    event = {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000}
    r = api(analyst).post(URL, {"events": [event] * 2000, "delta": 1e-5}, format="json")
    assert r.status_code == 200, r.json()
    from accounting import rdp_math

    # one (q, z): the grid's 56 orders and the refinement's 1 + 2 x 33, no more
    assert series.orders <= len(rdp_math.FINITE_ORDERS) + 1 + 2 * 33
    one = api(analyst).post(URL, {"events": [dict(event, steps=2_000_000)], "delta": 1e-5}, format="json").json()
    assert r.json()["rdp"] == one["rdp"]


def test_a_repeated_composition_runs_no_series_again(api, analyst, series):
    events = _distinct(3)
    first = api(analyst).post(URL, {"events": events, "delta": 1e-5}, format="json").json()
    before = series.orders
    second = api(analyst).post(URL, {"events": events, "delta": 1e-5}, format="json").json()
    assert before > 0 and series.orders == before  # every curve cached, per (q, z, order)
    assert first == second


@pytest.mark.parametrize("z", [1.5e154, 1e300, 1.0000001e12])
def test_a_noise_multiplier_past_the_largest_is_a_400(api, analyst, z):
    """A noise multiplier past ~1.4e154 with q = 1 and 2 steps: every 1/z^2 underflowed to 0
    and the collapse divided by zero, a 500 for any signed-in user (a helper's probe); then
    an officer's charge of one was accepted and the export's check tool could not recompose
    it (z^2 overflows in dp_accounting). Past MAX_NOISE_MULTIPLIER (1e12) it is refused."""
    event = {"kind": "subsampled_gaussian", "sample_rate": 1.0, "noise_multiplier": z, "steps": 2}
    for events in ([event], [{"kind": "gaussian", "noise_multiplier": z}]):
        r = api(analyst).post(URL, {"events": events, "delta": 1e-6}, format="json")
        assert r.status_code == 400 and "noise_multiplier" in r.json()["detail"], r.content


def test_the_largest_noise_multiplier_composes_to_about_zero(api, analyst):
    z = 1e12
    event = {"kind": "subsampled_gaussian", "sample_rate": 1.0, "noise_multiplier": z, "steps": 2}
    r = api(analyst).post(URL, {"events": [event, {"kind": "gaussian", "noise_multiplier": z}], "delta": 1e-6},
                          format="json")
    assert r.status_code == 200, r.content
    assert all(0 <= v["epsilon"] < 0.01 for v in r.json().values())  # what delta and the orders allow
