"""AIM (engines/synthesis/aim.py): it beats the independent floor on a small table, keeps
every declaration, spends exactly the zCDP its plan states (never more), and its rounds end
under any budget."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from accounting import parse_event, rdp
from accounting.base import compose_events
from engines import plugins
from engines.aggregates.noise import noisy_max
from engines.synthesis import aim, encoding, mst, report
from engines.types import DatasetMeta, EngineRequest

from .test_synthesis_declarations import SCHEMA, _loans, _run, assert_declarations_hold

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def loans():
    # a small table: 4,000 rows, 5 columns (at 2,000 one CI run in a few dozen fell to 0.38 of
    # the way, under the 0.5 then asserted; 16 runs here: 0.62-0.99 at 2,000, 0.92-1.15 at
    # 4,000; 22 more at 4,000: 0.954-1.22 and one 0.541)
    df = _loans(4000)
    syn, plan, release = _run(df, SCHEMA, 2.0, method="aim")
    return df, syn, plan, release


def test_progress_follows_the_rounds():
    """The bar moved with the budget spent alone, which annealing keeps low for most rounds
    (a probe: 0.10-0.21 for 18 of 20 minutes, then done)."""
    from .synthesis_helpers import synthesize

    seen = []
    df = _loans(1500)
    meta = DatasetMeta(name="t", columns=SCHEMA, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    synthesize(df, meta, {"method": "aim", "epsilon": 1.0, "rows": 200, "holdout_fraction": 0}, seen.append)
    rounds = [p for p in seen if "round" in p]
    assert rounds and [p["round"] for p in rounds] == list(range(1, len(rounds) + 1))
    fractions = [p["fraction"] for p in seen if "fraction" in p]
    assert fractions == sorted(fractions)
    for p in rounds:
        assert p["fraction"] >= round(0.1 + 0.7 * p["round"] / p["rounds_at_most"], 4) - 1e-9


def test_it_beats_the_independent_floor(loans):
    df, syn, _, _ = loans
    holdout = _loans(1000, seed=1)
    q = report.quality_report(df, syn, holdout, {c: dict(s) for c, s in SCHEMA.items()})["summary"]
    # clearly past the floor (0 of the way; the test): 22 runs of this fixture gave
    # 0.954-1.22 of the way overall, and one 0.541 (a second mode of AIM's selection, its
    # spread unmeasured), so a bar at 0.5 failed perhaps one CI run in 100-1,000
    assert q["bivariate_accuracy"] > q["bivariate_accuracy_floor"] + 0.25 * (
        q["bivariate_accuracy_ceiling"] - q["bivariate_accuracy_floor"])
    assert q["overall_accuracy_of_the_way"] > 0.25


def test_every_declaration_holds_exactly(loans):
    df, syn, _, _ = loans
    assert_declarations_hold(syn)
    # heavy grid values, not invented ones (a continuous draw would give next to none); ten
    # runs gave 0.919-0.961 (before and after 7ecb241, 5 each) and one CI run 0.899: the
    # line is 0.85
    assert syn["rate"].isin(df["rate"].unique()).mean() > 0.85


def test_the_plan_states_what_the_run_spends(loans):
    _, _, plan, release = loans
    d = plan.details["aim"]
    rounds = plan.event["events"][-1]
    assert rounds == {"kind": "subsampled_gaussian", "sample_rate": 1.0, "steps": 1,
                      "noise_multiplier": pytest.approx(1 / math.sqrt(2 * d["rounds_rho"]))}
    spent = release.result["rounds_rho_spent"]
    assert d["rounds_rho"] * (1 - 1e-8) <= spent <= d["rounds_rho"]  # all of it, never more
    assert 1 <= release.result["rounds"] <= d["rounds"]
    spec = plan.details["spec"]["columns"]
    assert plan.event["events"][0]["count"] == sum(encoding.one_way_releases(c) for c in spec)
    assert plan.event["events"][1]["count"] == sum(encoding.has_fine(c) for c in spec)
    assert release.result["planned_epsilon"] <= 2.0
    assert release.result["planned_epsilon"] == pytest.approx(2.0, abs=1e-6)


def test_the_rounds_event_is_the_zcdp_curve():
    """rho-zCDP is the RDP curve alpha * rho at every order: the stated event's curve."""
    from accounting.costs import subsampled_gaussian_curve
    from accounting.rdp_math import FINITE_ORDERS

    rho = 0.0123
    curve = np.asarray(subsampled_gaussian_curve(1.0, 1 / math.sqrt(2 * rho), 1))[:len(FINITE_ORDERS)]
    assert np.allclose(curve, np.asarray(FINITE_ORDERS) * rho, rtol=1e-9)


@settings(max_examples=200, deadline=None)
@given(total=st.floats(1e-12, 10.0), max_rounds=st.integers(1, 300),
       anneal=st.lists(st.booleans(), min_size=1, max_size=400),
       under=st.lists(st.floats(0.5, 1.0), min_size=1, max_size=400))
def test_the_budget_is_spent_exactly_and_never_exceeded(total, max_rounds, anneal, under):
    b = aim.Budget(total, max_rounds)
    i = 0
    while not b.final:
        share = b.next()
        if not share > 0:
            break
        # OpenDP's maps: at most the share; two of them summed in floats may pass it by an ulp
        cost = share * (1 + 2 ** -52) if b.final else share * under[i % len(under)]
        b.spend(cost, anneal[i % len(anneal)])
        i += 1
    assert b.rounds <= max_rounds
    assert b.spent <= total
    assert b.spent >= total * (1 - 2e-9)


@settings(max_examples=60, deadline=None)
@given(rho=st.floats(1e-9, 5.0), sensitivity=st.floats(0.5, 100.0))
def test_the_selection_costs_at_most_its_share(rho, sensitivity):
    scale, cost = aim.select_noise(rho, sensitivity)
    assert cost <= rho
    assert cost >= rho * (1 - 1e-6)
    assert float(noisy_max(scale, zcdp=True).map(float(sensitivity))) == cost


@settings(max_examples=25, deadline=None)
@given(eps=st.floats(0.3, 20.0), k=st.integers(1, 8), d=st.integers(2, 6))
def test_the_plan_charges_at_most_epsilon(eps, k, d):
    cols = {f"c{i}": {"type": "categorical", "domain": list("abc")} for i in range(d)}
    meta = DatasetMeta(name="t", columns={**cols, "u": {"type": "unit"}}, unit_column="u", n_rows=100_000,
                       n_units=50_000, delta=1e-7)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "aim", "epsilon": eps,
                                                                  "max_rows_per_unit": k}), meta)
    charged = compose_events(rdp, [parse_event(plan.event)], 1e-7).epsilon
    assert charged <= eps
    assert charged == pytest.approx(eps, rel=1e-4)
    assert plan.details["aim"]["sensitivity"] == k


def test_a_tiny_budget_still_terminates():
    rng = np.random.default_rng(0)
    cols = [{"column": c, "type": "categorical", "domain": list("abcd"), "nullable": False} for c in "xyz"]
    df = pd.DataFrame({c: rng.choice(list("abcd"), 500) for c in "xyz"})
    one = {"mechanism": "gaussian", "scale": 5.0, "integer": True, "vector": True, "sensitivity": 1}
    details = {"one_way": one, "rounds_rho": 1e-12, "rounds": 48, "sensitivity": 1}
    codes, info, _ = aim.synthesize(encoding.cell_encode(df, cols), cols, details, 200, lambda p: None)
    assert 1 <= info["rounds"] <= 48
    assert info["rounds_rho_spent"] <= 1e-12
    assert all(len(v) == 200 for v in codes.values())


def test_workload_weights_follow_the_reference():
    w = aim.workload(["a", "b", "c", "d"])
    assert w[("a",)] == 3 and w[("a", "b")] == 6 and len(w) == 4 + 6
    assert mst.OneWay  # the one-way measurement AIM shares with MST


@pytest.mark.parametrize("units, holdout, extra, meta_extra, want", [
    (10_000, 0.2, {}, {}, "aim"),  # 8,000 training units
    (6_000, 0.2, {}, {}, "mst"),  # 4,800
    (6_000, 0.0, {}, {}, "aim"),  # 6,000
    (10_000, 0.2, {"accountant": "pld"}, {"allow_pld": True}, "mst"),  # pld certifies MST only
    (10_000, 0.2, {}, {"distributed": True}, "mst"),  # MST counts on the cluster; AIM would read every row
    (10_000, 0.2, {"method": "mst"}, {}, "mst"),  # a method named is kept
    (100, 0.2, {"method": "aim"}, {}, "aim"),
])
def test_the_default_method_follows_the_measurement(units, holdout, extra, meta_extra, want):
    """No method named: AIM from 5,000 training units (where the bench measured it ahead of
    MST), MST below, and where AIM does not apply."""
    schema = {c: SCHEMA[c] for c in ("amount", "grade", "emp")}
    ds = DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=units, n_units=units, delta=1e-6,
                     **meta_extra)
    params = {"epsilon": 8.0, "holdout_fraction": holdout, **extra}
    plan = plugins.plan("synthesis", EngineRequest("synthesize", params), ds)
    spec = plan.details["spec"]
    assert spec["method"] == want and spec["method_auto"] == ("method" not in extra)
    assert want in plan.details


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_cols=st.integers(2, 7), n_cliques=st.integers(0, 9))
def test_a_pair_marginal_by_elimination_equals_one_contraction_of_every_clique(seed, n_cols, n_cliques):
    """``_pair_marginal`` sums the other columns out one at a time; the answer is the one
    einsum over every clique (loops, columns apart, columns in no clique)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    cols = [f"c{i}" for i in range(n_cols)]
    size = {c: int(rng.integers(1, 5)) for c in cols}
    cliques = list({tuple(sorted(rng.choice(cols, int(rng.integers(1, min(n_cols, 3) + 1)), replace=False))) for _ in range(n_cliques)})
    tables = {cl: SimpleNamespace(values=rng.normal(0, 2, [size[c] for c in cl])) for cl in cliques}
    pot = SimpleNamespace(domain=type("D", (), {"attributes": cols, "__getitem__": lambda self, c: size[c]})(),
                          cliques=cliques, tables=tables)
    model = SimpleNamespace(potentials=pot, total=1234.0)
    a, b = rng.choice(cols, 2, replace=False)
    letter = {c: chr(ord("a") + i) for i, c in enumerate(cols)}
    ops = [np.exp(t.values - t.values.max()) for t in tables.values()] + [np.ones(size[a]), np.ones(size[b])]
    subs = ["".join(letter[c] for c in cl) for cl in cliques] + [letter[a], letter[b]]
    want = np.einsum(",".join(subs) + "->" + letter[a] + letter[b], *ops).ravel()
    got = aim._pair_marginal(model, a, b)
    np.testing.assert_allclose(got, want / want.sum() * 1234.0, rtol=1e-9, atol=1e-9)


def test_a_pair_marginal_of_a_model_with_more_factors_than_einsum_takes():
    """A 66-column table's AIM failed after reading its data (numpy's einsum takes at most
    64 operands: a scalar factor was left for each column no pair joined; a probe). Here 70
    leaves hang off ``a`` (70 factors on ``a`` after elimination) and 60 columns stand apart."""
    from types import SimpleNamespace

    rng = np.random.default_rng(11)
    leaves, apart = [f"l{i}" for i in range(70)], [f"s{i}" for i in range(60)]
    cols = ["a", "b", *leaves, *apart]
    size = {c: 3 for c in cols}
    cliques = [("a", "b")] + [("a", leaf) for leaf in leaves] + [(c,) for c in apart]
    tables = {cl: SimpleNamespace(values=rng.normal(0, 1, [3] * len(cl))) for cl in cliques}
    pot = SimpleNamespace(domain=type("D", (), {"attributes": cols, "__getitem__": lambda self, c: size[c]})(),
                          cliques=cliques, tables=tables)
    want = np.exp(tables[("a", "b")].values)
    for leaf in leaves:
        want = want * np.exp(tables[("a", leaf)].values).sum(axis=1)[:, None]
    got = aim._pair_marginal(SimpleNamespace(potentials=pot, total=500.0), "a", "b")
    np.testing.assert_allclose(got, want.ravel() / want.sum() * 500.0, rtol=1e-9)


def test_a_refit_fits_a_sharp_marginal_just_measured_before_it_is_scored_again():
    """A pair whose rows lie near its diagonal (60 x 60 cells, 20,000 rows), measured at sd 2:
    one block of ROUND_ITERS warm-started steps leaves the model 6.6 times the noise off it,
    so the next selection found it worst again (diamonds: 13 rounds of 13 on three such
    pairs). ``_refit`` fits it to about what the noise explains."""
    mbi, MirrorDescent = mst._mbi()
    k, n, sd = 60, 20_000, 2.0
    rng = np.random.default_rng(0)
    a = rng.integers(0, k, n)
    b = np.clip(a + rng.integers(-1, 2, n), 0, k - 1)
    domain = mbi.Domain(["a", "b"], [k, k])
    ms = [mbi.LinearMeasurement(np.bincount(v, minlength=size) + rng.normal(0, sd, size), cl, stddev=sd)
          for v, size, cl in ((a, k, ("a",)), (b, k, ("b",)), (a * k + b, k * k, ("a", "b")))]
    est = MirrorDescent()
    start = est.estimate(domain, ms[:2], known_total=n, iters=aim.ROUND_ITERS)
    one_block = est.estimate(domain, ms, known_total=n, iters=aim.ROUND_ITERS, warm_start=start)
    assert aim._off(one_block, ms[2]) > 2  # what the rounds saw before
    assert aim._off(aim._refit(est, domain, ms, n, start, [ms[2]]), ms[2]) <= 1.5


def test_past_its_deadline_the_next_round_is_the_last_and_spends_the_whole_budget():
    """A wide table's rounds slow as the model grows (40 binary columns: 6-9 s a round by
    round 80, of up to 640): past ``rounds_seconds`` one last round spends what is left, so
    the run ends inside the worker's time limit, charged as planned, with its table."""
    b = aim.Budget(1.0, 100, seconds=0.0)
    assert b.next() == pytest.approx(1.0) and b.final
    rng = np.random.default_rng(0)
    cols = [{"column": c, "type": "categorical", "domain": list("abcd"), "nullable": False} for c in "xyz"]
    df = pd.DataFrame({c: rng.choice(list("abcd"), 500) for c in "xyz"})
    one = {"mechanism": "gaussian", "scale": 5.0, "integer": True, "vector": True, "sensitivity": 1}
    details = {"one_way": one, "rounds_rho": 0.5, "rounds": 48, "rounds_seconds": 0.0, "sensitivity": 1}
    codes, info, _ = aim.synthesize(encoding.cell_encode(df, cols), cols, details, 200, lambda p: None)
    assert info["rounds"] == 1 and 0.5 * (1 - 1e-6) <= info["rounds_rho_spent"] <= 0.5
    assert all(len(v) == 200 for v in codes.values())
    details.pop("rounds_seconds")  # a plan made before the allowance: no deadline
    assert aim.synthesize(encoding.cell_encode(df, cols), cols, details, 200, lambda p: None)[1]["rounds"] > 1
