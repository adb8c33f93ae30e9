"""The 95% interval of a held-out metric released as a ratio of two noisy sums.

A DP evaluation releases the metric summed over held-out units and the number of
held-out units, each with independent Laplace noise of scale b (``planner``; OpenDP's
sampler). The released metric is their ratio. Its interval comes from the noise alone,
as post-processing of the released values (no further budget): each noise exceeds t in
absolute value with probability at most 2.5% (t = b ln 40, OpenDP's accuracy helper), so
with probability at least 95% (union bound) both exact values lie within t of the
released ones, and the exact ratio in

    [(S - t) / (N + t), (S + t) / (N - t)]        (clipped to the metric's range [0, 1])

which is the range of s / n over that box (s >= 0, n > 0). It covers the exact held-out
metric (the model's true holdout accuracy) in at least 95% of runs; it says nothing of
how well the holdout stands for the population (its sampling error is the analyst's).
"""

from __future__ import annotations

import math

ALPHA_EACH = 0.025  # two noisy values, union bound: 95% in all


def ratio_interval(metric_sum: float, n: float, t: float) -> list[float]:
    """[lo, hi] in [0, 1] holding exact_sum / exact_n whenever both are within ``t`` of the
    released ``metric_sum`` and ``n``."""
    lo = max(metric_sum - t, 0.0) / (n + t) if n + t > 0 else 0.0
    hi = (metric_sum + t) / (n - t) if n - t > 0 else math.inf
    return [min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)]


def ratio_estimate(metric_sum: float, n: float, t: float | None) -> float | None:
    """The released ratio ``metric_sum / n`` in [0, 1] (n taken as at least 1); None when
    ``t`` (the noise bound, None for exact values) is given and the released ``n`` is within
    it of zero: an all-null target or a tiny holdout, where a ratio of two noisy sums near
    zero reads as any value from 0 to 1 (0.0 or 1.0, a loss of 0.0). Post-processing."""
    if t is not None and n <= t:
        return None
    return min(max(metric_sum / max(n, 1.0), 0.0), 1.0)


def expected_halfwidth(t: float, n_units: int, metric: float = 0.5) -> float:
    """The interval's half-width for a metric near ``metric`` over ``n_units`` held-out
    units, at noise bound ``t`` (what the plan states before any data is read)."""
    if n_units <= 0:
        return 1.0
    s = metric * n_units
    lo, hi = ratio_interval(s, float(n_units), t)
    return (hi - lo) / 2
