"""Exact (epsilon, delta) of one Gaussian mechanism: the analytic Gaussian of Balle-Wang 2018.

A Gaussian mechanism with noise multiplier z (std / L2 sensitivity) is (eps, delta)-DP iff
    Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta      (Balle-Wang 2018, Thm. 8)
so ``gaussian_epsilon`` solves that equation for eps. This is tight: no accountant can
charge a single Gaussian release less.
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The smallest delta for which the Gaussian mechanism is (epsilon, delta)-DP."""
    z = noise_multiplier
    a = ndtr(1.0 / (2 * z) - epsilon * z)
    b = math.exp(epsilon + log_ndtr(-1.0 / (2 * z) - epsilon * z))
    return max(0.0, float(a - b))


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The smallest epsilon for which the Gaussian mechanism is (epsilon, delta)-DP."""
    if delta <= 0:
        return math.inf
    if gaussian_delta(noise_multiplier, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(noise_multiplier, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    eps = brentq(lambda e: gaussian_delta(noise_multiplier, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)
    # brentq's root may sit a hair below the true one: step up until the inequality holds.
    while gaussian_delta(noise_multiplier, eps) > delta:
        eps = eps * (1 + 1e-12) + 1e-15
    return float(eps)
