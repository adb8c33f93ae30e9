"""Plans of DP-SGD requests (engines/dpsgd/planner.py): the event is the subsampled
Gaussian of the run composed with the evaluations' Laplace releases, the sampling rate
counts privacy units (not rows), and the ledger's own composition of the planned event
is the target epsilon. No data read, no torch."""

import json
import math
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines import plugins
from engines.dpsgd import calibrate
from engines.dpsgd.intervals import ALPHA_EACH, expected_halfwidth
from engines.dpsgd.params import DEFAULT_EVAL_SHARE, MAX_EVAL_SHARE
from engines.dpsgd.planner import (EVAL_HALFWIDTH, EVAL_SENSITIVITY, FINAL_SHARE, USELESS_HALFWIDTH, eval_share,
                                   halfwidth_at)
from engines.types import EngineRequest, Plan
from tests.engines.dpsgd_helpers import DELTA, GENEROUS, ledger_epsilon, rows_meta, units_meta

FIXED = {"target": "y", "features": ["x1", "x2", "c"], "noise_multiplier": 1.3, "epochs": 4, "batch_size": 32}


def plan(params, ds=None, kind="train") -> Plan:
    p = plugins.plan("dpsgd", EngineRequest(kind, params), ds or rows_meta())
    return Plan(**json.loads(json.dumps(asdict(p))))  # stored as JSON by the service


def test_the_event_is_the_subsampled_gaussian_composed_with_the_evaluations():
    p = plan(FIXED)
    q = 32 / 1600  # batch / training units (2000 rows, 20% held out)
    steps = round(1 / q) * 4
    sg, evals, final = p.event["events"]
    assert p.event["kind"] == "composed"
    assert sg == {"kind": "subsampled_gaussian", "sample_rate": pytest.approx(q, rel=1e-12), "noise_multiplier": 1.3,
                  "steps": steps}
    # Default evaluation budget with a given noise multiplier: 0.1, half of it for the final
    # evaluation, the other half over the 3 epochs before the last (OpenDP may round down).
    assert evals["kind"] == "self_composed" and evals["count"] == 3 and evals["event"]["kind"] == "laplace"
    assert 0.05 / 3 * 0.99 <= evals["event"]["epsilon"] <= 0.05 / 3
    assert final["kind"] == "laplace" and 0.05 * 0.99 <= final["epsilon"] <= 0.05
    d = p.details
    assert d["sample_rate"] == pytest.approx(q) and d["steps"] == steps and d["steps_per_epoch"] == steps // 4
    assert p.columns == ["x1", "x2", "c", "y"]
    run = d["runs"][0]
    assert run["noise_multiplier"] == 1.3 and run["evals"] == 3
    assert run["planned_epsilon"] == pytest.approx(calibrate.epsilon(q, 1.3, steps, run["eval_epsilon_each"], 3, DELTA,
                                                                     run["final_eval_epsilon"]))
    assert run["planned_epsilon"] == pytest.approx(ledger_epsilon(p.event), rel=1e-9)


def test_no_evaluation_budget_plans_the_subsampled_gaussian_alone():
    p = plan({**FIXED, "eval_epsilon": 0})
    assert p.event["kind"] == "subsampled_gaussian" and p.details["runs"][0]["evals"] == 0


def test_the_planned_epsilon_is_the_target_in_the_ledger():
    p = plan(GENEROUS)
    eps = ledger_epsilon(p.event)
    assert 0.99 * 8.0 <= eps <= 8.0 * (1 + 1e-9)
    run = p.details["runs"][0]
    assert run["target_epsilon"] == 8.0 and run["planned_epsilon"] == pytest.approx(eps, rel=1e-9)
    # The evaluations take their share (2.0: 1.0 for the final one, 1.0 over the 2 epochs
    # before the last) inside the target.
    sg, ev, final = p.event["events"]
    assert ev["count"] == 2 and ev["event"]["epsilon"] == pytest.approx(0.5, rel=0.01)
    assert final["epsilon"] == pytest.approx(1.0, rel=0.01)
    assert ledger_epsilon(sg) < eps
    assert sg["sample_rate"] == pytest.approx(64 / 1600) and sg["steps"] == 75


def test_the_sampling_rate_counts_privacy_units_not_rows():
    params = {**FIXED, "max_rows_per_unit": 4}
    few = plan(params, units_meta(n_units=500))
    many = plan(params, units_meta(n_units=1000))  # the same 2,000 rows, more units
    assert few.details["sample_rate"] == pytest.approx(32 / 400)
    assert many.details["sample_rate"] == pytest.approx(32 / 800)
    assert few.event["events"][0]["sample_rate"] != many.event["events"][0]["sample_rate"]
    assert few.details["steps_per_epoch"] == round(400 / 32) and many.details["steps_per_epoch"] == 25
    # Rows do not matter once units are given.
    assert plan(params, replace(units_meta(n_units=500), n_rows=10_000)).event == few.event
    # The spec records units and the bound on rows per unit.
    spec = few.details["spec"]
    assert (spec["n_units"], spec["n_train_units"], spec["unit_column"], spec["max_rows_per_unit"]) == (
        500, 400, "pid", 4)


def test_with_a_target_more_units_need_less_noise():
    # Same target, same batch: a smaller sampling rate amplifies privacy more.
    params = {**{k: v for k, v in FIXED.items() if k != "noise_multiplier"}, "target_epsilon": 3.0, "epochs": 1}
    z_few = plan(params, units_meta(n_units=500)).details["runs"][0]["noise_multiplier"]
    z_many = plan(params, units_meta(n_units=1000)).details["runs"][0]["noise_multiplier"]
    assert z_many < z_few


def test_the_plan_describes_the_model_and_its_fixes():
    p = plan({**FIXED, "model": {"hidden": [8], "norm": "batchnorm"}})
    assert p.details["model"] == "Linear(5->8) GroupNorm(4) relu Linear(8->1)"
    assert p.details["n_parameters"] == 5 * 8 + 8 + 2 * 8 + 8 + 1
    assert len(p.details["model_fixes"]) == 1 and "BatchNorm" in p.details["model_fixes"][0]


# ---------------------------------------------------------------- the evaluations' default share


@settings(deadline=None)
@given(target=st.floats(0.05, 50), epochs=st.integers(1, 100), n_test=st.integers(0, 10**7))
def test_the_default_share_is_the_least_that_states_the_aimed_halfwidth_within_its_bounds(target, epochs, n_test):
    share = eval_share(target, epochs, n_test)
    low, high = DEFAULT_EVAL_SHARE * target, MAX_EVAL_SHARE * target
    assert low <= share <= high
    final = share * (FINAL_SHARE if epochs > 1 else 1.0)  # the final evaluation's
    t = EVAL_SENSITIVITY * math.log(1 / ALPHA_EACH) / final  # Laplace's bound at that share
    halfwidth = expected_halfwidth(t, n_test)
    useless = halfwidth_at(high, epochs, n_test) >= USELESS_HALFWIDTH
    if useless:  # the most the default gives buys nothing useful: the least is spent
        assert share == low
    elif share < high:  # not capped: the interval it states is the aimed one
        assert halfwidth <= EVAL_HALFWIDTH * (1 + 1e-6)
    if share > low:  # not floored: no less would do
        assert halfwidth >= EVAL_HALFWIDTH * (1 - 1e-6)
    assert useless or eval_share(target, epochs, 2 * n_test + 1) <= share  # a larger holdout never needs more


def test_a_holdout_too_small_for_a_useful_interval_gets_the_least_share():
    """A probe's 62 held-out units at epsilon 1, 5 epochs: 25% of epsilon for an interval
    of half-width 0.5, [0, 1] in 3 runs of 3. The least share is spent instead."""
    assert halfwidth_at(MAX_EVAL_SHARE, 5, 62) >= USELESS_HALFWIDTH
    assert eval_share(1.0, 5, 62) == pytest.approx(DEFAULT_EVAL_SHARE)
    between = next(n for n in range(62, 100_000, 7) if halfwidth_at(MAX_EVAL_SHARE, 5, n) < USELESS_HALFWIDTH)
    assert eval_share(1.0, 5, between) == pytest.approx(MAX_EVAL_SHARE)  # still capped, still useful


def test_a_plan_without_eval_epsilon_states_the_aimed_halfwidth_inside_its_target():
    ds = rows_meta(n=50_000)  # 10,000 held-out units: the share for 0.05 is inside its bounds
    params = {"target": "y", "features": ["x1", "x2", "c"], "target_epsilon": 1.0, "epochs": 3, "batch_size": 1000}
    p = plan(params, ds)
    run = p.details["runs"][0]
    assert run["eval_ci95_halfwidth"] == pytest.approx(EVAL_HALFWIDTH, rel=1e-3)
    share = eval_share(1.0, 3, 10_000)
    assert DEFAULT_EVAL_SHARE < share < MAX_EVAL_SHARE
    spent = run["eval_epsilon_each"] * 2 + run["final_eval_epsilon"]
    assert spent == pytest.approx(share, rel=1e-3)  # OpenDP may round the scale
    assert run["final_eval_epsilon"] == pytest.approx(share * FINAL_SHARE, rel=1e-3)
    assert run["planned_epsilon"] == pytest.approx(ledger_epsilon(p.event), rel=1e-9)
    assert run["planned_epsilon"] <= 1.0 * (1 + 1e-9)
    # a small holdout gets the most the default gives (0.25 of the target), a wider interval
    small = plan(params, rows_meta()).details["runs"][0]
    assert small["eval_epsilon_each"] * 2 + small["final_eval_epsilon"] == pytest.approx(MAX_EVAL_SHARE, rel=1e-3)
    assert small["eval_ci95_halfwidth"] > EVAL_HALFWIDTH
    # given, it is kept
    given_ = plan({**params, "eval_epsilon": 0.05}, ds).details["runs"][0]
    assert given_["eval_epsilon_each"] * 2 + given_["final_eval_epsilon"] == pytest.approx(0.05, rel=1e-3)
