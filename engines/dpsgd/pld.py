"""Certifying one pre-planned run with the privacy loss distribution (PLD): a DP-SGD
training here, an MST synthesis through ``composition_epsilon`` (engines/synthesis/planner.py);
``smallest_within`` is the calibration search both use.

A run whose every parameter is fixed before it starts (sampling rate q, noise multiplier
z, T steps, E held-out evaluations by the Laplace mechanism) is one mechanism, the
non-adaptive composition of T Poisson-subsampled Gaussians and E Laplaces. Its tightest
known (epsilon, delta) comes from composing their privacy loss distributions
(Koskela-Jälkö-Honkela 2020; Meiser-Mohammadi 2018; dp_accounting's ``PLDAccountant``
with its default pessimistic discretisation, which rounds every privacy loss up, so the
result is an upper bound: Doroshenko-Ghazi-Kamath-Kumar-Manurangsi 2022, Thm. 3.5).

What PLD does NOT give: a privacy *filter*. PLD composition is proven for mechanisms
fixed in advance (or chosen adaptively with fixed PLDs); a gate that admits requests
while the sum stays under a budget picks the next mechanism from the transcript, and no
PLD-based filter is known to be valid there. So PLD is used only here, to certify one
run as a whole (the epsilon stated on the trained model), never by the ledger's gate:
the ledger charges the run's event by its RDP curve like any other (``accounting.rdp``,
Feldman-Zrnic filter), and records the PLD epsilon beside it as the run's certificate.

>>> round(epsilon(0.01, 1.1, 1000, 0.0, 0, 1e-5), 2)   # RDP on the ledger's grid: 1.73
1.52
"""

from __future__ import annotations

import functools
import math

from . import calibrate
from .calibrate import MAX_NOISE, MIN_NOISE, CalibrationError

NAME = "pld"
# Privacy loss bucket width (dp_accounting's default). Coarser is faster and still an
# upper bound (pessimistic rounding), but looser.
INTERVAL = 2e-4
# The calibration searches with buckets 5x wider first (about 5x faster; the grids nest, so
# an epsilon there is never below the fine one), then refines within 2% of that noise.
COARSE_INTERVAL = 1e-3
REL_TOL = 1e-3  # calibrated noise multipliers to 0.1%


@functools.lru_cache(maxsize=256)
def epsilon(q: float, z: float, steps: int, eval_epsilon_each: float, evals: int, delta: float,
            interval: float = INTERVAL, final: float = 0.0) -> float:
    """The run's epsilon at ``delta`` certified by PLD (an upper bound; inf if undefined)."""
    from dp_accounting import dp_event
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    events = []
    if steps:
        step = dp_event.GaussianDpEvent(z) if q >= 1.0 else dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
        events.append(dp_event.SelfComposedDpEvent(step, steps))
    if evals and eval_epsilon_each > 0:
        events.append(dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(1.0 / eval_epsilon_each), evals))
    if final > 0:
        events.append(dp_event.LaplaceDpEvent(1.0 / final))
    if not events:
        return 0.0
    acc = PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_event.ComposedDpEvent(events))
    eps = acc.get_epsilon(delta)
    return float(eps) if math.isfinite(eps) else math.inf


def noise_multiplier(target: float, delta: float, q: float, steps: int, eval_epsilon_each: float = 0.0,
                     evals: int = 0, final: float = 0.0) -> float:
    """The smallest noise multiplier (to ``REL_TOL``) whose run PLD certifies at ``target``
    (at ``INTERVAL``: the certificate the plan states)."""
    def coarse(z):
        return epsilon(q, z, steps, eval_epsilon_each, evals, delta, COARSE_INTERVAL, final)

    def eps(z):
        return epsilon(q, z, steps, eval_epsilon_each, evals, delta, final=final)

    try:  # RDP's noise is enough (PLD is never above RDP): the bracket's top, found cheaply
        top = calibrate.noise_multiplier(target, delta, q, steps, eval_epsilon_each, evals, final)
    except CalibrationError:
        top = MAX_NOISE
    if eps(top) > target:
        raise CalibrationError(f"epsilon {target:g} is too small to train under PLD even at noise multiplier "
                               f"{top:g}; raise the epsilon, train fewer epochs or use a larger batch")
    return smallest_within(eps, coarse, target, top, MIN_NOISE)


def smallest_within(eps, coarse, target: float, top: float, floor: float) -> float:
    """The smallest x in [floor, top] (to ``REL_TOL`` relative) with ``eps(x) <= target``,
    for an ``eps`` that falls as x (a noise scale) grows and ``eps(top) <= target``
    (checked by the caller). ``coarse(x) >= eps(x)`` is the same at ``COARSE_INTERVAL``:
    the search runs on it first, then on ``eps`` within 2% below its answer."""
    # coarse search (cheap), bracket [top / 2, top], widened to the floor if need be
    c_lo, c_hi = math.log(max(floor, top / 2)), math.log(top)
    if coarse(math.exp(c_lo)) <= target:
        if c_lo == math.log(floor) or eps(floor) <= target:
            return floor
        c_lo = math.log(floor)
    if coarse(top) <= target:
        while c_hi - c_lo > REL_TOL:  # coarse(e^c_lo) > target >= coarse(e^c_hi)
            mid = (c_lo + c_hi) / 2
            c_lo, c_hi = (mid, c_hi) if coarse(math.exp(mid)) > target else (c_lo, mid)
    # fine search in [2% below the coarse answer, the coarse answer]: coarse >= fine, so
    # the coarse answer is within target at the fine buckets too (checked, not assumed)
    lo, hi = c_hi + math.log(0.98), c_hi
    if eps(math.exp(hi)) > target:  # not expected: the whole bracket up to the top
        lo, hi = c_hi, math.log(top)
    elif eps(math.exp(lo)) <= target:  # not expected either: down to the coarse bracket's bottom
        lo = c_lo
    while hi - lo > REL_TOL:  # eps(e^lo) > target >= eps(e^hi)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps(math.exp(mid)) > target else (lo, mid)
    return math.exp(hi)


def composition_epsilon(discrete_gaussians, pure, delta: float, interval: float = INTERVAL) -> float:
    """(epsilon at ``delta``) of a fixed composition of discrete Gaussian measurements
    (``(sigma, count)``: ``count`` releases of an integer vector whose L1 and L2
    sensitivity is 1, each cell plus N_Z(0, sigma^2) noise; one row changes one cell)
    and pure-DP releases (``(epsilon, count)``), by PLD: the discrete Gaussian's exact
    privacy loss (Canonne-Kamath-Steinke 2020; dp_accounting's
    ``from_discrete_gaussian_mechanism``, truncated at mass 1e-30) and, for a pure
    epsilon-DP release of unknown form, randomised response at epsilon, which dominates
    every epsilon-DP mechanism (Kairouz-Oh-Viswanath 2015; ``from_privacy_parameters``).
    Pessimistic discretisation at ``interval``: an upper bound."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as plds

    total = None
    parts = [plds.from_discrete_gaussian_mechanism(sigma, sensitivity=1, value_discretization_interval=interval)
             .self_compose(n) for sigma, n in discrete_gaussians if n]
    parts += [plds.from_privacy_parameters(common.DifferentialPrivacyParameters(e, 0.0),
                                           value_discretization_interval=interval).self_compose(n)
              for e, n in pure if n and e > 0]
    for p in parts:
        total = p if total is None else total.compose(p)
    if total is None:
        return 0.0
    eps = total.get_epsilon_for_delta(delta)
    return float(eps) if math.isfinite(eps) else math.inf


def certifier(accountant: str):
    """The epsilon function (q, z, steps, eval_epsilon_each, evals, delta, final=) that certifies a
    run under ``accountant`` ("rdp": the ledger's own grid; "pld": this module)."""
    return epsilon if accountant == NAME else calibrate.epsilon


def max_steps(target: float, delta: float, q: float, z: float, certify) -> int:
    """The most steps at (q, z) whose run ``certify(q, z, steps, delta)`` keeps at or under
    ``target`` (0 if not even one step). Epsilon grows with steps, so a doubling then
    bisection search."""
    if certify(q, z, 1, delta) > target:
        return 0
    lo, hi = 1, 2
    while certify(q, z, hi, delta) <= target:
        lo, hi = hi, hi * 2
        if hi > 10**8:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if certify(q, z, mid, delta) <= target else (lo, mid)
    return lo
