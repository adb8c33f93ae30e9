"""The events a training run costs, and the noise multiplier that meets a target epsilon.

A run of T steps at sampling rate q and noise multiplier z, with E held-out evaluations
released by the Laplace mechanism at epsilon e each and a final one at epsilon f (the
metric the run releases as its result: ``planner``), is the event

    composed[ subsampled_gaussian(q, z, T), self_composed(laplace(e), E), laplace(f) ]

and its epsilon at delta is the service's own RDP accountant (``accounting``, pure
Python, no Django) for that fixed composition: the curve of Opacus's analysis composed
additively, converted by Balle et al. 2020, at the order refined off the ledger's grid
(``accounting.rdp.compose``, as ``POST /api/compose/`` and the ledger's ``refined_epsilon``
compute it). The parameters of one run are fixed before it starts, so any order gives a
valid bound (Mironov 2017, Prop. 3); the refined order is within 0.1% of a dense search
and up to a few per cent below the grid's best order, so the run gets no more noise than
its target needs. The ledger's gate still admits it on the grid's filter (orders fixed in
advance, valid under adaptivity: ``accounting.rdp``), whose figure is a little higher.

Calibration: first the smallest z on the grid (a coarse search on the integer orders,
then bisection on the full grid); the refined epsilon is never above the grid's, so that z
meets the target, and a bisection on the refined epsilon below it finds the z that meets
it tightly (0.2-3 CPU s; remembered, so an estimate and then its POST calibrate once).
``tests/engines/test_dpsgd_calibrate.py`` checks it is never noisier than
Opacus's ``get_noise_multiplier`` (which searches a denser grid of its own).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from accounting import rdp
from accounting.events import parse_event
from accounting.refine import epsilon_at
from accounting.rdp_math import (
    FINITE_ORDERS,
    conversion_terms,
    epsilon_from_curve,
    gaussian_curve,
    laplace_curve,
    opacus_compute_rdp,
    subsampled_gaussian_curve,
)

MIN_NOISE = 0.3  # below this one step alone costs more than any sensible target
MAX_NOISE = 500.0  # above it the model learns nothing: "epsilon too small to train"
REL_TOL = 1e-4
REFINE_STEPS = 8  # full-grid bisection steps after the coarse search: z to within 0.1 / 2^8 = 0.04%
# (at small z epsilon moves up to ~5x faster than z: 0.3% in z cost up to 1.3% of the target)
TIGHTEN_STEPS = 10  # refined-order bisection below the grid's z: within 0.1 / 2^10 = 0.01% of z
TIGHTEN_ROUNDS = 3
NEAR = np.geomspace(0.6, 1.4, 17)  # orders (alpha - 1 relative to the refined one's) tried in the bisection
TIGHTEN_SPAN = 0.9  # the refined z is within 10% of the grid's (the orders differ by a few per cent)

# The coarse search uses the integer orders up to 256, where Opacus's analysis is a short
# closed sum (the full grid's fractional and very large orders cost 10-100x more). Fewer
# orders can only give a larger epsilon, so the coarse noise multiplier is safe; the
# refinement then tightens it on the full grid.
_COARSE = np.array([i for i, a in enumerate(FINITE_ORDERS) if float(a).is_integer() and a <= 256])


class CalibrationError(ValueError):
    pass


# The parameters a planner's noise is computed from, named in its refusal of values too
# small to compute with
NOISE_PARAMS = ("target_epsilon", "eval_epsilon", "epsilons", "noise_multiplier", "sites_per_round")


def uncalibrable(error: Exception, params: dict):
    """A planner's refusal (``PlanError``: 400, nothing charged) of parameters whose noise
    cannot be computed: an epsilon of 1e-320 made a noise scale of inf, or a share of it
    0.0, and the request answered 500 (a probe)."""
    from engines.types import PlanError

    message = f"the noise cannot be computed from these parameters (a value too small?): {error}"
    return PlanError(message, {k: message for k in NOISE_PARAMS if k in params} or {"params": message})


def sampling(n_train_units: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """Poisson sampling rate q = batch / n and steps per epoch round(1 / q) (as Opacus)."""
    q = batch_size / n_train_units
    return q, max(1, round(1.0 / q))


def run_event(q: float, z: float | None, steps: int, eval_epsilon_each: float, evals: int,
              final: float = 0.0) -> dict:
    """The event of ``steps`` DP-SGD steps, ``evals`` evaluations at ``eval_epsilon_each``
    and a final one at ``final`` (0: none) (z None: non-private)."""
    if z is None:
        return {"kind": "non_private"}
    parts = []
    if steps:
        parts.append({"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": z, "steps": steps})
    if evals and eval_epsilon_each > 0:
        parts.append({"kind": "self_composed", "event": {"kind": "laplace", "epsilon": eval_epsilon_each},
                      "count": evals})
    if final > 0:
        parts.append({"kind": "laplace", "epsilon": final})
    if not parts:
        return {"kind": "no_op"}
    return parts[0] if len(parts) == 1 else {"kind": "composed", "events": parts}


def epsilon(q: float, z: float, steps: int, eval_epsilon_each: float, evals: int, delta: float,
            final: float = 0.0) -> float:
    """The run's epsilon at ``delta``: RDP of its fixed composition at the order refined
    off the grid (0 steps and 0 evals: 0). Never above ``grid_epsilon``."""
    event = run_event(q, z, steps, eval_epsilon_each, evals, final)
    if event["kind"] == "no_op":
        return 0.0
    return rdp.compose([parse_event(event)], delta).epsilon


def grid_epsilon(q: float, z: float, steps: int, eval_epsilon_each: float, evals: int, delta: float,
                 final: float = 0.0) -> float:
    """The run's epsilon at ``delta`` at the best order of the ledger's grid (0 steps and 0
    evals: 0)."""
    curve = np.zeros_like(laplace_curve(1.0))
    if steps:
        curve = curve + subsampled_gaussian_curve(q, z, steps)
    if evals and eval_epsilon_each > 0:
        curve = curve + laplace_curve(eval_epsilon_each) * evals
    if final > 0:
        curve = curve + laplace_curve(final)
    if not steps and not (evals and eval_epsilon_each > 0) and not final > 0:
        return 0.0
    return epsilon_from_curve(curve, delta)


def _coarse_epsilon(q: float, z: float, steps: int, eval_epsilon_each: float, evals: int, delta: float,
                    final: float = 0.0) -> float:
    """An upper bound on ``epsilon``: the same curve on the coarse orders only."""
    orders = [float(FINITE_ORDERS[i]) for i in _COARSE]
    if q >= 1.0:
        rdp = gaussian_curve(z)[_COARSE] * steps
    else:
        import warnings

        compute_rdp = opacus_compute_rdp()
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rdp = np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders), dtype=float)
    if evals and eval_epsilon_each > 0:
        rdp = rdp + laplace_curve(eval_epsilon_each)[_COARSE] * evals
    if final > 0:
        rdp = rdp + laplace_curve(final)[_COARSE]
    eps = np.where(np.isnan(rdp), np.inf, rdp) + conversion_terms(delta)[_COARSE]
    return max(0.0, float(np.min(eps)))


@functools.lru_cache(maxsize=1024)  # an estimate and then the POST of the same request calibrate once
def noise_multiplier(target: float, delta: float, q: float, steps: int, eval_epsilon_each: float = 0.0,
                     evals: int = 0, final: float = 0.0) -> float:
    """The smallest noise multiplier (to about 0.01%) whose run costs at most ``target`` at
    the refined order (``epsilon``).

    From the grid's z (which meets the target, the refined epsilon being never above the
    grid's), until the refined epsilon is within 0.05% of the target (at most
    ``TIGHTEN_ROUNDS`` times): find the run's refined order at z, then bisect z below it
    on the smallest epsilon over ``NEAR`` orders around that one (the best order moves as
    z does). Every z it keeps meets the target at some order, so its refined epsilon meets
    it too."""
    grid_z = grid_noise_multiplier(target, delta, q, steps, eval_epsilon_each, evals, final)
    z = _tightened(grid_z, target, delta, q, steps, eval_epsilon_each, evals, final)
    # checked, not assumed: the refined epsilon at the z kept meets the target, else the grid's z
    return z if _refined(q, z, steps, eval_epsilon_each, evals, delta, final)[1] <= target * (1 + 1e-9) else grid_z


def _tightened(z: float, target: float, delta: float, q: float, steps: int, eval_epsilon_each: float,
               evals: int, final: float = 0.0) -> float:
    """``noise_multiplier``'s search down from the grid's ``z``."""
    for _ in range(TIGHTEN_ROUNDS):
        if z <= MIN_NOISE:
            return z
        order, eps = _refined(q, z, steps, eval_epsilon_each, evals, delta, final)
        if order is None or eps >= target * (1 - 5e-4):
            return z

        near = 1.0 + (order - 1.0) * NEAR

        def over(z_):
            event = parse_event(run_event(q, z_, steps, eval_epsilon_each, evals, final))
            return float(np.min(epsilon_at(event, delta, near))) > target

        lo, hi = math.log(max(MIN_NOISE, z * TIGHTEN_SPAN)), math.log(z)  # at z itself: refined <= target
        if not over(math.exp(lo)):
            z = math.exp(lo)
            continue
        if over(math.exp(hi)):  # the grid's z, over at this order (its best order is elsewhere)
            return z
        for _ in range(TIGHTEN_STEPS):
            mid = (lo + hi) / 2
            if over(math.exp(mid)):
                lo = mid
            else:
                hi = mid
        z = math.exp(hi)
    return z


def _refined(q, z, steps, eval_epsilon_each, evals, delta, final=0.0) -> tuple[float | None, float]:
    """(refined order or None if there is none to refine, refined epsilon) of the run."""
    event = run_event(q, z, steps, eval_epsilon_each, evals, final)
    if event["kind"] == "no_op":
        return None, 0.0
    best = rdp.compose([parse_event(event)], delta)
    return (best.order if best.order is not None and math.isfinite(best.order) else None), best.epsilon


def grid_noise_multiplier(target: float, delta: float, q: float, steps: int, eval_epsilon_each: float = 0.0,
                          evals: int = 0, final: float = 0.0) -> float:
    """The smallest noise multiplier (to about 0.04%) whose run costs at most ``target``
    on the ledger's full grid of orders."""
    def eps(z):
        return grid_epsilon(q, z, steps, eval_epsilon_each, evals, delta, final)

    def coarse(z):
        return _coarse_epsilon(q, z, steps, eval_epsilon_each, evals, delta, final)

    if eps(MAX_NOISE) > target:
        raise CalibrationError(
            f"epsilon {target:g} is too small to train: even noise multiplier {MAX_NOISE:g} (a model that learns "
            f"nothing) would cost {eps(MAX_NOISE):.3g} for {steps} steps at sampling rate {q:.3g}; raise the "
            "epsilon, train fewer epochs or use a larger batch")
    if eps(MIN_NOISE) <= target:
        return MIN_NOISE
    lo, hi = math.log(MIN_NOISE), math.log(MAX_NOISE)
    if coarse(MAX_NOISE) <= target:
        while hi - lo > REL_TOL:  # coarse eps decreases in z: keep coarse(e^lo) > target >= coarse(e^hi)
            mid = (lo + hi) / 2
            if coarse(math.exp(mid)) > target:
                lo = mid
            else:
                hi = mid
        lo = max(math.log(MIN_NOISE), hi + math.log(0.9))
        if eps(math.exp(lo)) <= target:
            return math.exp(lo)
    for _ in range(REFINE_STEPS if coarse(MAX_NOISE) <= target else 60):  # full grid: eps(e^hi) <= target
        mid = (lo + hi) / 2
        if eps(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)
