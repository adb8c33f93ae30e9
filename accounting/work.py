"""Work units: what composing events will cost in CPU, counted before it is spent.

Nearly all the CPU of a composition goes into the Poisson-subsampled Gaussian's RDP at
each order, Opacus's pure-Python series (``opacus.accountants.analysis.rdp``): at an
integer order alpha it sums alpha + 1 terms, at a fractional order it runs a signed
series until both of its terms fall below e^-30, which takes from a handful of terms to
thousands (q near 0.4 with z near 0.6: about 7 ms an order, against 20 us for
q = 0.001, z = 1). Every other mechanism is a closed form over the orders.

A unit here is one term of that series (the fractional series' term, which evaluates
two log-erfc's, is about two integer terms: ``FRAC_TERM``), plus ``PER_ORDER`` for
the call around each order. ``series_units`` counts them for one (q, z) at given orders
*without* running the series: the fractional series' stopping rule is evaluated on
chunks of terms at once with numpy (the same formulas, vectorised), so counting costs
about a seventh of computing the first time and nothing after (counts are cached per
(q, z, order)). The count equalled the loop's on every case tried (400 random ones and
the hypothesis test); it is a price, not a result, and never enters an accountant's
numbers. Measured: 1.7 to 2.3 us of CPU per unit over 24 (q, z) from cheap to dearest,
grid and refinement together (so ``MAX_UNITS`` is 1.0 to 1.4 s).

``limit(units)`` opens a budget for one call (a context variable, so the web thread's
budget is its own); ``charge(units)`` spends from it and raises ``TooCostly`` before
the work is done once the budget would be exceeded. Without an open budget ``charge``
does nothing: the gate, the workers and the ledger's reports are not limited here.
``MAX_UNITS`` is about one CPU second of this series on the reference machine (2 cores,
bench/bench_compose.py), so an endpoint that opens ``limit()`` answers any input in about
a second of accounting or refuses it (400, ``request.too_costly``) before spending it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

import numpy as np

from . import events as ev
from .rdp_math import _FRACTIONAL_MAX_RATE, _LRU, FINITE_ORDERS, integer_neighbours

# One integer-order series term is the unit (about 2 us with the loop around it); a
# fractional-order term costs about FRAC_TERM of them; each order's call PER_ORDER.
FRAC_TERM = 2
PER_ORDER = 10
# About one CPU second of Opacus's series on the reference machine (bench_compose.py).
MAX_UNITS = 600_000
# The refinement off the grid (accounting.refine) evaluates the curve at 1 + 2 x 33
# orders; each zoom is counted when its orders are known.

_CHUNK = 32  # most series stop within 5 to 30 terms; the chunk doubles up to 65,536
_COUNTS = _LRU(65_536)
_NEVER = 10**8  # terms: a series this long (minutes) is priced at least this, uncapped or not


class TooCostly(Exception):
    """The events would take more than the call's budget of work units to compose. Not
    an ``EventError``: the events are valid, only too many at once."""

    code = "request.too_costly"

    def __init__(self, needed: int, limit: int):
        self.message = (
            f"composing these events needs more than {limit:,} work units (about one CPU "
            f"second); counted before computing: {needed:,}. Nearly all of it is one RDP curve "
            f"per distinct (sample_rate, noise_multiplier) of subsampled_gaussian events "
            f"(about 15,000 to 750,000 units each; equal pairs are computed once whatever "
            f"their steps): send fewer distinct pairs per call")
        super().__init__(self.message)
        self.needed = needed
        self.limit = limit


@dataclass
class Meter:
    limit: int
    used: int = 0

    def charge(self, units: int) -> None:
        if self.used + units > self.limit:
            raise TooCostly(self.used + units, self.limit)
        self.used += units


_meter: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("accounting_work_meter", default=None)


@contextlib.contextmanager
def limit(units: int | None = None):
    """A budget of ``units`` (default ``MAX_UNITS``) for the work done inside; yields the
    ``Meter`` (``used`` says what was counted)."""
    meter = Meter(MAX_UNITS if units is None else units)
    token = _meter.set(meter)
    try:
        yield meter
    finally:
        _meter.reset(token)


def active() -> Meter | None:
    return _meter.get()


def charge(units: int) -> None:
    meter = _meter.get()
    if meter is not None:
        meter.charge(units)


def remaining() -> int | None:
    meter = _meter.get()
    return None if meter is None else meter.limit - meter.used


# ----------------------------------------------------------------------------- counting


def series_units(q: float, z: float, orders, cap: int | None = None) -> int:
    """Work units of one step of the subsampled Gaussian (0 < q < 1) at ``orders``, as
    ``rdp_math.subsampled_at`` computes it; stops counting once past ``cap``."""
    total = 0
    neighbours: set[int] = set()
    for a in orders:
        a = float(a)
        if not math.isfinite(a):
            continue
        if a.is_integer():
            total += PER_ORDER + int(a) - 1  # rdp_math._log_a_int: the terms k = 2 .. a
        elif q < _FRACTIONAL_MAX_RATE:
            left = None if cap is None else max(cap - total, 0) // FRAC_TERM + 1
            total += PER_ORDER + FRAC_TERM * _frac_terms(q, z, a, left)
            if a > 1:  # the integer orders it is held to, once per call
                for n in integer_neighbours(a) - neighbours:
                    neighbours.add(n)
                    total += PER_ORDER + n - 1
        else:
            total += PER_ORDER  # fractional orders above the rate use the plain bound
        if cap is not None and total > cap:
            return total
    return total


def _frac_terms(q: float, sigma: float, alpha: float, cap: int | None) -> int:
    """How many terms Opacus's ``_compute_log_a_for_frac_alpha`` sums (its stopping rule,
    vectorised over the terms); at most ``cap`` (+ a chunk) are looked at. A complete
    count is cached per (q, sigma, alpha): it is a function of the three numbers."""
    key = (q, sigma, alpha)
    n = _COUNTS.get(key)
    if n is None:
        n = _count_frac_terms(q, sigma, alpha, cap)
        if cap is None or n <= cap:
            _COUNTS.put(key, n)
    return n


def _count_frac_terms(q: float, sigma: float, alpha: float, cap: int | None) -> int:
    from scipy import special

    with np.errstate(all="ignore"):
        try:
            s2 = sigma ** 2
            z0 = s2 * math.log(1 / q - 1) + 0.5
            lq, l1q = math.log(q), math.log(1 - q)
            r2s = math.sqrt(2) * sigma
        except (ArithmeticError, ValueError):
            return 1  # Opacus fails at once on these numbers (subsampled_at catches it)
        start, size = 0, _CHUNK
        while True:
            i = np.arange(start, start + size, dtype=float)
            coef = special.binom(alpha, i)
            log_coef = np.log(np.abs(coef))
            j = alpha - i
            log_t0 = log_coef + i * lq + j * l1q
            log_t1 = log_coef + j * lq + i * l1q
            log_e0 = math.log(0.5) + math.log(2) + special.log_ndtr(-(i - z0) / r2s * 2 ** 0.5)
            log_e1 = math.log(0.5) + math.log(2) + special.log_ndtr(-(z0 - j) / r2s * 2 ** 0.5)
            log_s0 = log_t0 + (i * i - i) / (2 * s2) + log_e0
            log_s1 = log_t1 + (j * j - j) / (2 * s2) + log_e1
            # NaN compares False: Opacus's loop goes on (or fails) there too
            stop = np.flatnonzero(np.maximum(log_s0, log_s1) < -30)
            if stop.size:
                return int(start + stop[0] + 1)
            zero = np.flatnonzero(coef == 0)
            if zero.size:  # binom underflowed to 0: math.log(0) raises inside Opacus here
                return int(start + zero[0] + 1)
            start += size
            size = min(size * 2, 1 << 16)
            if start > (cap if cap is not None else _NEVER):
                return start


def subsampled_pairs(event: ev.Event) -> list[tuple[float, float]]:
    """The distinct (q, z) of subsampled Gaussian parts with 0 < q < 1 (the only ones
    whose curve runs the series), in order of appearance. O(size of the event tree)."""
    seen: dict = {}
    stack = [event]
    while stack:
        e = stack.pop()
        if isinstance(e, ev.ComposedEvent):
            stack.extend(reversed(e.events))
        elif isinstance(e, ev.SelfComposedEvent):
            stack.append(e.event)
        elif isinstance(e, ev.SubsampledGaussianEvent) and e.sample_rate < 1.0:
            seen.setdefault((float(e.sample_rate), float(e.noise_multiplier)), None)
    return list(seen)


def grid_units(events, cap: int | None = None) -> int:
    """Units of the grid curves (``rdp_math.ORDERS``) of ``events``: one curve per
    distinct (q, z), however many events share it (the curve is cached per (q, z) and
    multiplied by the steps). Stops counting once past ``cap``."""
    total = 0
    event = events if isinstance(events, ev.Event) else ev.ComposedEvent(tuple(events))
    for q, z in subsampled_pairs(event):
        left = None if cap is None else cap - total
        total += series_units(q, z, FINITE_ORDERS, left)
        if cap is not None and total > cap:
            break
    return total


def charge_grid(events) -> None:
    """Charge the grid curves of ``events`` to the open budget (if any), before computing."""
    left = remaining()
    if left is None:
        return
    charge(grid_units(events, cap=left))


def charge_orders(event: ev.Event, orders) -> None:
    """Charge evaluating ``event``'s curve at ``orders`` (a refinement's zoom)."""
    meter = _meter.get()
    if meter is None:
        return
    for q, z in subsampled_pairs(event):
        meter.charge(series_units(q, z, orders, meter.limit - meter.used))
