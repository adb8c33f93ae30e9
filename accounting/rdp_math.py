"""Rényi-DP curves of single mechanisms and the RDP -> (epsilon, delta) conversion.

Pure maths, no state. The subsampled Gaussian uses Opacus's own analysis
(``opacus.accountants.analysis.rdp``, Mironov-Talwar-Zhang 2019); the plain Gaussian,
Laplace and pure-DP curves are the closed forms below. Every curve is evaluated on
``ORDERS``: a fixed grid from just above 1 to 4096 plus alpha = infinity (the max
divergence, i.e. pure DP), so the same curve serves small- and large-epsilon ledgers.

>>> import numpy as np
>>> c = gaussian_curve(1.0)
>>> float(c[list(ORDERS).index(2.0)])
1.0
>>> round(epsilon_from_curve(laplace_curve(0.5), 1e-6), 6)  # alpha = inf: pure epsilon
0.5
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np

FINITE_ORDERS = (
    1.001, 1.002, 1.005, 1.01, 1.02, 1.03, 1.05, 1.075, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5,
    1.6, 1.75, 1.9, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
    10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0,
    80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0,
)
ORDERS = np.array(FINITE_ORDERS + (math.inf,))
_A = np.array(FINITE_ORDERS)  # finite orders only


def _sanitise(curve: np.ndarray) -> np.ndarray:
    """NaN (numerical overflow) is replaced by +inf: a valid, if useless, bound."""
    curve = np.asarray(curve, dtype=float)
    return np.where(np.isnan(curve), math.inf, np.maximum(curve, 0.0))


def gaussian_curve(noise_multiplier: float) -> np.ndarray:
    """Gaussian mechanism: alpha / (2 z^2) (Mironov 2017, Prop. 7); infinite at alpha = inf."""
    z2 = noise_multiplier * noise_multiplier  # float product: inf rather than OverflowError
    return np.append(_A / (2.0 * z2), math.inf)


# Below a * eps of this, the closed forms of the Laplace and pure-DP curves lose digits (a
# log of 1 + about a(a-1) eps^2 / 2: a millionth too small at a * eps = 1e-5, and 0,
# negative or a few times too small at eps 1e-7 and under), and the zCDP bound a eps^2 / 2
# (Bun-Steinke 2016, Prop. 3.3: any eps-DP mechanism) takes their place: valid always, at
# most 0.034% over the Laplace curve and 0.00002% over the pure-DP one here (mpmath), where
# the closed forms keep about 1e-10 above it.
_SMALL_A_EPS = 1e-3


def _small_eps(epsilon: float, a: np.ndarray, closed: np.ndarray) -> np.ndarray:
    return np.where(a * epsilon < _SMALL_A_EPS, np.minimum(a * epsilon * epsilon / 2, epsilon), closed)


def laplace_at(epsilon: float, a: np.ndarray) -> np.ndarray:
    """Laplace mechanism with epsilon = sensitivity / scale at the finite orders ``a``
    (Mironov 2017, Prop. 6): 1/(a-1) log( a/(2a-1) e^{(a-1) eps} + (a-1)/(2a-1) e^{-a eps} ),
    computed in log space, capped at eps; ``a eps^2 / 2`` where a * eps is tiny."""
    t1 = np.log(a / (2 * a - 1)) + (a - 1) * epsilon
    t2 = np.log((a - 1) / (2 * a - 1)) - a * epsilon
    return _small_eps(epsilon, a, np.minimum(np.logaddexp(t1, t2) / (a - 1), epsilon))


def laplace_curve(epsilon: float) -> np.ndarray:
    """``laplace_at`` on the grid; equal to eps at alpha = inf."""
    return _sanitise(np.append(laplace_at(epsilon, _A), epsilon))


def pure_dp_at(epsilon: float, a: np.ndarray) -> np.ndarray:
    """Any epsilon-DP mechanism at the finite orders ``a``: the RDP of randomised response,
    which dominates them all. 1/(a-1) log( (e^{a eps} + e^{(1-a) eps}) / (1 + e^{eps}) ),
    the same as 1/(a-1) log( (sinh(a eps) - sinh((a-1) eps)) / sinh(eps) ) (Bun-Steinke
    2016, Prop. 3.3); at most min(eps, a eps^2 / 2), which it is where a * eps is tiny."""
    closed = (np.logaddexp(a * epsilon, (1 - a) * epsilon) - np.logaddexp(0.0, epsilon)) / (a - 1)
    return _small_eps(epsilon, a, np.minimum(closed, epsilon))


def pure_dp_curve(epsilon: float) -> np.ndarray:
    """``pure_dp_at`` on the grid; equal to eps at alpha = inf."""
    return _sanitise(np.append(pure_dp_at(epsilon, _A), epsilon))


def subsampled_gaussian_curve(sample_rate: float, noise_multiplier: float, steps: int) -> np.ndarray:
    """T steps of the Poisson-subsampled Gaussian (Opacus ``compute_rdp``); inf at alpha = inf.

    RDP adds over steps, so this is T times the one-step curve, which is cached per
    (q, z): sweeps and repeated plans with the same sampling rate and noise cost nothing.
    """
    if sample_rate >= 1.0:
        return gaussian_curve(noise_multiplier) * steps
    return _sanitise(_one_step_curve(float(sample_rate), float(noise_multiplier)) * steps)


# Opacus's series for fractional orders decays only polynomially when q is near 1/2 (about
# 3 s per call at q = 0.5, z = 1); above this rate fractional orders use the bound below.
_FRACTIONAL_MAX_RATE = 0.4


@functools.cache
def opacus_compute_rdp():
    """Opacus's ``accountants.analysis.rdp.compute_rdp`` without importing the ``opacus``
    package, whose ``__init__`` imports torch (seconds and hundreds of MB in every web
    process that plans a DP-SGD request). The module itself needs only numpy and scipy,
    so it is loaded from its file; a process that has imported Opacus uses that copy."""
    import importlib.util
    import sys
    from pathlib import Path

    loaded = sys.modules.get("opacus.accountants.analysis.rdp")
    if loaded is not None:
        return loaded.compute_rdp
    package = importlib.util.find_spec("opacus")  # locates the package without running it
    path = Path(package.origin).parent / "accountants" / "analysis" / "rdp.py"
    spec = importlib.util.spec_from_file_location("accounting._opacus_rdp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_rdp


@functools.lru_cache(maxsize=4096)
def _one_step_curve(q: float, z: float) -> np.ndarray:
    curve = np.append(subsampled_at(q, z, _A), math.inf)
    curve.setflags(write=False)
    return curve


def subsampled_at(q: float, z: float, a: np.ndarray) -> np.ndarray:
    """One step of the Poisson-subsampled Gaussian (0 < q < 1) at the finite orders ``a``:
    Opacus's analysis (signed series at fractional orders, below ``_FRACTIONAL_MAX_RATE``),
    integer orders in log space where Opacus overflows, every order capped by the plain
    Gaussian.

    Opacus's value at each order is cached per (q, z, order) (``_SERIES``, LRU): its
    series is a function of the three numbers alone, so a cached value is the value,
    bit for bit, and the off-grid refinement of a repeated composition (the same zoom
    orders again) costs no series at all. Orders not cached are computed in one
    ``compute_rdp`` call, as before; if it fails (``ArithmeticError``) every order of
    this call is treated as failed, as before, and nothing is cached."""
    compute_rdp = opacus_compute_rdp()
    a = np.asarray(a, dtype=float)
    # Without subsampling the Gaussian's curve is a valid upper bound at every order:
    # subsampling never costs privacy (joint convexity of exp((a-1) D_a)).
    plain = a / (2.0 * z * z)
    computed = {}
    missing = []
    for x in dict.fromkeys(float(x) for x in a):
        if not (x.is_integer() or q < _FRACTIONAL_MAX_RATE) or x <= 1:
            continue
        hit = _SERIES.get((q, z, x))
        if hit is not None:
            computed[x] = hit
        elif x.is_integer():  # the exact sum (Opacus's loses every digit at small q)
            computed[x] = _log_a_int(q, z, int(x)) / (x - 1)
            _SERIES.put((q, z, x), computed[x])
        else:
            missing.append(x)
    if missing:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                new = dict(zip(missing, np.atleast_1d(compute_rdp(q=q, noise_multiplier=z, steps=1,
                                                                 orders=missing))))
            except ArithmeticError:
                # Opacus overflows (z**2) or divides by zero at extreme noise multipliers.
                new, computed = None, {}
        if new is not None:
            computed.update(new)
            for x, v in new.items():
                _SERIES.put((q, z, x), v)
    finite = np.array([computed.get(float(x), math.inf) for x in a], dtype=float)
    finite = np.where(np.isnan(finite), math.inf, finite)
    fractional = [i for i, x in enumerate(a) if not float(x).is_integer() and x > 1]
    if fractional and q < _FRACTIONAL_MAX_RATE:  # (above it they take the plain bound below)
        _hold_to_integer_neighbours(q, z, a, finite, fractional)
    return np.maximum(np.minimum(finite, plain), 0.0)


def _hold_to_integer_neighbours(q: float, z: float, a: np.ndarray, finite: np.ndarray, where: list) -> None:
    """Opacus's signed series at a fractional order loses every digit at high orders
    (q = 0.1, z = 42.3: 0 at order 511.31 between 0.00147 at 511 and 512; a DP-SGD run
    at epsilon 0.05 reported 0.028 where its event costs 0.070). Each fractional value is
    held to what its integer neighbours f < x < f + 1 (exact sums) allow: the RDP is
    nondecreasing in the order, so at least the value at f, and (alpha - 1) times it is
    convex in alpha (a log-moment), so at most the chord of (alpha - 1) RDP between f and
    f + 1. A value outside is replaced by the chord: a valid bound, close to the true
    value (between f's and f + 1's). In place on ``finite``."""
    ints = np.array(sorted(set().union(*(integer_neighbours(float(a[i])) for i in where))), dtype=float)
    at = dict(zip(ints, subsampled_at(q, z, ints)))
    at[1.0] = 0.0  # (alpha - 1) RDP is 0 at alpha = 1: the chord from 1 to 2
    for i in where:
        x = float(a[i])
        f = float(math.floor(x))
        chord = ((f - 1) * at[f] + (x - f) * (f * at[f + 1] - (f - 1) * at[f])) / (x - 1)
        chord = chord if math.isfinite(chord) else math.inf  # (the plain bound then applies)
        # Opacus's series at a small q sums to 1 + (a tiny part) and keeps none of its digits:
        # where f + 1's (alpha - 1) RDP is that small, its value cannot be told from 0 (a
        # valid-looking 0 between 1 and 2), and the chord stands in
        lost = f * at[f + 1] < _LOST_DIGITS
        if lost or not (at[f] * (1 - 1e-9) <= finite[i] <= chord * (1 + 1e-9)):
            finite[i] = chord


_LOST_DIGITS = 1e-6  # (alpha - 1) RDP below which Opacus's fractional series is not read


def integer_neighbours(x: float) -> set[int]:
    """The integer orders a fractional order x > 1 is held to (``_hold_to_integer_neighbours``;
    order 1 needs no series), which ``accounting.work`` prices."""
    f = math.floor(x)
    return {f, f + 1} if f > 1 else {f + 1}


class _LRU:
    """A small least-recently-used map (thread-safe enough for the GIL: a lost update
    only costs a recomputation)."""

    def __init__(self, maxsize: int):
        from collections import OrderedDict

        self.maxsize = maxsize
        self.data: OrderedDict = OrderedDict()

    def get(self, key):
        try:
            value = self.data[key]
        except KeyError:
            return None
        try:
            self.data.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return value

    def put(self, key, value) -> None:
        self.data[key] = value
        while len(self.data) > self.maxsize:
            try:
                self.data.popitem(last=False)
            except KeyError:
                break

    def clear(self) -> None:
        self.data.clear()

    def __len__(self) -> int:
        return len(self.data)


# Opacus's one-step RDP per (q, z, order): about 120 orders a distinct (q, z) in a
# refined composition (56 grid, 1 + 2 x 33 refined), 24 bytes of value and ~200 of
# key and bookkeeping each: 65,536 entries are about 15 MB and ~540 distinct (q, z).
_SERIES = _LRU(65_536)


def _log_a_int(q: float, z: float, alpha: int) -> float:
    """log A_alpha of the Poisson-subsampled Gaussian at an integer order (Mironov, Talwar
    and Zhang 2019, Sec. 3.3): log sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2)).
    The binomial weights sum to 1, so this is log1p(S), S = sum_{k>=2} of the same terms
    with exp(...) - 1 in place of exp(...): every term >= 0 and in log space (no binomial
    coefficient or power is formed), exact at any order and at any q (the sum as written
    is 1 + S: at q = 1e-8 S is below a double's last digit of 1, and the RDP came out 0).
    The RDP at alpha is this divided by alpha - 1."""
    from scipy.special import gammaln, logsumexp

    if not (0 < q < 1 and z > 0):
        return math.inf
    k = np.arange(2, alpha + 1, dtype=float)
    e = (k * k - k) / (2 * z * z)
    with np.errstate(over="ignore", divide="ignore"):
        log_expm1 = np.where(e > 30.0, e + np.log1p(-np.exp(-e)), np.log(np.expm1(np.minimum(e, 30.0))))
    terms = (gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1)
             + (alpha - k) * math.log1p(-q) + k * math.log(q) + log_expm1)
    return float(np.logaddexp(0.0, logsumexp(terms)))


@functools.lru_cache(maxsize=1024)
def conversion_terms(delta: float) -> np.ndarray:
    """epsilon - rho at each order when converting (alpha, rho)-RDP to (epsilon, delta)-DP.

    Balle, Barthe, Gaboardi, Hsu, Sato 2020, Thm. 21 (the conversion Opacus uses):
    epsilon = rho + log((a-1)/a) - (log delta + log a) / (a - 1).
    At alpha = inf the term is 0 for any delta >= 0 (pure DP).
    """
    a = _A
    with np.errstate(divide="ignore"):
        logd = math.log(delta) if delta > 0 else -math.inf
    terms = np.log1p(-1.0 / a) - (logd + np.log(a)) / (a - 1)
    terms = np.append(terms, 0.0)
    terms.setflags(write=False)  # cached per delta: shared, so read-only
    return terms


def epsilon_from_curve(curve: np.ndarray, delta: float) -> float:
    """The smallest epsilon over the grid such that the curve gives (epsilon, delta)-DP."""
    eps = np.asarray(curve, dtype=float) + conversion_terms(delta)
    eps = np.where(np.isnan(eps), math.inf, eps)
    return max(0.0, float(np.min(eps)))


def best_order(curve: np.ndarray, delta: float) -> float:
    """The order at which ``epsilon_from_curve`` is attained."""
    eps = np.asarray(curve, dtype=float) + conversion_terms(delta)
    eps = np.where(np.isnan(eps), math.inf, eps)
    return float(ORDERS[int(np.argmin(eps))])
