"""The 95% interval of a DP held-out metric (engines/dpsgd/intervals.py): it holds the
exact ratio whenever both noises are within their bound (a property), and covers the
exact metric in at least 95% of releases through the engine's own OpenDP noise."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.aggregates.noise import calibrate
from engines.dpsgd.intervals import ALPHA_EACH, expected_halfwidth, ratio_estimate, ratio_interval
from engines.dpsgd.planner import EVAL_SENSITIVITY


@given(n=st.integers(1, 100_000), frac=st.floats(0, 1), t=st.floats(0, 5_000),
       ds=st.floats(-1, 1), dn=st.floats(-1, 1))
def test_the_interval_holds_the_exact_ratio_when_both_noises_are_within_t(n, frac, t, ds, dn):
    exact = frac * n
    lo, hi = ratio_interval(exact + ds * t, n + dn * t, t)
    assert 0 <= lo <= hi <= 1
    assert lo - 1e-9 <= exact / n <= hi + 1e-9


@pytest.mark.parametrize("eps_each, n, accuracy", [(0.05, 400, 0.78), (0.1 / 3, 12_000, 0.62), (1.0, 50, 0.95)])
def test_it_covers_the_exact_metric_in_at_least_95_percent_of_releases(eps_each, n, accuracy):
    noise, _ = calibrate("laplace", EVAL_SENSITIVITY, eps_each, integer=False, vector=True)
    t = noise.halfwidth(ALPHA_EACH)
    assert t == pytest.approx(noise.scale * math.log(1 / ALPHA_EACH), rel=1e-9)
    exact = accuracy * n
    covered = 0
    for _ in range(1000):
        s, _loss, m = noise.release([exact, 0.3 * n, float(n)])
        lo, hi = ratio_interval(s, m, t)
        covered += lo <= accuracy <= hi
    assert covered >= 950  # 95% promised (the union bound makes it ~97.5%+)


def test_the_stated_halfwidth_shrinks_with_the_holdout_and_the_share():
    t = calibrate("laplace", EVAL_SENSITIVITY, 0.1 / 3, integer=False, vector=True)[0].halfwidth(ALPHA_EACH)
    assert expected_halfwidth(t, 12_000) < 0.05 < expected_halfwidth(t, 1_000) < expected_halfwidth(t, 100)
    assert expected_halfwidth(t / 3, 1_000) < expected_halfwidth(t, 1_000)
    assert expected_halfwidth(t, 0) == 1.0


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(0.0, 1e5))
def test_the_estimate_is_the_clamped_ratio_unless_the_count_is_within_the_noise_of_none(s, n, t):
    est = ratio_estimate(s, n, t)
    if n <= t:
        assert est is None
    else:
        assert est == min(max(s / max(n, 1.0), 0.0), 1.0)
    assert ratio_estimate(s, n, None) == min(max(s / max(n, 1.0), 0.0), 1.0)  # exact values
