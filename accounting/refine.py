"""Plain RDP composition of a fixed list of events, minimised over orders off the grid.

The ledger's cost vectors hold a curve on the fixed grid ``ORDERS`` (56 finite orders):
enough for a privacy filter, whose union bound over orders grows with their number, but
coarse for *plain* composition of events whose parameters are fixed in advance. There the
best order is a single number chosen after the fact (no union bound is needed: the
curve of a fixed composition is deterministic), and between two grid orders the
Balle et al. 2020 (Thm. 21) epsilon can be several per cent lower than at either of
them. The subsampled Gaussian's curve turns steeply upwards near
alpha = 2 z^2 log(1/q) (the last binomial term of Mironov-Talwar-Zhang 2019 takes over),
and the best order usually sits just below that bend, so an even finer grid is not the
answer: this module evaluates the events' curves directly at orders around the best
grid order, then around the best of those (two zooms, 33 orders each: a step of about
0.03% of alpha at the end).

Every order is a valid choice (Mironov 2017, Prop. 3: any alpha > 1 gives a valid
conversion), so the minimum is a valid (epsilon, delta) bound for the fixed composition.
It is *not* a valid privacy filter across adaptively chosen requests (the order would
then depend on the transcript); the gate keeps the grid (see ``accounting.rdp``).
"""

from __future__ import annotations

import math
import numpy as np

from . import events as ev
from .costs import normalise
from .rdp_math import ORDERS, laplace_at, pure_dp_at, subsampled_at

POINTS = 33


def curve_at(event: ev.Event, a: np.ndarray) -> tuple[np.ndarray, float]:
    """(RDP curve of ``event`` at the finite orders ``a``, sum of approximate-DP deltas)."""
    curve, approx = _curve(normalise(event), np.asarray(a, dtype=float))
    return np.where(np.isnan(curve), math.inf, np.maximum(curve, 0.0)), approx


def _curve(e: ev.Event, a: np.ndarray) -> tuple[np.ndarray, float]:
    zero = np.zeros_like(a)
    if isinstance(e, ev.LaplaceEvent):
        return laplace_at(e.epsilon, a), 0.0
    if isinstance(e, ev.GaussianEvent):
        return a / (2.0 * e.noise_multiplier * e.noise_multiplier), 0.0
    if isinstance(e, ev.SubsampledGaussianEvent):
        z2 = e.noise_multiplier * e.noise_multiplier  # float product: inf rather than OverflowError
        one = a / (2.0 * z2) if e.sample_rate >= 1.0 else \
            subsampled_at(e.sample_rate, e.noise_multiplier, a)
        return one * e.steps, 0.0
    if isinstance(e, ev.EpsilonDeltaEvent):
        return pure_dp_at(e.epsilon, a), e.delta
    if isinstance(e, ev.SelfComposedEvent):
        c, d = _curve(e.event, a)
        return c * e.count, d * e.count
    if isinstance(e, ev.ComposedEvent):
        total, approx = zero, 0.0
        for sub in e.events:
            c, d = _curve(sub, a)
            total, approx = total + c, approx + d
        return total, approx
    if isinstance(e, ev.NoOpEvent):
        return zero, 0.0
    if isinstance(e, ev.NonPrivateEvent):
        return np.full_like(a, math.inf), 0.0
    raise ev.EventError(f"no RDP rule for {type(e).__name__}")


def _epsilons(curve: np.ndarray, a: np.ndarray, delta: float) -> np.ndarray:
    """Balle et al. 2020, Thm. 21 at each order (as ``rdp_math.conversion_terms``)."""
    eps = curve + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return np.where(np.isnan(eps), math.inf, eps)


def refine(event: ev.Event, delta: float, order: float) -> tuple[float, float]:
    """(epsilon, order): the smallest epsilon at ``delta`` over orders near ``order`` (a
    finite grid order), never above the epsilon at ``order`` itself. ``delta`` is what is
    left for the conversion (the target minus approximate-DP deltas), > 0."""
    grid = ORDERS[np.isfinite(ORDERS)]
    i = int(np.argmin(np.abs(grid - order)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best_a = float(order)
    c, _ = curve_at(event, np.array([best_a]))
    best = float(_epsilons(c, np.array([best_a]), delta)[0])
    for _ in range(2):
        # geometric in alpha - 1 between the neighbours (orders just above 1 matter only
        # relative to 1)
        a = 1.0 + np.geomspace(lo - 1.0, hi - 1.0, POINTS)
        with np.errstate(all="ignore"):
            c, _ = curve_at(event, a)
            eps = _epsilons(c, a, delta)
        j = int(np.argmin(eps))
        if eps[j] < best:
            best, best_a = float(eps[j]), float(a[j])
        lo, hi = a[max(j - 1, 0)], a[min(j + 1, POINTS - 1)]
    return max(0.0, best), best_a
