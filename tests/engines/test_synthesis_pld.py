"""PLD certification of one MST run (engines/synthesis/planner.py with the PLD code of
engines/dpsgd/pld.py): the PLD of discrete-Gaussian measurements against the analytic
Gaussian (Balle-Wang 2018) and dp_accounting; the planner's calibration (less noise than
RDP at the same target, the certificate within it, the ledger's RDP charge above it);
refusals; and one small run whose result names its certifier."""

import math

import numpy as np
import pyarrow as pa
import pytest
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from accounting import parse_event, rdp
from accounting.base import compose_events
from accounting.gaussian import gaussian_epsilon
from engines import plugins
from engines.dpsgd import pld
from engines.types import DatasetMeta, EngineRequest, PlanError

DELTA = 1e-6
COLUMNS = {
    "age": {"type": "numeric", "lower": 0, "upper": 1000, "integer": True},  # a grid histogram and a tree
    "sex": {"type": "categorical", "domain": ["F", "M"]},
    "edu": {"type": "categorical", "domain": list("abcdefgh")},
    "pid": {"type": "unit"},
}


def meta(allow=True, unit=False, n=20_000) -> DatasetMeta:
    cols = COLUMNS if unit else {k: v for k, v in COLUMNS.items() if k != "pid"}
    return DatasetMeta("t", cols, "pid" if unit else None, n, n // 4 if unit else n, DELTA, allow_pld=allow)


def plan(params, ds=None):
    return plugins.plan("synthesis", EngineRequest("synthesize", {"epsilon": 1.0, "method": "mst", **params}),
                        ds or meta())


# --------------------------------------------------------------------------- the PLD


def test_the_analytic_gaussian_published_value():
    """Balle-Wang 2018: at (epsilon 1, delta 1e-5) the analytic Gaussian needs sigma 3.73
    where the classical bound sqrt(2 log(1.25 / delta)) / epsilon needs 4.84."""
    assert gaussian_epsilon(3.7306, 1e-5) == pytest.approx(1.0, abs=2e-4)
    assert math.sqrt(2 * math.log(1.25 / 1e-5)) == pytest.approx(4.84, abs=5e-3)


@pytest.mark.parametrize("sigma,count", [(3.7306, 1), (10.0, 1), (10.0, 8), (30.0, 20)])
def test_discrete_gaussians_compose_like_the_analytic_gaussian(sigma, count):
    """k releases at sigma are one Gaussian at sigma / sqrt(k); at these scales the
    discrete Gaussian's PLD (2e-4 buckets, pessimistic) is within 0.5% of the continuous
    analytic Gaussian's exact epsilon, and of dp_accounting's continuous PLD."""
    got = pld.composition_epsilon([(sigma, count)], [], 1e-5)
    exact = gaussian_epsilon(sigma / math.sqrt(count), 1e-5)
    acc = PLDAccountant(value_discretization_interval=pld.INTERVAL)
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(sigma), count))
    assert got == pytest.approx(exact, rel=5e-3)
    assert got == pytest.approx(acc.get_epsilon(1e-5), rel=5e-3)


def test_pure_releases_compose_as_randomised_response():
    """One pure epsilon-DP release: exactly epsilon at delta 0+ (up to a bucket); ten of
    them cost less than 10 epsilon (PLD composition) and more than one."""
    assert pld.composition_epsilon([], [(0.3, 1)], 1e-9) == pytest.approx(0.3, abs=2 * pld.INTERVAL)
    ten = pld.composition_epsilon([], [(0.3, 10)], 1e-6)
    assert 0.3 < ten < 3.0
    assert pld.composition_epsilon([], [], 1e-6) == 0.0


def test_more_noise_costs_less_and_a_coarser_bucket_never_less():
    a = pld.composition_epsilon([(5.0, 4), (8.0, 3)], [(0.05, 3)], DELTA)
    b = pld.composition_epsilon([(6.0, 4), (8.0, 3)], [(0.05, 3)], DELTA)
    c = pld.composition_epsilon([(5.0, 4), (8.0, 3)], [(0.05, 3)], DELTA, pld.COARSE_INTERVAL)
    assert b < a <= c


# --------------------------------------------------------------------------- the planner


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_a_pld_plan_has_less_noise_and_records_its_certifier(eps):
    by_rdp = plan({"epsilon": eps})
    by_pld = plan({"epsilon": eps, "accountant": "pld"})
    assert by_rdp.details["certified_by"] == "rdp"
    assert by_rdp.details["certified_epsilon"] == by_rdp.details["planned_epsilon"] <= eps * (1 + 1e-12)
    d = by_pld.details
    assert d["certified_by"] == "pld" and eps * (1 - 3e-3) <= d["certified_epsilon"] <= eps
    for part in ("one_way", "two_way", "fine"):
        assert d["mst"][part]["scale"] < 0.96 * by_rdp.details["mst"][part]["scale"]
    # the certificate re-derived from the plan's own noise scales
    m = d["mst"]
    again = pld.composition_epsilon([(m["one_way"]["scale"], m["one_way_releases"]), (m["two_way"]["scale"], 2),
                                     (m["fine"]["scale"], 1)], [(m["select_epsilon"], 2)], DELTA)
    assert again == pytest.approx(d["certified_epsilon"], rel=1e-12)
    # the ledger charges the same kind of event by its RDP curve: above the certificate
    charged = compose_events(rdp, [parse_event(by_pld.event)], DELTA).epsilon
    assert d["planned_epsilon"] == pytest.approx(charged) and charged > eps


def test_the_pld_calibration_is_tight():
    """5% less noise than the planned one would not be certified at the target."""
    d = plan({"accountant": "pld"}).details
    m = d["mst"]
    tighter = pld.composition_epsilon([(0.95 * m["one_way"]["scale"], m["one_way_releases"]), (0.95 * m["two_way"]["scale"], 2),
                                       (0.95 * m["fine"]["scale"], 1)], [(m["select_epsilon"] / 0.95, 2)], DELTA)
    assert tighter > 1.0


@pytest.mark.parametrize("params,ds,says", [
    ({"accountant": "pld"}, meta(allow=False), "pld_certification"),
    ({"accountant": "pld", "method": "vae"}, meta(), "MST runs only"),
    ({"accountant": "pld"}, meta(unit=True), "one row per privacy unit"),
    ({"accountant": "zcdp"}, meta(), "must be one of"),
])
def test_pld_is_refused_where_it_is_not_valid_or_not_allowed(params, ds, says):
    with pytest.raises(PlanError) as e:
        plan(params, ds)
    assert says in e.value.errors["accountant"]


def test_one_row_per_unit_on_a_unit_dataset_is_certified():
    p = plan({"accountant": "pld", "max_rows_per_unit": 1}, meta(unit=True))
    assert p.details["certified_by"] == "pld" and p.details["certified_epsilon"] <= 1.0


# --------------------------------------------------------------------------- a run


def test_a_pld_run_names_its_certifier_in_the_result(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    table = pa.table({"age": rng.integers(18, 91, n).astype(float), "sex": rng.choice(["F", "M"], n),
                      "edu": rng.choice(list("abcdefgh"), n)})
    ds = meta(n=n)
    params = {"epsilon": 3.0, "accountant": "pld", "rows": 500, "holdout_fraction": 0.0, "columns": ["sex", "edu"]}
    p = plugins.plan("synthesis", EngineRequest("synthesize", params), ds)
    release = plugins.run("synthesis", EngineRequest("synthesize", params), ds, table, p, lambda info: None,
                          workdir=tmp_path)
    res = release.result
    assert res["certified_by"] == "pld" and res["certified_epsilon"] == p.details["certified_epsilon"] <= 3.0
    assert res["planned_epsilon"] == p.details["planned_epsilon"] > 3.0 and res["rows"] == 500
    assert release.actual_event is None  # charged as planned
