"""The events a training run costs, and the noise multiplier that meets a target epsilon.

A run of T steps at sampling rate q and noise multiplier z, with E held-out evaluations
released by the Laplace mechanism at epsilon e each, is the event

    composed[ subsampled_gaussian(q, z, T), self_composed(laplace(e), E) ]

and its epsilon at delta is the service's own RDP accountant (``governance.accounting``,
pure Python, no Django): the one-step subsampled-Gaussian curve of Opacus's analysis on
56 orders, composed additively, converted by Balle et al. 2020 and never above the
basic-composition bound. That is the same computation the ledger uses, so the epsilon an
analyst targets is the epsilon the ledger reports for the run; it is at least as tight as
Opacus's ``get_noise_multiplier`` with its RDP accountant (a finer grid of orders and the
same conversion; ``tests/engines/test_dpsgd_calibrate.py`` compares them).
"""

from __future__ import annotations

import math

import numpy as np

from governance.accounting.rdp_math import epsilon_from_curve, laplace_curve, subsampled_gaussian_curve

MIN_NOISE = 0.3  # below this one step alone costs more than any sensible target
MAX_NOISE = 500.0  # above it the model learns nothing: "epsilon too small to train"
REL_TOL = 1e-4


class CalibrationError(ValueError):
    pass


def sampling(n_train_units: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """Poisson sampling rate q = batch / n and steps per epoch round(1 / q) (as Opacus)."""
    q = batch_size / n_train_units
    return q, max(1, round(1.0 / q))


def run_event(q: float, z: float | None, steps: int, eval_epsilon_each: float, evals: int) -> dict:
    """The event of ``steps`` DP-SGD steps and ``evals`` evaluations (z None: non-private)."""
    if z is None:
        return {"kind": "non_private"}
    parts = [{"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": z, "steps": steps}]
    if evals and eval_epsilon_each > 0:
        parts.append({"kind": "self_composed", "event": {"kind": "laplace", "epsilon": eval_epsilon_each},
                      "count": evals})
    return parts[0] if len(parts) == 1 else {"kind": "composed", "events": parts}


def epsilon(q: float, z: float, steps: int, eval_epsilon_each: float, evals: int, delta: float) -> float:
    """The run's epsilon at ``delta`` under the RDP accountant (0 steps and 0 evals: 0)."""
    curve = np.zeros_like(laplace_curve(1.0))
    if steps:
        curve = curve + subsampled_gaussian_curve(q, z, steps)
    if evals and eval_epsilon_each > 0:
        curve = curve + laplace_curve(eval_epsilon_each) * evals
    if not steps and not (evals and eval_epsilon_each > 0):
        return 0.0
    return epsilon_from_curve(curve, delta)


def noise_multiplier(target: float, delta: float, q: float, steps: int, eval_epsilon_each: float = 0.0,
                     evals: int = 0) -> float:
    """The smallest noise multiplier (to REL_TOL) whose run costs at most ``target``."""
    def eps(z):
        return epsilon(q, z, steps, eval_epsilon_each, evals, delta)

    if eps(MAX_NOISE) > target:
        raise CalibrationError(
            f"epsilon {target:g} is too small to train: even noise multiplier {MAX_NOISE:g} (a model that learns "
            f"nothing) would cost {eps(MAX_NOISE):.3g} for {steps} steps at sampling rate {q:.3g}; raise the "
            "epsilon, train fewer epochs or use a larger batch")
    lo, hi = math.log(MIN_NOISE), math.log(MAX_NOISE)
    if eps(MIN_NOISE) <= target:
        return MIN_NOISE
    while hi - lo > REL_TOL:  # eps is decreasing in z: keep eps(e^lo) > target >= eps(e^hi)
        mid = (lo + hi) / 2
        if eps(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)
