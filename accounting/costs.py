"""The cost vector: what an event adds to a ledger, in the form every accountant reads.

A ledger's running state is the sum of its events' cost vectors. Each field is additive
over events (and subtractive when a reservation is refunded), so admission costs
O(orders), not O(history):

========  ====================================================================
eps        sum of per-release epsilon_i (basic composition)
delta      sum of per-release delta_i (basic; the delta'' pool of advanced)
sq         sum of epsilon_i^2                      (advanced composition)
tanh       sum of epsilon_i * tanh(epsilon_i / 2)  (= (e^e - 1) e / (e^e + 1), KOV)
approx     sum of delta of approximate-DP ``epsilon_delta`` events (RDP accountant)
rdp[...]   the RDP curve on ``ORDERS`` (one float per order, alpha = inf last)
========  ====================================================================

Infinities (a Gaussian at alpha = inf, a non-private release) are kept as a per-field
count beside the finite sum, so a refund subtracts exactly and never meets inf - inf.

Per-release (epsilon_i, delta_i) of Gaussian-type events is computed at the delta the
event states: the exact analytic Gaussian for ``gaussian`` (Balle-Wang 2018) and the RDP
conversion for ``subsampled_gaussian`` (one fixed mechanism, so no adaptivity is
involved inside it). ``self_composed`` of a Gaussian is the Gaussian with noise
multiplier z / sqrt(k) (exact: Gaussians compose to a Gaussian); of a subsampled
Gaussian, the same event with k times the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from . import events as ev
from .gaussian import gaussian_epsilon
from .rdp_math import (
    ORDERS,
    epsilon_from_curve,
    gaussian_curve,
    laplace_curve,
    pure_dp_curve,
    subsampled_gaussian_curve,
)

SCALARS = ("eps", "delta", "sq", "tanh", "approx")
N_FIELDS = len(SCALARS) + len(ORDERS)


class UnresolvedDelta(ev.EventError):
    """A Gaussian-type event without a delta where a per-release (eps, delta) is needed."""

    def __init__(self):
        super().__init__("a gaussian-type event needs a 'delta' to be charged under basic or "
                         "advanced composition", "event")


def _sum_up(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b rounded up, field by field: never below the exact sum. Rounded to nearest, a
    running state stops growing once an event is under half a unit in the last place of
    what is spent (0.9999999999999999 + 1e-16 is 1.0, and 1.0 + 1e-16 is 1.0 again): a
    full budget admitted tiny releases without end. Rounded up, every state is at least
    the exact sum of its events' costs (refunds too: a - c rounded up is at least a - c),
    so a filter that holds on it holds on the exact sum. The rounding error of each sum
    is exact in floating point (Knuth's TwoSum); where it is positive the sum is moved up
    one float."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return np.where(err > 0, np.nextafter(s, np.inf), s)


def _product_up(a: np.ndarray, k: int) -> np.ndarray:
    """a * k field by field, each the float nearest the exact product of the decimal it is
    written as (``repr``) and k, moved up one float where that is below it: 0.1 x 10 is 1.0
    (the exact product of the float 0.1 is 1 + 5.6e-17), 0.7 x 6 is 4.2 (to nearest
    4.199999999999999, under the six releases' 4.2). The decimals are what the gate sums
    exactly near a limit (``governance.ledger.limits``)."""
    out = a * float(k)
    for i in np.flatnonzero(np.isfinite(out) & (a != 0)):
        exact = Fraction(repr(float(a[i]))) * k
        y = float(exact)
        out[i] = math.nextafter(y, math.inf) if Fraction(y) < exact else y
    return out


@dataclass(frozen=True, eq=False)
class Cost:
    finite: np.ndarray
    infs: np.ndarray

    @classmethod
    def zero(cls) -> "Cost":
        return cls(np.zeros(N_FIELDS), np.zeros(N_FIELDS, dtype=np.int64))

    @classmethod
    def from_values(cls, values) -> "Cost":
        v = np.asarray(values, dtype=float)
        inf = np.isinf(v)
        return cls(np.where(inf, 0.0, v), inf.astype(np.int64))

    @staticmethod
    def _counted(finite: np.ndarray, infs: np.ndarray) -> "Cost":
        # A finite sum that overflows becomes a counted infinity: conservative (it never
        # comes back down by a refund) and never NaN.
        over = ~np.isfinite(finite)
        if over.any():
            finite, infs = np.where(over, 0.0, finite), infs + over
        return Cost(finite, infs)

    def __add__(self, other: "Cost") -> "Cost":
        with np.errstate(over="ignore", invalid="ignore"):
            return Cost._counted(_sum_up(self.finite, other.finite), self.infs + other.infs)

    def __sub__(self, other: "Cost") -> "Cost":
        with np.errstate(over="ignore", invalid="ignore"):
            return Cost._counted(_sum_up(self.finite, -other.finite), self.infs - other.infs)

    def times(self, k: int) -> "Cost":
        """k copies, each field never under what the k releases cost (``_product_up``)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return Cost._counted(_product_up(self.finite, k), self.infs * k)

    @property
    def values(self) -> np.ndarray:
        # Refunds may leave -1e-17 where 0 was meant: clamp at 0.
        return np.where(self.infs > 0, math.inf, np.maximum(self.finite, 0.0))

    def __getattr__(self, name):
        if name in SCALARS:
            return float(self.values[SCALARS.index(name)])
        raise AttributeError(name)

    @property
    def rdp(self) -> np.ndarray:
        return self.values[len(SCALARS):]

    def dominated_by(self, other: "Cost", rtol: float = 1e-9) -> bool:
        """True if every field of self is at most the same field of ``other``."""
        a, b = self.values, other.values
        return bool(np.all((a <= b) | np.isclose(a, b, rtol=rtol, atol=1e-15)))

    def to_json(self) -> dict:
        return {"finite": self.finite.tolist(), "infs": self.infs.tolist()}

    @classmethod
    def from_json(cls, data) -> "Cost":
        if not data:
            return cls.zero()
        return cls(np.asarray(data["finite"], dtype=float), np.asarray(data["infs"], dtype=np.int64))


def normalise(event: ev.Event) -> ev.Event:
    """Collapse self-composed Gaussians and subsampled Gaussians exactly; flatten nesting."""
    if isinstance(event, ev.SelfComposedEvent):
        inner = normalise(event.event)
        k = event.count
        if isinstance(inner, ev.GaussianEvent):
            return replace(inner, noise_multiplier=inner.noise_multiplier / math.sqrt(k))
        if isinstance(inner, ev.SubsampledGaussianEvent):
            return replace(inner, steps=inner.steps * k)
        if isinstance(inner, ev.NoOpEvent):
            return inner
        if isinstance(inner, ev.SelfComposedEvent):
            return ev.SelfComposedEvent(inner.event, inner.count * k)
        return ev.SelfComposedEvent(inner, k)
    if isinstance(event, ev.ComposedEvent):
        return ev.ComposedEvent(tuple(normalise(e) for e in event.events))
    return event


def _leaf(eps_i: float, delta_i: float, curve: np.ndarray, approx: float = 0.0) -> Cost:
    tanh = eps_i * math.tanh(eps_i / 2) if math.isfinite(eps_i) else math.inf
    sq = eps_i * eps_i
    return Cost.from_values(np.concatenate(([eps_i, delta_i, sq, tanh, approx], curve)))


def cost_of(event: ev.Event) -> Cost:
    """The cost vector of one event. Gaussian-type events must state their delta.

    Numbers the maths cannot handle (an overflow, a division by zero) are the event's
    fault: they raise ``EventError`` like any other malformed event.
    """
    try:
        return _cost(normalise(event))
    except ArithmeticError as e:
        raise ev.EventError(f"its numbers are outside the range the accountants can compute with ({e})") from e


def _cost(e: ev.Event) -> Cost:
    if isinstance(e, ev.LaplaceEvent):
        return _leaf(e.epsilon, 0.0, laplace_curve(e.epsilon))
    if isinstance(e, ev.GaussianEvent):
        if e.delta is None:
            raise UnresolvedDelta()
        return _leaf(gaussian_epsilon(e.noise_multiplier, e.delta), e.delta, gaussian_curve(e.noise_multiplier))
    if isinstance(e, ev.SubsampledGaussianEvent):
        if e.delta is None:
            raise UnresolvedDelta()
        curve = subsampled_gaussian_curve(e.sample_rate, e.noise_multiplier, e.steps)
        return _leaf(epsilon_from_curve(curve, e.delta) if e.delta > 0 else math.inf, e.delta, curve)
    if isinstance(e, ev.EpsilonDeltaEvent):
        return _leaf(e.epsilon, e.delta, pure_dp_curve(e.epsilon), approx=e.delta)
    if isinstance(e, ev.SelfComposedEvent):
        return _cost(e.event).times(e.count)
    if isinstance(e, ev.ComposedEvent):
        total = Cost.zero()
        for sub in e.events:
            total = total + _cost(sub)
        return total
    if isinstance(e, ev.NoOpEvent):
        return Cost.zero()
    if isinstance(e, ev.NonPrivateEvent):
        values = np.full(N_FIELDS, math.inf)
        values[SCALARS.index("delta")] = 0.0
        values[SCALARS.index("approx")] = 0.0
        return Cost.from_values(values)
    raise ev.EventError(f"no cost rule for {type(e).__name__}")


# ------------------------------------------------------------------ delta resolution


def unstated_weight(event: ev.Event) -> int:
    """How many per-release deltas the event's Gaussian-type leaves without a delta need."""
    return _weight(normalise(event))


def _weight(e: ev.Event) -> int:
    if isinstance(e, (ev.GaussianEvent, ev.SubsampledGaussianEvent)):
        return 1 if e.delta is None else 0
    if isinstance(e, ev.SelfComposedEvent):
        return e.count * _weight(e.event)
    if isinstance(e, ev.ComposedEvent):
        return sum(_weight(s) for s in e.events)
    return 0


def with_delta(event: ev.Event, delta: float) -> ev.Event:
    """The event with ``delta`` filled into every Gaussian-type leaf that states none."""
    if isinstance(event, (ev.GaussianEvent, ev.SubsampledGaussianEvent)):
        return event if event.delta is not None else replace(event, delta=delta)
    if isinstance(event, ev.SelfComposedEvent):
        return ev.SelfComposedEvent(with_delta(event.event, delta), event.count)
    if isinstance(event, ev.ComposedEvent):
        return ev.ComposedEvent(tuple(with_delta(e, delta) for e in event.events))
    return event


def stated_delta(event: ev.Event) -> float:
    """Sum of the deltas the event states itself (unstated leaves count as 0)."""
    return _cost_delta_only(normalise(event))


def _cost_delta_only(e: ev.Event) -> float:
    if isinstance(e, (ev.GaussianEvent, ev.SubsampledGaussianEvent, ev.EpsilonDeltaEvent)):
        return e.delta or 0.0
    if isinstance(e, ev.SelfComposedEvent):
        return e.count * _cost_delta_only(e.event)
    if isinstance(e, ev.ComposedEvent):
        return sum(_cost_delta_only(s) for s in e.events)
    return 0.0


def resolve(event: ev.Event, delta_pool: float) -> ev.Event:
    """Fill unstated Gaussian deltas so that together they use ``delta_pool``."""
    w = unstated_weight(event)
    if w == 0:
        return event
    if not delta_pool > 0:
        raise ev.EventError("no delta is left to charge a Gaussian-type event under (epsilon, delta) "
                            "composition; state a 'delta' or raise the budget's delta", "event")
    return with_delta(event, delta_pool / w)


# ------------------------------------------------------------------ the whole price


class NoDeltaLeft(ev.EventError):
    """Gaussian-type parts state no delta and none is left to give them."""

    def __init__(self):
        super().__init__("no delta is left to charge a Gaussian-type event under (epsilon, delta) "
                         "composition; state a 'delta' or raise the budget's delta", "event")


@dataclass(frozen=True, eq=False)
class Price:
    """What one event costs a ledger, computed from a single normalisation.

    ``event``: the event as given, with a per-release delta filled into every
    Gaussian-type part that stated none (what the ledger stores); ``cost``: its cost
    vector, non-private parts excepted (they are counted apart, see the ledger);
    ``stated_delta``: the deltas the event stated itself; ``unstated``: how many
    per-release deltas were filled in; ``non_private``: it has a non-private part.
    """

    event: ev.Event
    cost: Cost
    stated_delta: float
    unstated: int
    non_private: bool


def price(event: ev.Event, free_delta: float | None = None, *, floor: float = 0.0) -> Price:
    """The whole price of ``event``. Unstated per-release deltas share ``free_delta``
    minus the event's own stated deltas; if nothing is left they get ``floor`` (split
    likewise), and with ``floor`` 0 ``NoDeltaLeft`` is raised. Arithmetic the accountants
    cannot do raises ``EventError`` (as ``cost_of``)."""
    try:
        n = normalise(event)
        stated, weight = _cost_delta_only(n), _weight(n)
        resolved = event
        if weight:
            pool = -math.inf if free_delta is None else free_delta - stated
            if not pool > 0:
                if not floor > 0:
                    raise NoDeltaLeft()
                pool = floor
            resolved, n = with_delta(event, pool / weight), with_delta(n, pool / weight)
        non_private = ev.has_non_private(n)
        cost = _private_cost(n)
    except ArithmeticError as e:
        raise ev.EventError(f"its numbers are outside the range the accountants can compute with ({e})") from e
    return Price(resolved, cost, stated, weight, non_private)


def private_cost(event: ev.Event) -> Cost:
    """The cost of ``event`` without its ``non_private`` part: what the ledger stores for
    a release whose non-private part (a sweep's epsilon = inf baseline, where the officer
    allows one) is counted apart, never composed. ``cost_of`` of any other event."""
    try:
        return _private_cost(normalise(event))
    except ArithmeticError as e:
        raise ev.EventError(f"its numbers are outside the range the accountants can compute with ({e})") from e


def _private_cost(n: ev.Event) -> Cost:
    return _cost(normalise(ev.without_non_private(n)) if ev.has_non_private(n) else n)
