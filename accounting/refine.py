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

A ledger's report refines the composition of all its entries' events; ``collapse``
first groups equal mechanisms (exactly, RDP curves add), so that costs O(distinct
mechanisms), not O(entries). Why not refine from the stored grid curve alone: (alpha - 1)
times the curve is convex in alpha (van Erven-Harremoës 2014, Thm. 11), so interpolating
it linearly between grid orders is a valid bound, but on that line the conversion's
epsilon is (c + log(1/delta)) / (alpha - 1) + slope + small terms, nearly monotone between
two grid orders: over the issue's DP-SGD range its minimum was a grid order in every case
measured, nothing gained (bench_accounting.py, "interpolated grid").
"""

from __future__ import annotations

import math

import numpy as np

from . import events as ev
from . import work
from .costs import normalise
from .rdp_math import ORDERS, laplace_at, pure_dp_at, subsampled_at

POINTS = 33


def curve_at(event: ev.Event, a: np.ndarray) -> tuple[np.ndarray, float]:
    """(RDP curve of ``event`` at the finite orders ``a``, sum of approximate-DP deltas).
    Charged to the open work budget (``accounting.work``) before it is computed."""
    return _curve_at(collapse(event), a)


def _curve_at(event: ev.Event, a) -> tuple[np.ndarray, float]:
    """``curve_at`` of an event ``collapse`` returned (a refinement's evaluations collapse once)."""
    a = np.asarray(a, dtype=float)
    work.charge_orders(event, a)
    curve, approx = _curve(event, a)
    return np.where(np.isnan(curve), math.inf, np.maximum(curve, 0.0)), approx


def collapse(event: ev.Event) -> ev.Event:
    """The same composition with equal leaves grouped, so a ledger's whole history costs
    O(distinct mechanisms) curve evaluations, not O(entries). Exact for RDP, whose curves
    add (Mironov 2017, Prop. 1): all Gaussians become one with 1/z^2 = sum 1/z_i^2 (their
    curves are alpha/(2 z_i^2)); subsampled Gaussians with the same (q, z) add their
    steps; Laplace and (epsilon, delta) releases with equal parameters are counted;
    no-ops vanish."""
    gaussians: list[tuple[float, int]] = []  # (z, times)
    steps: dict = {}
    counted: dict = {}
    private = True

    def walk(e: ev.Event, m: int) -> None:
        nonlocal private
        if isinstance(e, ev.SelfComposedEvent):
            walk(e.event, m * e.count)
        elif isinstance(e, ev.ComposedEvent):
            for sub in e.events:
                walk(sub, m)
        elif isinstance(e, ev.GaussianEvent):
            gaussians.append((e.noise_multiplier, m))
        elif isinstance(e, ev.SubsampledGaussianEvent) and e.sample_rate >= 1.0:
            gaussians.append((e.noise_multiplier, m * e.steps))
        elif isinstance(e, ev.SubsampledGaussianEvent):
            key = (e.sample_rate, e.noise_multiplier)
            steps[key] = steps.get(key, 0) + m * e.steps
        elif isinstance(e, ev.LaplaceEvent):
            key = ev.LaplaceEvent(e.epsilon)
            counted[key] = counted.get(key, 0) + m
        elif isinstance(e, ev.EpsilonDeltaEvent):
            counted[e] = counted.get(e, 0) + m
        elif isinstance(e, ev.NonPrivateEvent):
            private = False
        elif not isinstance(e, ev.NoOpEvent):
            raise ev.EventError(f"no RDP rule for {type(e).__name__}")

    walk(normalise(event), 1)
    if not private:
        return ev.NonPrivateEvent()
    parts: list[ev.Event] = []
    if len(gaussians) == 1 and gaussians[0][1] == 1:  # as normalise left it (bit for bit)
        parts.append(ev.GaussianEvent(gaussians[0][0]))
    elif gaussians:
        inv_z2 = sum(m / (z * z) for z, m in gaussians)
        if inv_z2 == 0.0:  # every 1/z^2 underflowed (z past ~1e154): one Gaussian that costs at least their sum
            z = min(z for z, _ in gaussians) / math.sqrt(sum(m for _, m in gaussians))
        else:
            z = 1.0 / math.sqrt(inv_z2) if math.isfinite(inv_z2) else None
        parts.append(ev.GaussianEvent(z) if z is not None else ev.NonPrivateEvent())
    parts += [ev.SubsampledGaussianEvent(q, z, n) for (q, z), n in steps.items()]
    parts += [leaf if n == 1 else ev.SelfComposedEvent(leaf, n) for leaf, n in counted.items()]
    return ev.ComposedEvent(tuple(parts))


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
        epsilons, times = [], []
        for sub in e.events:
            leaf, n = (sub.event, sub.count) if isinstance(sub, ev.SelfComposedEvent) else (sub, 1)
            if type(leaf) is ev.LaplaceEvent:  # summed below, all at once
                epsilons.append(leaf.epsilon)
                times.append(n)
                continue
            c, d = _curve(sub, a)
            total, approx = total + c, approx + d
        if epsilons:
            total = total + _laplace_sum(np.array(epsilons), np.array(times, dtype=float), a)
        return total, approx
    if isinstance(e, ev.NoOpEvent):
        return zero, 0.0
    if isinstance(e, ev.NonPrivateEvent):
        return np.full_like(a, math.inf), 0.0
    raise ev.EventError(f"no RDP rule for {type(e).__name__}")


LAPLACE_ROWS = 4096  # Laplace curves evaluated per numpy call (rows x orders floats at a time)


def _laplace_sum(epsilons: np.ndarray, times: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The sum of ``times[i]`` Laplace curves of ``epsilons[i]`` at the orders ``a``: the
    same closed form as one by one, in blocks (a ledger of 13,500 distinct analyst-chosen
    epsilons took 1 ms each one by one, 10 s a dataset's page: a probe)."""
    total = np.zeros_like(a)
    for i in range(0, len(epsilons), LAPLACE_ROWS):
        block = laplace_at(epsilons[i:i + LAPLACE_ROWS, None], a[None, :])
        total = total + (block * times[i:i + LAPLACE_ROWS, None]).sum(axis=0)
    return total


def _epsilons(curve: np.ndarray, a: np.ndarray, delta: float) -> np.ndarray:
    """Balle et al. 2020, Thm. 21 at each order (as ``rdp_math.conversion_terms``)."""
    eps = curve + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return np.where(np.isnan(eps), math.inf, eps)


def epsilon_at(event: ev.Event, delta: float, orders) -> np.ndarray:
    """The (epsilon, ``delta``) bound of ``event`` converted at each of ``orders`` (finite,
    > 1): each a valid bound for a fixed composition (Mironov 2017, Prop. 3); inf where
    the event's approximate-DP deltas leave nothing of ``delta``."""
    a = np.asarray(orders, dtype=float)
    with np.errstate(all="ignore"):
        c, approx = curve_at(event, a)
        return _epsilons(c, a, delta - approx) if delta - approx > 0 else np.full_like(a, math.inf)


def refine(event: ev.Event, delta: float, order: float) -> tuple[float, float]:
    """(epsilon, order): the smallest epsilon at ``delta`` over orders near ``order`` (a
    finite grid order), never above the epsilon at ``order`` itself. ``delta`` is what is
    left for the conversion (the target minus approximate-DP deltas), > 0."""
    event = collapse(event)
    grid = ORDERS[np.isfinite(ORDERS)]
    i = int(np.argmin(np.abs(grid - order)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best_a = float(order)
    c, _ = _curve_at(event, np.array([best_a]))
    best = float(_epsilons(c, np.array([best_a]), delta)[0])
    for _ in range(2):
        # geometric in alpha - 1 between the neighbours (orders just above 1 matter only
        # relative to 1)
        a = 1.0 + np.geomspace(lo - 1.0, hi - 1.0, POINTS)
        with np.errstate(all="ignore"):
            c, _ = _curve_at(event, a)
            eps = _epsilons(c, a, delta)
        j = int(np.argmin(eps))
        if eps[j] < best:
            best, best_a = float(eps[j]), float(a[j])
        lo, hi = a[max(j - 1, 0)], a[min(j + 1, POINTS - 1)]
    return max(0.0, best), best_a
