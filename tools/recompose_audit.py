#!/usr/bin/env python3
"""Re-verify a privacy-budget audit export (format ``privacy-audit/1``) independently.

    python tools/recompose_audit.py EXPORT.json [--tolerance 1e-6] [--json]

This is the third party's check of the service. It imports nothing from the service
(standard library, numpy, scipy and Google's ``dp_accounting`` only) and, for every
dataset in the export:

1. **Hash chain.** Re-hashes every record: SHA-256 of the record without ``"hash"`` as
   ``json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
   encoded as UTF-8 (``export["hashing"]``). Checks that ``seq`` runs 1..n, that the first
   ``prev_hash`` is the genesis (64 zeros) and every later one is the hash of the record
   before it, and that the last hash and n equal the dataset's ``head``.

2. **Re-composition.** Composes the events of the ``commit`` records in ``seq`` order
   with its own accountants and compares the result with every record's ``totals`` (the
   dataset's committed spend after that record, reported at ``totals["at_delta"]``) and
   with each commit's ``charge``, within ``--tolerance`` (relative):

   * ``rdp``: each mechanism's Rényi-DP curve from ``dp_accounting.rdp.RdpAccountant``
     on the service's grid of orders, curves added, then converted to (epsilon, delta)
     with ``dp_accounting``'s ``compute_epsilon`` (Balle et al. 2020 conversion). See
     "RDP rules" below.
   * ``basic``: sum of per-release epsilons and deltas. Laplace: its epsilon. Gaussian at
     the delta the event states: the analytic Gaussian mechanism (Balle-Wang 2018,
     Thm. 8), solved here by bisection with scipy. Subsampled Gaussian at its delta: the
     RDP conversion of that one event (dp_accounting). ``epsilon_delta``: its (eps, delta).
   * ``advanced``: the heterogeneous advanced-composition bound of Kairouz-Oh-Viswanath
     2015 (Thm. 3.5) from the same per-release (eps_i, delta_i), at
     delta' = at_delta - sum delta_i, exactly as the export's ``accounting`` section
     states it (falls back to basic composition when delta' <= 0).

   A ``non_private`` part of a committed event is not charged against the epsilon
   budget (the ledger's rule; the dataset's DP guarantee does not cover it): it is
   composed as a no-op and counted apart.

3. **Cap.** The gating policy's privacy-filter epsilon (``spent_filter[policy]``, as
   exported) must be <= the budget epsilon, and so must the plain composition under the
   policy's accountant re-composed here at the budget's delta (for ``basic`` also: sum of
   deltas <= budget delta). A filter may charge more than the plain composition (it is
   valid under adaptive choice of requests); both numbers are reported. Under ``rdp`` the
   filter is also re-composed here (``filter_rdp``: Feldman-Zrnic 2021, one filter per
   order, with the dataset's ``budget.approx_delta_share`` of delta for approximate-DP
   events, 0.1 when the export predates that setting) and must match the exported one.

   The ``settings`` records (the first, outcome ``registered``, the values the dataset
   was registered with; the others an officer's changes): each starts where the one
   before left that setting, and the last one's budget epsilon and delta, policy and
   delta share are the exported budget's.

4. **Refined report.** The dataset's ``refined.rdp`` (exports from issue 16 on; outside
   the hashes, so older exports without it are only noted): the plain RDP composition of
   the committed events with the order chosen off the grid. Any order alpha > 1 gives a
   valid conversion of a fixed composition (Mironov 2017, Prop. 3), so the figure is
   valid if it is the Balle et al. 2020 (Thm. 21) conversion at its stated order: the
   events' curves are re-computed here at that one order (the rules below; the signed
   series at fractional orders) and converted; up to 0.1% above it is accepted (the service
   bounds a fractional order's RDP by the chord of its integer neighbours where Opacus's
   series keeps no digits, at tiny sampling rates: valid, a little above). It must also be at most the grid total
   (the refinement never reports more). The same for each commit's refined charge
   (``refined.charges``: seq, epsilon, order, at_delta) against its own event.

5. **PLD-certified synthesis.** A ``commit`` of the ``synthesis`` engine whose request
   ``params`` ask for ``accountant: pld`` (an MST run calibrated under PLD, at one row per
   privacy unit) states its target in ``params.epsilon``. Its event's ``gaussian`` parts
   are OpenDP discrete Gaussians on integer counts whose parameter sigma is the noise
   multiplier (sensitivity 1: one row moves one cell), its ``epsilon_delta`` parts pure
   selections (delta 0). The run's PLD is composed here with ``dp_accounting``
   (``from_discrete_gaussian_mechanism``, exact up to truncation at mass 1e-30;
   ``from_privacy_parameters`` for the pure parts, randomised response, which dominates
   every pure-DP mechanism; pessimistic buckets of 2e-4: an upper bound) and must be at
   most the target at the request's delta (``params.delta``, else the record's
   ``totals.at_delta``). The ledger's charge is the same event by RDP (above the target:
   PLD is no filter across requests), checked in 2. like any other.

Exit status 0 if every check passes, 1 otherwise. ``--json`` prints a machine-readable
result instead of the text report. Measured agreement with the service's own numbers is
about 1e-12 relative (see tools/README.md), so the default tolerance of 1e-6 is wide.

Composition rules this script applies (they are the rules the export documents; where
the export is silent, the service's documented choice is followed and named here):

* Events: ``laplace`` {epsilon} or {scale, sensitivity} (epsilon = sensitivity/scale);
  ``gaussian`` {noise_multiplier, delta}; ``subsampled_gaussian`` {sample_rate,
  noise_multiplier, steps, delta}; ``epsilon_delta`` {epsilon, delta}; ``self_composed``
  {event, count}; ``composed`` {events}; ``no_op``; ``non_private``.
* ``self_composed`` of a Gaussian is one Gaussian with noise multiplier z / sqrt(k)
  (Gaussians compose exactly to a Gaussian), charged once at its stated delta under
  basic/advanced; of a subsampled Gaussian, the same event with k times the steps. Any
  other ``self_composed`` is k releases of its inner event.
* RDP rules. Orders: the service's fixed grid (``SERVICE_ORDERS`` below, 1.001 ... 4096)
  plus alpha = infinity (pure DP: the sum of pure epsilons, infinite once a Gaussian-type
  event is in). Conversion: dp_accounting's ``compute_epsilon``, which leaves orders
  <= 1.01 unused (they attain the minimum only at absurd epsilons); its KL-divergence
  shortcut (epsilon 0 when rho < -log(1 - delta^2)) is not part of the service's rule
  and is replaced by the same Thm. 21 expression at those orders (``Orders.to_epsilon``).
  Laplace:
  ``LaplaceDpEvent(noise_multiplier=1/epsilon)``. Gaussian: ``GaussianDpEvent(z)``.
  Subsampled Gaussian: ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)),
  steps)`` (steps x the one-step curve) at the integer orders. At the fractional orders
  dp_accounting 0.6.0 is not used: its series drops the sign of the binomial coefficients
  (a looser bound, up to several per cent above the true RDP at orders below 3, and
  infinite when 1,000 terms do not converge), so this script sums the signed series of
  Mironov-Talwar-Zhang 2019, Sec. 3.3 itself (``log_a_fractional``; it agrees with
  direct numerical integration of the definition). Every order is capped by the
  unsubsampled Gaussian's curve (subsampling never costs privacy); like the service,
  fractional orders are not evaluated when q >= 0.4 (the series converges too slowly
  there) and take the unsubsampled bound.
  ``epsilon_delta`` cannot go into ``RdpAccountant`` (no such event): its pure part is
  the RDP curve of binary randomized response at that epsilon, which dominates every
  epsilon-DP mechanism (Bun-Steinke 2016, Prop. 3.3), computed with
  ``RandomizedResponseDpEvent(noise_parameter=2/(e^eps+1), num_buckets=2)`` in an
  ``RdpAccountant`` with the REPLACE_ONE relation (whose curve is exactly that one), capped
  at epsilon; its delta (if > 0) is not RDP and is taken from the target delta before
  converting (delta-approximate RDP). If those deltas use the whole target delta only
  alpha = infinity is usable and the reported delta is their sum. As the service states,
  when basic composition is tighter than the RDP conversion (and its deltas fit in the
  target) the ``rdp`` total is the basic epsilon.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp
from scipy.special import gammaln, log_ndtr, logsumexp

FORMAT = "privacy-audit/1"
GENESIS = "0" * 64
ACCOUNTANTS = ("basic", "advanced", "rdp")
DEFAULT_TOLERANCE = 1e-6

# The service's RDP grid (accounting/rdp_math.py, FINITE_ORDERS) for format
# privacy-audit/1; alpha = infinity is handled separately (pure DP). An export that lists
# its orders in accounting.rdp.orders overrides this.
SERVICE_ORDERS = (
    1.001, 1.002, 1.005, 1.01, 1.02, 1.03, 1.05, 1.075, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5,
    1.6, 1.75, 1.9, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
    10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0,
    80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0,
)
FRACTIONAL_MAX_RATE = 0.4  # subsampled Gaussian: fractional orders only below this rate

MAX_DEPTH = 16
MAX_NODES = 2000


class EventProblem(ValueError):
    """A record's event that cannot be read or charged."""


# --------------------------------------------------------------------------- events
#
# Events are read into plain tuples: ("laplace", eps), ("gaussian", z, delta),
# ("subsampled_gaussian", q, z, steps, delta), ("epsilon_delta", eps, delta),
# ("self_composed", inner, k), ("composed", (e1, ...)), ("no_op",), ("non_private",).

_FIELDS = {
    "laplace": {"epsilon", "scale", "sensitivity"},
    "gaussian": {"noise_multiplier", "delta"},
    "subsampled_gaussian": {"sample_rate", "noise_multiplier", "steps", "delta"},
    "epsilon_delta": {"epsilon", "delta"},
    "self_composed": {"event", "count"},
    "composed": {"events"},
    "no_op": set(),
    "non_private": set(),
}


def _num(d: dict, key: str, path: str, *, required=True, zero_ok=False, upper=None):
    v = d.get(key)
    if v is None:
        if required:
            raise EventProblem(f"{path}: '{key}' is required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EventProblem(f"{path}: '{key}' must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok) or (upper is not None and v > upper):
        raise EventProblem(f"{path}: '{key}' out of range: {v!r}")
    return v


def _count(d: dict, key: str, path: str) -> int:
    v = d.get(key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise EventProblem(f"{path}: '{key}' must be a positive integer, got {v!r}")
    return v


def parse_event(data, path: str = "event", depth: int = 0, nodes: list | None = None):
    nodes = nodes if nodes is not None else [0]
    nodes[0] += 1
    if nodes[0] > MAX_NODES or depth > MAX_DEPTH:
        raise EventProblem(f"{path}: event too large or nested too deeply")
    if not isinstance(data, dict):
        raise EventProblem(f"{path}: an event must be an object, got {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise EventProblem(f"{path}: unknown kind {kind!r}")
    extra = set(data) - _FIELDS[kind] - {"kind"}
    if extra:
        raise EventProblem(f"{path}: unknown field(s) for {kind}: {', '.join(sorted(map(str, extra)))}")
    if kind == "laplace":
        if "epsilon" in data and data["epsilon"] is not None:
            if data.get("scale") is not None or data.get("sensitivity") is not None:
                raise EventProblem(f"{path}: give either epsilon or scale and sensitivity")
            return ("laplace", _num(data, "epsilon", path))
        eps = _num(data, "sensitivity", path) / _num(data, "scale", path)
        if not (math.isfinite(eps) and eps > 0):
            raise EventProblem(f"{path}: sensitivity / scale is not a finite positive epsilon")
        return ("laplace", eps)
    if kind == "gaussian":
        return ("gaussian", _num(data, "noise_multiplier", path), _num(data, "delta", path, required=False, upper=1))
    if kind == "subsampled_gaussian":
        return ("subsampled_gaussian", _num(data, "sample_rate", path, upper=1), _num(data, "noise_multiplier", path),
                _count(data, "steps", path), _num(data, "delta", path, required=False, upper=1))
    if kind == "epsilon_delta":
        return ("epsilon_delta", _num(data, "epsilon", path),
                _num(data, "delta", path, required=False, zero_ok=True, upper=1) or 0.0)
    if kind == "self_composed":
        return ("self_composed", parse_event(data.get("event"), f"{path}.event", depth + 1, nodes),
                _count(data, "count", path))
    if kind == "composed":
        items = data.get("events")
        if not isinstance(items, list):
            raise EventProblem(f"{path}: 'events' must be a list")
        return ("composed", tuple(parse_event(e, f"{path}.events[{i}]", depth + 1, nodes)
                                  for i, e in enumerate(items)))
    return (kind,)


def has_non_private(e) -> bool:
    if e[0] == "non_private":
        return True
    if e[0] == "self_composed":
        return has_non_private(e[1])
    if e[0] == "composed":
        return any(has_non_private(s) for s in e[1])
    return False


def charged(e):
    """The part charged against the epsilon budget: non-private parts become no-ops."""
    if e[0] == "non_private":
        return ("no_op",)
    if e[0] == "self_composed":
        return ("self_composed", charged(e[1]), e[2])
    if e[0] == "composed":
        return ("composed", tuple(charged(s) for s in e[1]))
    return e


def normalise(e):
    """Collapse self-composed Gaussians (z / sqrt(k)) and subsampled Gaussians (k x steps)."""
    if e[0] == "self_composed":
        inner, k = normalise(e[1]), e[2]
        if inner[0] == "gaussian":
            return ("gaussian", inner[1] / math.sqrt(k), inner[2])
        if inner[0] == "subsampled_gaussian":
            return ("subsampled_gaussian", inner[1], inner[2], inner[3] * k, inner[4])
        if inner[0] == "no_op":
            return inner
        if inner[0] == "self_composed":
            return ("self_composed", inner[1], inner[2] * k)
        return ("self_composed", inner, k)
    if e[0] == "composed":
        return ("composed", tuple(normalise(s) for s in e[1]))
    return e


def leaves(e, m: int = 1, out: list | None = None) -> list:
    """[(leaf, multiplicity)] of a normalised event, no-ops dropped."""
    out = [] if out is None else out
    if e[0] == "self_composed":
        leaves(e[1], m * e[2], out)
    elif e[0] == "composed":
        for s in e[1]:
            leaves(s, m, out)
    elif e[0] != "no_op":
        out.append((e, m))
    return out


# --------------------------------------------------------------------------- mechanisms


def _gaussian_log_delta(z: float, eps: float) -> float:
    """log of the smallest delta of the Gaussian mechanism at eps (Balle-Wang 2018, Thm. 8):
    delta = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z), in log space."""
    la = float(log_ndtr(1.0 / (2 * z) - eps * z))
    lb = eps + float(log_ndtr(-1.0 / (2 * z) - eps * z))
    if lb >= la:
        return -math.inf
    return la + math.log1p(-math.exp(lb - la))


@functools.lru_cache(maxsize=4096)
def gaussian_epsilon(z: float, delta: float) -> float:
    """Smallest epsilon at which the Gaussian mechanism (noise multiplier z) is
    (epsilon, delta)-DP, by bisection down to adjacent floats (upper end returned)."""
    if not delta > 0:
        return math.inf
    if delta >= 1:
        return 0.0
    target = math.log(delta)
    if _gaussian_log_delta(z, 0.0) <= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while _gaussian_log_delta(z, hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            return math.inf
    for _ in range(4000):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if _gaussian_log_delta(z, mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def log_a_fractional(q: float, sigma: float, alpha: float, max_terms: int = 200_000) -> float:
    """log A_alpha of the Poisson-subsampled Gaussian at a fractional order alpha, 0 < q < 1
    (Mironov, Talwar, Zhang 2019, Sec. 3.3): RDP = log(A_alpha) / (alpha - 1), where

        A_alpha = sum_i C(alpha, i) [ q^i (1-q)^(alpha-i) e^((i^2-i)/(2 s^2)) Phi((z0-i)/s)
                                     + q^(alpha-i) (1-q)^i e^((j^2-j)/(2 s^2)) Phi((j-z0)/s) ],
        j = alpha - i,  z0 = s^2 log(1/q - 1) + 1/2.

    For i > alpha the binomial coefficient C(alpha, i) alternates in sign, and the sign is
    kept here. (dp_accounting 0.6.0's ``_compute_log_a_frac`` adds |C(alpha, i)|: a valid
    but looser bound, several per cent above the true value at small orders, and it gives
    up, returning infinity, after 1,000 terms; its integer orders are exact and used.)
    Terms are summed in blocks until they are below e^-40 of the total and decreasing;
    returns inf if that does not happen within ``max_terms``.
    """
    log_q, log_1mq = math.log(q), math.log1p(-q)
    z0 = sigma * sigma * (log_1mq - log_q) + 0.5  # log(1/q - 1), where 1/q overflows below q = 5.6e-309
    lg_alpha = gammaln(alpha + 1)
    fl = math.floor(alpha)
    pos = neg = -math.inf
    start, block = 0, 64
    while start < max_terms:
        i = np.arange(start, start + block, dtype=float)
        j = alpha - i
        log_coef = lg_alpha - gammaln(i + 1) - gammaln(j + 1)  # log |C(alpha, i)|
        negative = (np.maximum(i - 1 - fl, 0) % 2) == 1        # sign of C(alpha, i)
        s0 = log_coef + i * log_q + j * log_1mq + (i * i - i) / (2 * sigma * sigma) + log_ndtr((z0 - i) / sigma)
        s1 = log_coef + j * log_q + i * log_1mq + (j * j - j) / (2 * sigma * sigma) + log_ndtr((j - z0) / sigma)
        terms = np.concatenate([s0, s1])
        signs = np.concatenate([negative, negative])
        if (~signs).any():
            pos = float(np.logaddexp(pos, logsumexp(terms[~signs])))
        if signs.any():
            neg = float(np.logaddexp(neg, logsumexp(terms[signs])))
        total = pos + math.log1p(-math.exp(neg - pos)) if neg < pos else -math.inf
        last = max(s0[-1], s1[-1])
        if (i[-1] > alpha + 1 and last < total - 40 and s0[-1] <= s0[-2] and s1[-1] <= s1[-2]):
            return total
        start += block
        block = min(block * 2, 8192)
    return math.inf


class Orders:
    def __init__(self, finite):
        self.finite = np.array([float(a) for a in finite])
        self.integer = np.array([float(a).is_integer() for a in finite])
        self._cache: dict = {}

    def accountant(self, relation=None, orders=None) -> _rdp.RdpAccountant:
        kw = {} if relation is None else {"neighboring_relation": relation}
        return _rdp.RdpAccountant(orders=list(self.finite if orders is None else orders), **kw)

    def _curve(self, key) -> np.ndarray:
        """The RDP curve of one mechanism on the finite orders (cached per key)."""
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._compute_curve(key)
        return cached

    def _compute_curve(self, key) -> np.ndarray:
        kind = key[0]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if kind == "laplace":
                acc = self.accountant()
                acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / key[1]))
                curve = np.minimum(acc.rdp, key[1])
            elif kind == "gaussian":
                acc = self.accountant()
                acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=key[1]))
                curve = acc.rdp
            elif kind == "poisson_step":  # one step of the Poisson-subsampled Gaussian
                q, z = key[1], key[2]
                plain = self._curve(("gaussian", z))
                sub = np.full(len(self.finite), math.inf)
                acc = self.accountant(orders=self.finite[self.integer])
                try:  # integer orders: dp_accounting's exact binomial expansion
                    acc.compose(dp_accounting.PoissonSampledDpEvent(
                        sampling_probability=q, event=dp_accounting.GaussianDpEvent(noise_multiplier=z)))
                    sub[self.integer] = acc.rdp
                except (ArithmeticError, ValueError):
                    pass
                if q < FRACTIONAL_MAX_RATE:  # fractional orders: the signed series (see log_a_fractional)
                    for i in np.flatnonzero(~self.integer):
                        alpha = float(self.finite[i])
                        sub[i] = log_a_fractional(q, z, alpha) / (alpha - 1)
                curve = np.minimum(np.where(np.isnan(sub), math.inf, sub), plain)
            elif kind == "pure":  # any eps-DP mechanism: binary randomized response
                eps = key[1]
                p = 2.0 / (math.exp(eps) + 1.0) if eps < 700 else 0.0
                if p > 0:
                    acc = self.accountant(relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
                    acc.compose(dp_accounting.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=2))
                    curve = np.minimum(acc.rdp, eps)
                else:
                    curve = np.full(len(self.finite), eps)
            else:  # pragma: no cover
                raise KeyError(kind)
        curve = np.where(np.isnan(curve), math.inf, np.maximum(np.asarray(curve, dtype=float), 0.0))
        curve.setflags(write=False)
        return curve

    def subsampled(self, q: float, z: float, steps: int) -> np.ndarray:
        if q >= 1.0:
            return self._curve(("gaussian", z)) * steps
        # RDP adds over steps: SelfComposedDpEvent(PoissonSampledDpEvent(q, Gaussian(z)), steps)
        # in RdpAccountant is exactly steps x the one-step curve; the one-step curve is cached.
        return self._curve(("poisson_step", q, z)) * steps

    def to_epsilon(self, curve: np.ndarray, delta: float) -> float:
        """(alpha, rho)-RDP -> (epsilon, delta)-DP, minimised over the finite orders:
        dp_accounting's ``compute_epsilon``, i.e. Balle et al. 2020, Thm. 21,
        epsilon = rho + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1), orders <= 1.01
        unused. One departure: at orders where rho < -log(1 - delta^2), compute_epsilon
        returns epsilon = 0 from a KL-divergence bound, which the service's stated rule
        (Thm. 21 alone) does not use; there the same Thm. 21 expression is evaluated
        instead, so that the service's numbers can be reproduced (the KL bound is valid and
        tighter: the service is conservative in that regime, which only very small
        releases reach)."""
        if not delta > 0:
            return math.inf
        curve = np.asarray(curve, dtype=float)
        with np.errstate(all="ignore"):
            kl = delta * delta + np.expm1(-curve) > 0
        eps = math.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if (~kl).any():
                eps, _ = _rdp.compute_epsilon(list(self.finite[~kl]), list(curve[~kl]), delta)
        a = self.finite[kl & (self.finite > 1.01)]
        if len(a):
            r = curve[kl & (self.finite > 1.01)]
            eps = min(float(eps), float(np.min(r + np.log1p(-1 / a) - np.log(delta * a) / (a - 1))))
        eps = float(eps)
        return math.inf if math.isnan(eps) else max(0.0, eps)


# --------------------------------------------------------------------------- composition


@dataclass
class State:
    """Sufficient statistics of a list of releases for all three accountants."""

    curve: np.ndarray          # RDP at the finite orders
    pure: float = 0.0          # RDP at alpha = inf (sum of pure epsilons; inf with a Gaussian)
    approx: float = 0.0        # sum of deltas of approximate-DP epsilon_delta events
    eps: float = 0.0           # sum of per-release epsilon_i
    delta: float = 0.0         # sum of per-release delta_i
    sq: float = 0.0            # sum of epsilon_i^2
    tanh: float = 0.0          # sum of epsilon_i tanh(epsilon_i / 2)

    def __add__(self, o: State) -> State:
        with np.errstate(all="ignore"):
            return State(self.curve + o.curve, self.pure + o.pure, self.approx + o.approx, self.eps + o.eps,
                         self.delta + o.delta, self.sq + o.sq, self.tanh + o.tanh)


def zero_state(orders: Orders) -> State:
    return State(np.zeros(len(orders.finite)))


def _release(orders: Orders, curve, pure, eps_i, delta_i, m, approx=0.0) -> State:
    tanh = eps_i * math.tanh(eps_i / 2) if math.isfinite(eps_i) else math.inf
    with np.errstate(all="ignore"):
        return State(np.asarray(curve, dtype=float) * m, pure * m, approx * m, eps_i * m, delta_i * m,
                     eps_i * eps_i * m, tanh * m)


def event_state(orders: Orders, event) -> State:
    """What one committed event adds (its non-private parts excepted)."""
    total = zero_state(orders)
    for leaf, m in leaves(normalise(charged(event))):
        kind = leaf[0]
        if kind == "laplace":
            eps = leaf[1]
            total = total + _release(orders, orders._curve(("laplace", eps)), eps, eps, 0.0, m)
        elif kind == "gaussian":
            z, d = leaf[1], leaf[2]
            if d is None:
                raise EventProblem("a gaussian part states no delta (the ledger stamps one on every commit)")
            total = total + _release(orders, orders._curve(("gaussian", z)), math.inf, gaussian_epsilon(z, d), d, m)
        elif kind == "subsampled_gaussian":
            q, z, steps, d = leaf[1:]
            if d is None:
                raise EventProblem("a subsampled_gaussian part states no delta (the ledger stamps one on every commit)")
            curve = orders.subsampled(q, z, steps)
            total = total + _release(orders, curve, math.inf, orders.to_epsilon(curve, d), d, m)
        elif kind == "epsilon_delta":
            eps, d = leaf[1], leaf[2]
            total = total + _release(orders, orders._curve(("pure", eps)), eps, eps, d, m, approx=d)
        else:  # pragma: no cover - parse_event admits nothing else
            raise EventProblem(f"no rule for {kind}")
    return total


def spent_basic(s: State, delta: float) -> tuple[float, float]:
    return s.eps, s.delta


def kov_epsilon(sum_eps: float, sum_sq: float, sum_tanh: float, delta_prime: float) -> float:
    """Kairouz-Oh-Viswanath 2015, Thm. 3.5 (heterogeneous), with the trivial bound."""
    if not delta_prime > 0 or sum_sq == 0:
        return sum_eps
    a = sum_tanh + math.sqrt(2 * sum_sq * math.log(math.e + math.sqrt(sum_sq) / delta_prime))
    b = sum_tanh + math.sqrt(2 * sum_sq * math.log(1 / delta_prime))
    return min(sum_eps, a, b)


def spent_advanced(s: State, delta: float) -> tuple[float, float]:
    delta_prime = delta - s.delta
    if not delta_prime > 0 or not math.isfinite(s.sq):
        return s.eps, s.delta
    return kov_epsilon(s.eps, s.sq, s.tanh, delta_prime), delta


def spent_rdp(s: State, delta: float, orders: Orders) -> tuple[float, float]:
    rest = delta - s.approx
    if rest > 0:
        eps, out_delta = min(orders.to_epsilon(s.curve, rest), s.pure), delta
    else:  # the approximate-DP deltas use the whole target: only alpha = inf (pure DP) is usable
        eps, out_delta = s.pure, s.approx
    eps = max(0.0, eps)
    if s.delta <= delta and s.eps < eps:  # basic composition is tighter and fits
        return s.eps, delta
    return eps, out_delta


def filter_rdp(s: State, budget_delta: float, share: float, orders: Orders) -> float:
    """The RDP privacy filter's epsilon (Feldman-Zrnic 2021, Thm. 3.1, one filter per
    order, union bound over orders): approximate-DP deltas may use at most ``share`` of the
    budget's delta; the finite orders share the rest equally; alpha = infinity (pure DP)
    needs none. Balle et al. 2020, Thm. 21 at every finite order (orders <= 1.01 too,
    as the service's rule states), minimised with alpha = infinity."""
    if s.approx > share * budget_delta * (1 + 1e-12):
        return math.inf
    per_order = (1 - share) * budget_delta / len(orders.finite)
    eps = s.pure
    if per_order > 0:
        a = orders.finite
        with np.errstate(all="ignore"):
            at = s.curve + np.log1p(-1 / a) - (math.log(per_order) + np.log(a)) / (a - 1)
        at = np.where(np.isnan(at), math.inf, at)
        eps = min(eps, float(np.min(at)))
    return max(0.0, eps)


def spent_all(s: State, delta: float, orders: Orders) -> dict:
    return {"basic": spent_basic(s, delta), "advanced": spent_advanced(s, delta), "rdp": spent_rdp(s, delta, orders)}


# --------------------------------------------------------------------------- checking


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def as_float(x) -> float:
    """A number from the export; the service writes infinities as the strings "inf"/"-inf"."""
    if isinstance(x, bool):
        raise TypeError("boolean is not a number")
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("inf", "-inf", "Infinity", "-Infinity"):
        return math.inf if not x.startswith("-") else -math.inf
    raise TypeError(f"not a number: {x!r}")


def rel_diff(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def fmt(x) -> str:
    if isinstance(x, float):
        return "inf" if x == math.inf else f"{x:.10g}"
    return str(x)


@dataclass
class DatasetResult:
    name: str
    records: int = 0
    counts: dict = field(default_factory=dict)
    chain_ok: bool = True
    first_broken: int | None = None
    head: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    max_rel_diff: dict = field(default_factory=lambda: {a: 0.0 for a in ACCOUNTANTS})
    compared: int = 0
    final: dict = field(default_factory=dict)
    cap: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    carried: dict = field(default_factory=dict)
    refined: dict = field(default_factory=dict)
    pld: list = field(default_factory=list)

    def problem(self, seq, check: str, message: str):
        self.problems.append({"seq": seq, "check": check, "message": message})
        if check == "chain":
            self.chain_ok = False
            if seq is not None and (self.first_broken is None or seq < self.first_broken):
                self.first_broken = seq

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            return v

        return clean({"name": self.name, "ok": self.ok, "records": self.records, "counts": self.counts,
                      "chain_ok": self.chain_ok, "first_broken_record": self.first_broken, "head": self.head,
                      "records_compared": self.compared, "max_rel_diff": self.max_rel_diff, "final": self.final,
                      "cap": self.cap, "notes": self.notes, "carried_differences": self.carried,
                      "refined": self.refined, "pld_certified": self.pld,
                      "problems": self.problems})


def check_chain(ds: dict, records: list, genesis: str, res: DatasetResult) -> None:
    prev = genesis
    expected = 1
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            res.problem(expected, "chain", f"the record after record {expected - 1} is not an object")
            prev, expected = None, expected + 1
            continue
        seq = rec.get("seq")
        if seq != expected:
            res.problem(seq if isinstance(seq, int) else expected, "chain",
                        f"out of sequence: expected record {expected}, found {seq!r} "
                        "(a record was deleted, inserted or reordered)")
        expected = (seq if isinstance(seq, int) and not isinstance(seq, bool) else expected) + 1
        if rec.get("prev_hash") != prev:
            res.problem(seq, "chain", "prev_hash is not the hash of the record before it "
                                      "(a record before it was deleted, inserted, reordered or edited)")
        if rec.get("dataset") != ds.get("name"):
            res.problem(seq, "chain", f"belongs to dataset {rec.get('dataset')!r}, not {ds.get('name')!r}")
        body = {k: v for k, v in rec.items() if k != "hash"}
        try:
            digest = hashlib.sha256(canonical(body)).hexdigest()
        except (TypeError, ValueError) as e:
            digest = f"(cannot hash: {e})"
        if digest != rec.get("hash"):
            res.problem(seq, "chain", "its hash does not match its content (the record was edited)")
        prev = rec.get("hash")
    head = ds.get("head") or {}
    if not isinstance(head, dict):
        res.problem(None, "format", f"the dataset's head is a {type(head).__name__}, not an object with seq and hash")
        head = {}
    last_seq = len(records)
    last_hash = prev if records else genesis
    res.head = {"seq": head.get("seq"), "hash": head.get("hash"), "chain_seq": last_seq, "chain_hash": last_hash}
    if head.get("seq") != last_seq or head.get("hash") != last_hash:
        why = ("records were deleted or inserted" if head.get("hash") == last_hash
               else "records were deleted or added at the end, or the last record was edited")
        res.problem(None, "chain", f"the head says {head.get('seq')} records ending in {str(head.get('hash'))[:12]}, "
                                   f"the chain has {last_seq} ending in {str(last_hash)[:12]} ({why})")


def _compare(res: DatasetResult, seq, where: str, exported: dict, mine: dict, tol: float,
             diverged: dict | None = None) -> None:
    """Compare exported epsilon/delta per accountant with the re-composed ones. With
    ``diverged`` (running totals), a difference is listed where it starts; records that
    only carry it forward are counted in ``res.carried``."""
    for acc in ACCOUNTANTS:
        got = exported.get(acc) if isinstance(exported, dict) else None
        if not isinstance(got, dict):
            res.problem(seq, "recompose", f"{where} has no {acc} entry")
            continue
        for j, key in enumerate(("epsilon", "delta")):
            try:
                value = as_float(got.get(key))
            except TypeError:
                res.problem(seq, "recompose", f"{where}: {acc} {key} is not a number: {got.get(key)!r}")
                continue
            d = rel_diff(value, mine[acc][j])
            res.max_rel_diff[acc] = max(res.max_rel_diff[acc], d)
            if diverged is not None:
                was, diverged[(acc, key)] = diverged.get((acc, key), False), d > tol
                if d > tol and was:
                    res.carried[acc] = res.carried.get(acc, 0) + 1
                    continue
            if d > tol:
                direction = "more (over-charged)" if value > mine[acc][j] else "less (under-charged)"
                res.problem(seq, "recompose",
                            f"{where}: {acc} {key} is {fmt(value)}, re-composed {fmt(mine[acc][j])} "
                            f"(relative difference {d:.3g}; the export states {direction})")


def _refined_one(ref, events: list, grid_of, orders: Orders):
    """(stated epsilon, order, delta, re-computed epsilon, grid epsilon) of one refined
    figure ``ref`` for the composition of ``events``; ``grid_of(delta)`` is the grid's."""
    eps, at = as_float(ref.get("epsilon")), as_float(ref.get("at_delta"))
    order = None if ref.get("order") is None else as_float(ref.get("order"))
    grid = grid_of(at)
    if order is not None and math.isfinite(order) and order > 1:
        one = Orders([order])
        s = zero_state(one)
        for e in events:
            s = s + event_state(one, e)
        rest = at - s.approx
        mine = math.inf
        if rest > 0:
            with np.errstate(all="ignore"):
                mine = float(s.curve[0] + math.log1p(-1 / order) - (math.log(rest) + math.log(order)) / (order - 1))
            mine = math.inf if math.isnan(mine) else max(0.0, mine)
    else:  # no order: the grid's own answer (pure DP, or basic composition where tighter)
        mine = grid
    return eps, order, at, mine, grid


CHORD_SLACK = 1e-3  # how far above the conversion at its order a refined figure may lie (check_refined)


def check_refined(ds: dict, events: list, commits: dict, state: State, orders: Orders, tol: float,
                  res: DatasetResult) -> None:
    """4.: each exported refined RDP figure (the total; each commit's) is Thm. 21 at its
    stated order (or up to ``CHORD_SLACK`` above it) and at most the grid's. ``commits``: seq -> (event, its grid State)."""
    refined = ds.get("refined") if isinstance(ds.get("refined"), dict) else {}
    if refined.get("rdp") is None:
        res.notes.append("no refined rdp total in the export (exports before issue 16): not checked")
        return
    figures = [("the refined rdp total", None, refined["rdp"], events,
                lambda at: spent_rdp(state, at, orders)[0])]
    charges = refined.get("charges") if isinstance(refined.get("charges"), list) else []
    for c in charges:
        seq = c.get("seq") if isinstance(c, dict) else None
        if seq not in commits:
            res.problem(seq, "refined", f"a refined charge for {seq!r}, which is not a commit record")
            continue
        event, add = commits[seq]
        figures.append(("its refined rdp charge", seq, c, [event], lambda at, add=add: spent_rdp(add, at, orders)[0]))
    res.refined["charges"] = 0
    for what, seq, ref, evs, grid_of in figures:
        try:
            eps, order, at, mine, grid = _refined_one(ref, evs, grid_of, orders)
        except (TypeError, AttributeError):
            res.problem(seq, "refined", f"{what} is unreadable: {ref!r}")
            continue
        if seq is None:
            res.refined.update({"epsilon": eps, "order": order, "at_delta": at, "recomputed": mine,
                                "grid_epsilon": grid})
        else:
            res.refined["charges"] += 1
        # the conversion at its order, or above it by at most CHORD_SLACK where the service
        # bounds a fractional order's RDP by the chord of its integer neighbours (Opacus's
        # series keeps none of its digits at a tiny sampling rate: q = 1/2400 gave 1.7289
        # where this tool's conversion is 1.7280, 0.05% above; valid, never under)
        if eps < mine * (1 - tol) or eps > mine * (1 + max(tol, CHORD_SLACK)):
            res.problem(seq, "refined", f"{what} {fmt(eps)} at order {fmt(order)} is not the conversion at that "
                                        f"order ({fmt(mine)}, re-computed here; at most {CHORD_SLACK:.1%} above it "
                                        "where a fractional order is bounded by its integer neighbours)")
        if eps > grid * (1 + tol):
            res.problem(seq, "refined", f"{what} {fmt(eps)} is above the grid's {fmt(grid)}")


def pld_synthesis_epsilon(event, delta: float, interval: float = 2e-4) -> float:
    """5.: a PLD-certified MST run's epsilon at ``delta`` from its event (see the module
    docstring); EventProblem if a part is neither a Gaussian nor a pure release."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as plds

    total = None
    for leaf, m in leaves(charged(event)):
        if leaf[0] == "gaussian":
            one = plds.from_discrete_gaussian_mechanism(leaf[1], sensitivity=1, value_discretization_interval=interval)
        elif leaf[0] == "epsilon_delta" and leaf[2] == 0:
            one = plds.from_privacy_parameters(common.DifferentialPrivacyParameters(leaf[1], 0.0),
                                               value_discretization_interval=interval)
        else:
            raise EventProblem(f"a {leaf[0]} part is not a discrete Gaussian or pure release of MST")
        part = one.self_compose(m) if m > 1 else one
        total = part if total is None else total.compose(part)
    return 0.0 if total is None else float(total.get_epsilon_for_delta(delta))


def check_pld_synthesis(rec: dict, event, tol: float, res: DatasetResult) -> None:
    params = rec.get("params") if isinstance(rec.get("params"), dict) else {}
    if rec.get("engine") != "synthesis" or params.get("accountant") != "pld":
        return
    seq = rec.get("seq")
    try:
        target = as_float(params.get("epsilon"))
        delta = as_float(params["delta"] if "delta" in params else (rec.get("totals") or {}).get("at_delta"))
        got = pld_synthesis_epsilon(event, delta)
    except (TypeError, KeyError, EventProblem) as e:
        res.problem(seq, "pld", f"a PLD-certified synthesis that cannot be re-certified: {e}")
        return
    res.pld.append({"seq": seq, "target": target, "pld_epsilon": got, "delta": delta})
    if got > target * (1 + tol):
        res.problem(seq, "pld", f"a PLD-certified synthesis: its event's PLD epsilon is {fmt(got)}, above the "
                                f"target {fmt(target)} it was certified at")


# Actions added after the first exports (the officer's acts; no charge): absent from older counts.
LATER_ACTIONS = ("site_key", "settings", "grant")

SETTING_OF_BUDGET = {"budget_epsilon": "epsilon", "budget_delta": "delta", "policy": "policy",
                     "approx_delta_share": "approx_delta_share"}


def check_settings(records: list, budget: dict, res: DatasetResult) -> None:
    """The officer's ``settings`` records in order: each starts where the one before left
    the setting (else it was changed without a record in between), and the last one's
    budget, policy and delta share are the exported budget's."""
    now: dict = {}
    for rec in records:
        if not isinstance(rec, dict) or rec.get("action") != "settings":
            continue
        for name, change in (rec.get("params") or {}).items():
            if not (isinstance(change, list) and len(change) == 2):
                res.problem(rec.get("seq"), "settings", f"its change of {name} is not [old, new]")
                continue
            if name in now and now[name] != change[0]:
                res.problem(rec.get("seq"), "settings", f"it changes {name} from {change[0]!r}, the record "
                                                        f"before left it at {now[name]!r}")
            now[name] = change[1]
    for name, key in SETTING_OF_BUDGET.items():
        if name in now and key in budget and budget[key] != now[name]:
            res.problem(None, "settings", f"the budget's {key} is {budget[key]!r}, the last settings record "
                                          f"set {name} to {now[name]!r}")


def check_dataset(ds: dict, genesis: str, orders: Orders, tol: float) -> DatasetResult:
    res = DatasetResult(name=str(ds.get("name")))
    records = ds.get("records")
    if not isinstance(records, list):
        res.problem(None, "format", "the dataset has no records list (exported without records?)")
        return res
    res.records = len(records)
    counts = {a: 0 for a in ("commit", "release", "refuse", "replay") + LATER_ACTIONS} | {"non_private": 0}
    for rec in records:
        if isinstance(rec, dict):
            if rec.get("action") not in counts:
                res.problem(rec.get("seq"), "format", f"unknown action {rec.get('action')!r}")
                continue
            counts[rec.get("action")] += 1
            counts["non_private"] += rec.get("action") == "commit" and bool(rec.get("non_private"))
    res.counts = counts
    exported_counts = ds.get("counts")
    # (exports made before these records existed do not count them)
    if isinstance(exported_counts, dict) and any(exported_counts.get(k, 0 if k in LATER_ACTIONS else None) != v
                                                 for k, v in counts.items()):
        res.problem(None, "format", f"the dataset's counts {exported_counts} differ from its records {counts}")

    # 1. the chain
    check_chain(ds, records, genesis, res)

    # 2. re-composition, in seq order (the order of the records as given: a reordering is a chain problem)
    state = zero_state(orders)
    events: list = []
    commits: dict = {}
    last = None
    diverged: dict = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        seq = rec.get("seq")
        if rec.get("action") == "commit":
            try:
                event = parse_event(rec.get("event"))
                add = event_state(orders, event)
            except EventProblem as e:
                res.problem(seq, "recompose", f"its event cannot be charged: {e}")
                continue
            if has_non_private(event) and not rec.get("non_private"):
                res.problem(seq, "recompose", "its event has a non_private part but the record is not flagged")
            state = state + add
            events.append(event)
            commits[seq] = (event, add)
            check_pld_synthesis(rec, event, tol, res)
            charge = rec.get("charge")
            at = (rec.get("totals") or {}).get("at_delta") if isinstance(rec.get("totals"), dict) else None
            try:
                _compare(res, seq, "its charge", charge, spent_all(add, as_float(at), orders), tol)
            except TypeError:
                pass  # reported with the totals below
        totals = rec.get("totals")
        try:
            at_delta = as_float(totals.get("at_delta"))
        except (AttributeError, TypeError):
            res.problem(seq, "recompose", "its totals have no at_delta")
            continue
        mine = spent_all(state, at_delta, orders)
        _compare(res, seq, "its totals", totals, mine, tol, diverged)
        res.compared += 1
        last = (at_delta, mine)

    budget = ds.get("budget") or {}
    try:
        cap_eps, cap_delta = as_float(budget.get("epsilon")), as_float(budget.get("delta"))
    except TypeError:
        res.problem(None, "cap", f"the dataset's budget is unreadable: {budget!r}")
        return res
    policy = budget.get("policy")
    check_settings(records, budget, res)

    # the dataset-level totals are the last record's (or zero)
    ds_totals = ds.get("totals") or {}
    try:
        ds_at = as_float(ds_totals.get("at_delta"))
        _compare(res, None, "the dataset's totals", ds_totals, spent_all(state, ds_at, orders), tol, diverged)
        if last is not None and ds_at != last[0]:
            res.notes.append(f"the last record's totals are at delta {last[0]!r}, the dataset's at {ds_at!r}")
    except (AttributeError, TypeError):
        res.problem(None, "format", "the dataset's totals have no at_delta")
    for acc, n in res.carried.items():
        res.notes.append(f"{n} later total(s) of {acc} (records and the dataset's) carry a difference listed "
                         "below forward (not listed again)")
    final = spent_all(state, cap_delta, orders)
    exported_final = {a: (ds_totals.get(a) or {}).get("epsilon") for a in ACCOUNTANTS}
    res.final = {"at_delta": cap_delta,
                 **{a: {"epsilon": final[a][0], "delta": final[a][1], "exported_epsilon": exported_final[a]}
                    for a in ACCOUNTANTS}}
    if last is not None and last[0] != cap_delta:
        res.notes.append(f"the budget's delta {cap_delta!r} differs from the delta of the last totals {last[0]!r}")
    check_refined(ds, events, commits, state, orders, tol, res)

    # 3. the cap
    slack = 1 + 1e-12
    spent_filter = ds.get("spent_filter") or {}
    cap = {"policy": policy, "epsilon": cap_eps, "delta": cap_delta}
    if policy not in ACCOUNTANTS:
        res.problem(None, "cap", f"unknown policy {policy!r}")
    else:
        try:
            filt = as_float(spent_filter.get(policy))
        except TypeError:
            filt = None
            res.problem(None, "cap", f"the export has no filter epsilon for policy {policy}")
        plain_eps, plain_delta = final[policy]
        cap.update({"filter_epsilon": filt, "plain_epsilon": plain_eps, "plain_delta": plain_delta})
        if policy == "rdp":
            # the filter re-composed here with the dataset's delta share (exports before the
            # share was a setting carry none: the service's constant then, 0.1)
            share = budget.get("approx_delta_share", 0.1)
            try:
                share = as_float(share)
            except TypeError:
                share = math.nan
            if not 0.0 <= share < 1.0:
                res.problem(None, "cap", f"the dataset's approx_delta_share is unreadable: {budget.get('approx_delta_share')!r}")
            else:
                mine = filter_rdp(state, cap_delta, share, orders)
                cap.update({"approx_delta_share": share, "filter_recomposed": mine})
                if filt is not None and rel_diff(mine, filt) > tol:
                    res.problem(None, "cap", f"the exported rdp filter epsilon {fmt(filt)} differs from the one "
                                             f"re-composed here ({fmt(mine)}, delta share {share:g})")
                filt = mine if filt is None else max(filt, mine)
        cap["filter_ok"] = filt is not None and filt <= cap_eps * slack
        cap["plain_ok"] = plain_eps <= cap_eps * (1 + tol)
        if policy == "basic":
            cap["plain_ok"] = cap["plain_ok"] and plain_delta <= cap_delta * (1 + tol)
        if filt is not None and not cap["filter_ok"]:
            res.problem(None, "cap",
                        f"the {policy} filter epsilon {fmt(filt)} exceeds the budget epsilon {fmt(cap_eps)}")
        if not cap["plain_ok"]:
            res.problem(None, "cap", f"the re-composed {policy} total ({fmt(plain_eps)}, {fmt(plain_delta)}) "
                                     f"exceeds the budget ({fmt(cap_eps)}, {fmt(cap_delta)})")
    res.cap = cap
    return res


def check_export(export, tol: float, orders_override=None) -> dict:
    out = {"ok": False, "format": None, "tolerance": tol, "problems": [], "datasets": []}
    if not isinstance(export, dict):
        out["problems"].append("the file is not a JSON object")
        return out
    out["format"] = export.get("format")
    if export.get("format") != FORMAT:
        out["problems"].append(f"format is {export.get('format')!r}, this tool reads {FORMAT!r}")
    hashing = export.get("hashing") or {}
    if hashing.get("algorithm") != "sha256":
        out["problems"].append(f"hashing algorithm {hashing.get('algorithm')!r} is not sha256")
    genesis = hashing.get("genesis", GENESIS)
    if genesis != GENESIS:
        out["problems"].append(f"the export's genesis {genesis!r} is not 64 zeros")
        genesis = GENESIS
    grid = orders_override or ((export.get("accounting") or {}).get("rdp") or {}).get("orders") or SERVICE_ORDERS
    orders = Orders([a for a in grid if isinstance(a, (int, float)) and math.isfinite(a)])
    out["orders"] = "service grid (privacy-audit/1)" if grid is SERVICE_ORDERS else list(orders.finite)
    datasets = export.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        out["problems"].append("the export has no datasets")
        datasets = []
    results = []
    for ds in datasets:
        if not isinstance(ds, dict):
            out["problems"].append("a dataset entry is not an object")
            continue
        try:
            results.append(check_dataset(ds, genesis, orders, tol))
        except Exception as e:  # noqa: BLE001 - a malformed export is a failed check, not a crash
            res = DatasetResult(name=str(ds.get("name")))
            res.problem(None, "format", f"the dataset could not be checked: {type(e).__name__}: {e}")
            results.append(res)
    out["datasets"] = [r.as_dict() for r in results]
    claimed = export.get("verification") or {}
    found_ok = all(r.ok for r in results)
    out["service_verification"] = {"ok": claimed.get("ok"), "first_broken": claimed.get("first_broken")}
    out["ok"] = not out["problems"] and found_ok and bool(results)
    return out


# --------------------------------------------------------------------------- report


def text_report(result: dict, path: str) -> str:
    lines = [f"Audit export {path}: format {result.get('format')!r}, tolerance {result['tolerance']:g} (relative)"]
    for p in result["problems"]:
        lines.append(f"  PROBLEM: {p}")
    sv = result.get("service_verification") or {}
    if sv:
        lines.append(f"  the service's own verification in the export says: ok={sv.get('ok')} (not relied on)")
    for ds in result["datasets"]:
        c = ds["counts"]
        lines.append("")
        lines.append(f"dataset {ds['name']}: {ds['records']} records ({c.get('commit', 0)} commit, "
                     f"{c.get('release', 0)} release, {c.get('refuse', 0)} refuse, {c.get('replay', 0)} replay, "
                     f"{c.get('site_key', 0)} site_key, {c.get('settings', 0)} settings, "
                     f"{c.get('grant', 0)} grant; "
                     f"{c.get('non_private', 0)} non-private commits, not charged against epsilon)")
        head = ds["head"]
        if ds["chain_ok"]:
            lines.append(f"  chain: ok, {head.get('chain_seq')} records, head {head.get('chain_hash')} matches")
        else:
            where = f"record {ds['first_broken_record']}" if ds["first_broken_record"] is not None else "its end"
            lines.append(f"  chain: BROKEN, first broken at {where}")
        fin = ds.get("final") or {}
        if fin:
            lines.append(f"  totals at delta {fin['at_delta']:.6g} after {ds['records_compared']} records "
                         "(checked after every record):")
            lines.append(f"    {'accountant':<10} {'exported eps':>16} {'re-composed eps':>16} {'delta':>12} "
                         f"{'max rel diff':>12}")
            for a in ACCOUNTANTS:
                f = fin[a]
                exp = f["exported_epsilon"]
                lines.append(f"    {a:<10} {fmt(exp) if exp is not None else '-':>16} {fmt(f['epsilon']):>16} "
                             f"{fmt(f['delta']):>12} {ds['max_rel_diff'][a]:>12.3g}")
        cap = ds.get("cap") or {}
        if "filter_epsilon" in cap:
            lines.append(f"  cap ({cap['policy']} policy, budget epsilon {fmt(cap['epsilon'])}, "
                         f"delta {fmt(cap['delta'])}):")
            lines.append(f"    {cap['policy']} filter epsilon (exported) {fmt(cap['filter_epsilon'])} <= "
                         f"{fmt(cap['epsilon'])}: {'ok' if cap['filter_ok'] else 'NO'}")
            lines.append(f"    plain {cap['policy']} composition (re-composed) {fmt(cap['plain_epsilon'])} <= "
                         f"{fmt(cap['epsilon'])}: {'ok' if cap['plain_ok'] else 'NO'}")
        ref = ds.get("refined") or {}
        if "epsilon" in ref:
            lines.append(f"  refined rdp total (order {fmt(ref['order'])} off the grid) {fmt(ref['epsilon'])}, "
                         f"re-computed at that order {fmt(ref['recomputed'])}; the grid's {fmt(ref['grid_epsilon'])}; "
                         f"{ref.get('charges', 0)} refined commit charges re-computed at their orders")
        for p in ds.get("pld_certified") or []:
            lines.append(f"  record {p['seq']}: PLD-certified synthesis, re-certified here at epsilon "
                         f"{fmt(p['pld_epsilon'])} <= target {fmt(p['target'])} (delta {fmt(p['delta'])})")
        for n in ds.get("notes") or []:
            lines.append(f"  note: {n}")
        probs = ds["problems"]
        for p in probs[:25]:
            where = f"record {p['seq']}" if p["seq"] is not None else "dataset"
            lines.append(f"  PROBLEM [{p['check']}] {where}: {p['message']}")
        if len(probs) > 25:
            lines.append(f"  ... and {len(probs) - 25} more problems (--json lists them all)")
        lines.append(f"  result: {'ok' if ds['ok'] else 'FAILED'}")
    lines.append("")
    lines.append("RESULT: ok, every check passed" if result["ok"] else "RESULT: FAILED")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Independently re-verify a privacy-audit/1 JSON export: hash chain, re-composed totals, cap, "
                    "the refined RDP total and PLD-certified syntheses.",
        epilog="Exit status: 0 if every check passes, 1 otherwise.")
    parser.add_argument("export", help="the JSON export (manage.py audit export --format json)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="relative tolerance for re-composed epsilons and deltas (default %(default)g)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable result")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    try:
        with open(args.export, "rb") as f:
            export = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        result = {"ok": False, "format": None, "tolerance": args.tolerance,
                  "problems": [f"cannot read {args.export}: {e}"], "datasets": []}
    else:
        result = check_export(export, args.tolerance)
    try:
        print(json.dumps(result, indent=1, ensure_ascii=False) if args.json else text_report(result, args.export))
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into head
        sys.stdout = None
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
