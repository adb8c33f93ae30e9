"""The canary audit (engines/dpsgd/audit.py): the one-run p-value and lower bound of
Steinke, Nasr & Jagielski 2023 behave as a confidence bound (large when every guess is
right, zero at chance, looser with delta, monotone, valid under randomised response),
and end to end the attack finds an overfit non-private model and stays below the
claimed epsilon of a DP one."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from engines.dpsgd import audit, calibrate, train
from engines.dpsgd.params import validate
from tests.engines.dpsgd_helpers import make_table, one_thread, rows_meta  # noqa: F401  (autouse)


def test_all_guesses_right_on_many_canaries_gives_a_large_bound():
    # 200 of 200 right at beta = 0.05: p^200 < 0.05 needs p > 0.985, eps > log(0.985 / 0.015) = 4.2.
    bound = audit.epsilon_lower_bound(1000, 200, 200, 0.0)
    assert bound == pytest.approx(math.log(0.05 ** (-1 / 200) - 1) * -1, rel=1e-6)
    assert bound > 4
    assert audit.epsilon_lower_bound(10_000, 2000, 2000, 0.0) > bound  # more evidence, larger bound


@pytest.mark.parametrize("r", [20, 200, 2000])
def test_chance_level_gives_zero(r):
    assert audit.epsilon_lower_bound(5 * r, r, r // 2, 0.0) == 0.0
    assert audit.epsilon_lower_bound(5 * r, r, r // 2, 1e-5) == 0.0
    assert audit.epsilon_lower_bound(5 * r, r, 0, 0.0) == 0.0  # all wrong is no evidence either
    assert audit.epsilon_lower_bound(0, 0, 0, 0.0) == 0.0


def test_delta_makes_the_bound_lower():
    for m, r, v in [(1000, 200, 200), (1000, 200, 170), (500, 100, 80)]:
        pure = audit.epsilon_lower_bound(m, r, v, 0.0)
        approx = audit.epsilon_lower_bound(m, r, v, 1e-4)
        assert 0 < approx < pure
        assert audit.epsilon_lower_bound(m, r, v, 1e-3) < approx


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r=st.integers(1, 300), frac=st.floats(0, 1), delta=st.sampled_from([0.0, 1e-6, 1e-4]))
def test_the_bound_is_monotone_in_correct_guesses_and_is_where_the_p_value_crosses_beta(r, frac, delta):
    m = 4 * r
    v = int(frac * r)
    lo, hi = audit.epsilon_lower_bound(m, r, v, delta), audit.epsilon_lower_bound(m, r, min(v + 1, r), delta)
    assert lo <= hi
    if lo > 0:
        assert audit.p_value(m, r, v, lo, delta) < audit.BETA
        assert audit.p_value(m, r, v, lo * 1.001 + 1e-6, delta) >= audit.BETA * 0.999


@settings(max_examples=30, deadline=None)
@given(r=st.integers(1, 200), frac=st.floats(0, 1), eps=st.floats(0, 5), delta=st.floats(0, 1e-3))
def test_p_value_is_the_binomial_tail_plus_the_delta_term(r, frac, eps, delta):
    m, v = 3 * r, int(frac * r)
    p = 1 / (1 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, p)
    got = audit.p_value(m, r, v, eps, delta)
    assert got >= min(tail, 1.0) - 1e-12
    if delta == 0:
        assert got == pytest.approx(min(tail, 1.0), rel=1e-9, abs=1e-15)
    # The delta term is 2 m delta times at most max_i P[v - i <= B < v] / i <= 1.
    assert got <= min(tail + 2 * m * delta, 1.0) + 1e-12
    assert audit.p_value(m, r, v, eps + 0.5, delta) >= got - 1e-12  # weaker privacy explains more


def test_the_bound_is_a_valid_95_percent_bound_under_randomised_response():
    # Guesses against an eps0-DP mechanism are right with probability e^eps0 / (1 + e^eps0):
    # the lower bound may exceed eps0 at most 5% of the time.
    rng = np.random.default_rng(0)
    eps0, r, sims = 1.0, 200, 300
    p = 1 / (1 + math.exp(-eps0))
    v = rng.binomial(r, p, sims)
    bounds = np.array([audit.epsilon_lower_bound(1000, r, int(x), 0.0) for x in v])
    assert (bounds > eps0).mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / sims)
    assert (bounds > 0).mean() > 0.9  # and it has power: nearly always positive


def test_audit_of_perfectly_separated_losses():
    m = 400
    included = np.arange(m) % 2 == 0
    losses = np.where(included, 0.01, 3.0) + np.linspace(0, 1e-3, m)
    out = audit.audit(losses, included, 1e-5, claimed_epsilon=2.0)
    assert out["auc"] == 1.0 and out["tpr_at_median"] == 1.0 and out["fpr_at_median"] == 0.0
    assert out["correct_guesses"] == out["guesses"] == 200  # the largest guess set (25% each side)
    assert out["empirical_epsilon_lower_bound"] > 2.0 and not out["consistent"]
    # Uninformative losses: no evidence.
    rng = np.random.default_rng(1)
    out = audit.audit(rng.random(m), rng.random(m) < 0.5, 1e-5, claimed_epsilon=2.0)
    assert out["empirical_epsilon_lower_bound"] < 0.5 and out["consistent"]
    assert 0.35 < out["auc"] < 0.65


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def audit_setup():
    """Few real rows, many canaries (above the API's tenth, set on the spec directly), a
    model large enough to memorise them, full-batch steps. A regression target: with a
    binary one an excluded canary's random label matches the model half the time, which
    caps the loss attack's AUC near 0.75."""
    table = make_table(n=40, n_units=40, seed=3)
    spec = validate("train", {"target": "r", "features": ["x1", "x2", "c", "klass", "y"], "noise_multiplier": 1.0,
                              "epochs": 1,
                              "batch_size": 8, "model": {"hidden": [64, 64], "norm": "none"},
                              "learning_rate": 0.01, "canaries": 3}, rows_meta(n=40))
    spec.canaries = 300
    prep = train.prepare(table, spec, torch.Generator().manual_seed(0), torch.device("cpu"))
    return spec, prep


def audit_run(spec, prep, z, steps, seed):
    torch.manual_seed(seed)  # model initialisation
    trainer = train.Trainer(spec, prep, q=1.0, z=z, steps_per_epoch=steps, gen=torch.Generator().manual_seed(seed))
    trainer.fit(1, lambda _: None)
    claimed = None if z is None else trainer.epsilon()
    return audit.audit(trainer.canary_losses(), prep.canary_in, spec.delta, claimed), claimed


def test_an_overfit_non_private_model_is_caught(audit_setup):
    spec, prep = audit_setup
    out, _ = audit_run(spec, prep, None, 300, 1)
    assert out["canaries"] == 300 and 100 < out["canaries_included"] < 200
    assert out["auc"] > 0.85
    assert out["empirical_epsilon_lower_bound"] > 1.0
    assert out["claimed_epsilon"] is None and out["consistent"]


def test_a_dp_model_stays_below_its_claimed_epsilon(audit_setup):
    spec, prep = audit_setup
    z = calibrate.noise_multiplier(1.0, spec.delta, 1.0, 300)  # full batch: cheap closed form
    out, claimed = audit_run(spec, prep, z, 300, 1)
    assert claimed <= 1.0
    assert out["empirical_epsilon_lower_bound"] < claimed and out["consistent"]
    assert out["auc"] < 0.75
