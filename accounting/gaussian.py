"""Exact (epsilon, delta) of one Gaussian mechanism: the analytic Gaussian of Balle-Wang 2018.

A Gaussian mechanism with noise multiplier z (std / L2 sensitivity) is (eps, delta)-DP iff
    Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta      (Balle-Wang 2018, Thm. 8)
so ``gaussian_epsilon`` solves that equation for eps. This is tight: no accountant can
charge a single Gaussian release less.
"""

from __future__ import annotations

import functools
import math

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr


# Where a - b is below this share of a, the float difference has lost too many digits to
# the cancellation (z = 1e6 at delta = 1e-300: a is 3.6e7 times delta, and the epsilon
# found was 7e-9 short of the true one, a probe's): the two terms in 50 digits instead.
CANCELLATION = 1e-4


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The smallest delta for which the Gaussian mechanism is (epsilon, delta)-DP (Balle
    and Wang 2018, Thm. 8)."""
    z = noise_multiplier
    a, b = _terms(z, epsilon)
    if a - b >= CANCELLATION * a:
        return max(0.0, float(a - b))
    return float(_precise_delta(z, epsilon))


def _terms(z: float, epsilon: float) -> tuple[float, float]:
    return ndtr(1.0 / (2 * z) - epsilon * z), math.exp(epsilon + log_ndtr(-1.0 / (2 * z) - epsilon * z))


def _float_delta(z: float, epsilon: float) -> float:
    """``gaussian_delta`` in floats only (the root's search; the 50-digit check follows)."""
    a, b = _terms(z, epsilon)
    return max(0.0, float(a - b))


def _precise_delta(z: float, epsilon: float):
    """``gaussian_delta`` in 50 digits (mpmath), returned as an mpf (compared exactly)."""
    return _precise(z, epsilon)[0]


def _precise(z: float, epsilon: float):
    """(``gaussian_delta``, its second term e^epsilon Phi(-1/(2z) - epsilon z), which is
    also -d delta / d epsilon: the density terms cancel) in 50 digits (mpmath)."""
    import mpmath

    with mpmath.workdps(50):
        zm, em = mpmath.mpf(z), mpmath.mpf(epsilon)
        try:
            second = mpmath.exp(em) * mpmath.ncdf(-1 / (2 * zm) - em * zm)
            return max(mpmath.mpf(0), mpmath.ncdf(1 / (2 * zm) - em * zm) - second), second
        except (ArithmeticError, ValueError):  # z = 5e-324: the terms are 1 and 0 as floats are
            return _float_delta(z, epsilon), None


MARGIN = 1e-10  # the float root is sought this far (relative) below delta: the 50-digit check then mostly passes at once
FLOAT_ERROR = 1e-6  # far above the float terms' relative error (1e-9 at most, measured): beyond it floats decide
# Where the float root needs no 50-digit check: delta not far in the tails (where scipy's
# terms lose digits), and the first term at most this many times delta (the difference
# loses no more than 3 of its digits to the cancellation). The usual case: no mpmath at all.
FLOATS_SUFFICE_DELTA = 1e-30
FLOATS_SUFFICE_RATIO = 1e3


@functools.lru_cache(maxsize=4096)
def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The smallest epsilon for which the Gaussian mechanism is (epsilon, delta)-DP (to a
    relative 1e-10 or so of delta above it: never below)."""
    if math.isnan(noise_multiplier) or math.isnan(delta):
        raise ValueError(f"no epsilon for noise multiplier {noise_multiplier} at delta {delta}")
    if delta <= 0:
        return math.inf
    z = noise_multiplier
    at_zero = gaussian_delta(z, 0.0)
    if at_zero <= delta * (1 - FLOAT_ERROR) or (at_zero < delta * (1 + FLOAT_ERROR)
                                                 and _precise_delta(z, 0.0) <= delta):
        return 0.0
    hi = 1.0
    while gaussian_delta(z, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    target = delta * (1 - MARGIN)
    eps = brentq(lambda e: _float_delta(z, e) - target, 0.0, hi, xtol=1e-12, rtol=1e-12)
    while _float_delta(z, eps) > target:  # brentq's root may sit a hair below the true one
        eps = eps * (1 + 1e-12) + 1e-15
    if delta >= FLOATS_SUFFICE_DELTA and _terms(z, eps)[0] <= FLOATS_SUFFICE_RATIO * delta:
        return float(eps)  # each term to about 1e-15, their difference to 1e-12: MARGIN covers it
    # the float terms carry errors of their own far out in the tails (scipy's 1e-11 to 1e-9
    # relative at a delta of 1e-100 and below, a probe's; a cancelling difference at large z):
    # checked in 50 digits, and moved up by Newton steps (doubled: delta is convex), at
    # least by ulps doubling each time (a step below the float's resolution), until it holds
    ulps = 1
    while (d := _precise(z, eps))[0] > delta:
        try:
            newton = float(eps + 2 * (d[0] - delta) / d[1])
        except (ArithmeticError, ValueError, TypeError):  # (a slope of 0, or none)
            newton = eps
        eps, ulps = max(newton, eps + ulps * math.ulp(eps)), ulps * 2
    return float(eps)
