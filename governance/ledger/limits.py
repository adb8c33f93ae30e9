"""The limits a request is gated against, and how spending is reported.

``Limit`` is a budget (the dataset's, or an analyst's cap within it) read through the
dataset's policy: its accountant's privacy filter decides admission. ``charge_summary``
and ``budget_report`` state a cost under every accountant side by side; ``refusal``
builds the 409 an analyst sees, with the numbers that explain it. No database access.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from accounting import ACCOUNTANTS
from accounting.base import Spent
from accounting.costs import N_FIELDS, SCALARS, Cost
from accounting.rdp import APPROX_SHARE as RDP_APPROX_SHARE
from accounting.events import ComposedEvent, Event

from ..core.errors import BudgetExceeded
from ..models import Dataset, Grant


def num(x: float):
    """JSON-safe number: infinities become the strings "inf"/"-inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isfinite(x):
        return x
    return "inf" if x > 0 else "-inf"


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class Limit:
    """A budget to gate against: the dataset's, or an analyst's cap within it."""

    scope: str  # "dataset" or "grant"
    epsilon: float
    delta: float
    policy: str
    approx_share: float | None = None  # the dataset's share of delta for (eps, delta) events (RDP filter)

    @classmethod
    def of_dataset(cls, ds: Dataset) -> Limit:
        return cls("dataset", ds.budget_epsilon, ds.budget_delta, ds.policy, ds.approx_delta_share)

    @classmethod
    def of_grant(cls, grant: Grant, ds: Dataset) -> Limit | None:
        if grant.cap_epsilon is None and grant.cap_delta is None:
            return None
        eps = grant.cap_epsilon if grant.cap_epsilon is not None else ds.budget_epsilon
        delta = grant.cap_delta if grant.cap_delta is not None else ds.budget_delta
        return cls("grant", min(eps, ds.budget_epsilon), min(delta, ds.budget_delta), ds.policy, ds.approx_delta_share)

    @property
    def accountant(self):
        return ACCOUNTANTS[self.policy]

    def spent(self, state: Cost) -> float:
        """What the filter charges, as the gate judged the state (``clamped``)."""
        return self._filter(self.clamped(state))

    def _filter(self, state: Cost) -> float:
        return self.accountant.filter_epsilon(state, self.delta, self.approx_share)

    # The fields each filter compares with a limit as they are (a sum of the events' own
    # numbers), and that limit: basic's epsilon and delta, advanced's delta (half the
    # budget's), RDP's delta for approximate-DP events. Each must hold. RDP's curve at
    # alpha = infinity (the sum of pure epsilons) is one more, which suffices alone
    # (``_INF``: the filter's last order needs no delta). As floats (cheap, at every
    # admission) and as the exact decimals they are written as (near a limit only).
    def linear(self, exact: bool = False) -> list[tuple[int, float | Fraction]]:
        num = _decimal if exact else float
        eps, delta = num(self.epsilon), num(self.delta)
        if self.policy == "basic":
            return [(_EPS, eps), (_DELTA, delta)]
        if self.policy == "advanced":
            return [(_DELTA, delta / 2)]
        share = self.approx_share if self.approx_share is not None else RDP_APPROX_SHARE
        if exact:
            return [(_APPROX, _decimal(share) * delta)]
        # the float at or below the exact product: 0.1 x 1e-5 to nearest is 1.0000000000000002e-06,
        # and a state between the two was judged by the float filter, past the exact limit (a probe's)
        return [(_APPROX, _float_at_most(_decimal(share) * _decimal(self.delta)))]

    def _fields(self, exact: bool = False) -> list[tuple[int, float | Fraction]]:
        return self.linear(exact) + ([(_INF, _decimal(self.epsilon) if exact else float(self.epsilon))]
                                     if self.policy == "rdp" else [])

    def _near_fields(self, state: Cost) -> list[tuple[int, float]]:
        """The fields past their limit by no more than the roundings of the float state
        (rounded up at each sum: 1e-9 is 4.5 million of them), where only the exact sums
        decide. At or below a limit the float state decides: it is at least the exact sum
        of the entries' floats."""
        values = state.values
        return [(i, lim) for i, lim in self._fields() if lim < values[i] <= lim * (1 + NEAR)]

    def holds(self, state: Cost, exact: Callable[[list[int]], dict[int, Fraction | None]]) -> bool:
        """The filter on ``state`` (a running state with the new costs added), decided by
        the exact sums (``exact(fields)``: the entries' and the new costs', O(history))
        where the state lies just past a limit, by the float state elsewhere (O(1))."""
        return self.judge(state, exact)[0]

    def judge(self, state: Cost, exact: Callable[[list[int]], dict[int, Fraction | None]]) -> tuple[bool, Cost]:
        """(``holds``, the state to write if admitted): a field just past its limit whose
        exact sum is within it is written at the limit, so that the next admission reads
        the ledger only if it adds to that field; any other field as it is (never below
        its exact sum: RDP's pure-DP order past the budget while other orders certify)."""
        near = self._near_fields(state)
        if not near:
            return self._filter(state) <= self.epsilon, state
        sums = exact([i for i, _lim in self._fields()])
        within = {i for i, lim in self._fields(exact=True) if sums.get(i) is not None and sums[i] <= lim}
        out = Cost(state.finite.copy(), state.infs.copy())
        for i, lim in near:
            if i in within:
                out.finite[i] = lim
        return self.admits_exactly(state, sums), out

    def admits_exactly(self, state: Cost, sums: dict[int, Fraction | None]) -> bool:
        """The filter on ``state`` with its linear fields judged by ``sums``, the exact sums
        of the entries' numbers (None: an infinity among them), each number read as the
        decimal it is written as (0.1, not the float nearest it, which is 0.1 +
        5.6e-18): ten charges of 0.1 fill a budget of 1, and nothing more fits. The float
        state, rounded up at each sum, cannot tell: its ten 0.1s are 1.0000000000000007."""
        fields = self.linear(exact=True)
        if any(sums[i] is None or sums[i] > lim for i, lim in fields):
            return False
        rest = Cost(state.finite.copy(), state.infs.copy())
        for i, _lim in fields:  # judged above; the rest of the filter (advanced's, RDP's curve) as it is
            rest.finite[i], rest.infs[i] = 0.0, 0
        if self.policy == "rdp":
            if sums[_INF] is not None and sums[_INF] <= _decimal(self.epsilon):
                return True  # the pure-DP order alone keeps the filter within the budget
            rest.finite[_INF], rest.infs[_INF] = 0.0, 1  # judged: the other orders decide
        return self._filter(rest) <= self.epsilon

    def clamped(self, state: Cost) -> Cost:
        """``state`` with the fields just past their limit (``_near_fields``) at the limit,
        as the reports show it (a delta pool filled exactly, where the gate admitted, read
        "filter epsilon inf, nothing remains"). For the eyes only: the gate writes what
        ``judge`` says."""
        near = self._near_fields(state)
        if not near:
            return state
        out = Cost(state.finite.copy(), state.infs.copy())
        for i, lim in near:
            out.finite[i] = lim
        return out

    def pool(self, state: Cost) -> float:
        return max(0.0, self.accountant.gate_pool(state, self.delta))


_EPS, _DELTA, _APPROX = (SCALARS.index(name) for name in ("eps", "delta", "approx"))
_INF = N_FIELDS - 1  # the RDP curve at alpha = infinity (the last order)

#: how far (relative) past a limit a summed field may lie for the exact sums to decide
NEAR = 1e-9


def _decimal(x: float) -> Fraction:
    """The number as it is written (the shortest text that reads back as the float)."""
    return Fraction(repr(float(x))) if math.isfinite(x) else Fraction(10) ** 400


def _float_at_most(x: Fraction) -> float:
    """The largest float not above ``x``."""
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


def exact_sums(costs, fields, extra: tuple[tuple[Cost, int], ...] = ()) -> dict[int, Fraction | None]:
    """Per field index, the exact sum of the costs' numbers read as decimals (None where
    one is infinite); ``costs``: cost JSON dicts, ``extra``: (cost, times) beside them."""
    out: dict[int, Fraction | None] = dict.fromkeys(fields, Fraction(0))
    both = itertools.chain(((c["finite"], c["infs"], 1) for c in costs),  # streamed: a ledger may be large
                           ((c.finite.tolist(), c.infs.tolist(), k) for c, k in extra))
    for finite, infs, k in both:
        for i in fields:
            if infs[i] and k:
                out[i] = None
            elif out[i] is not None and finite[i]:
                out[i] += _decimal(finite[i]) * k
    return out


def charge_summary(cost: Cost, delta: float) -> dict:
    """epsilon/delta of a cost vector under each accountant, reported at ``delta`` (the
    grid's; ``refined`` adds rdp's figure off the grid where the event is at hand)."""
    return {name: acc.spent(cost, delta).as_dict() for name, acc in ACCOUNTANTS.items()}


def refined(cost: Cost, delta: float, event: Event) -> dict:
    """RDP's plain composition of ``event`` (whose cost vector is ``cost``) at ``delta``
    with the order refined off the stored grid (``accounting.rdp.refined``):
    ``refined_epsilon`` (never above the grid's ``epsilon``) and ``refined_order``. Any
    order is valid for a report of what was spent (the parameters are fixed by then);
    the gate keeps the grid filter, whose orders must be fixed before the requests are
    (Feldman-Zrnic 2021; a filter order chosen from the transcript would void the union
    bound). Costs O(distinct mechanisms): computed where a report is shown, never at
    admission."""
    grid = ACCOUNTANTS["rdp"].spent(cost, delta)
    # one release's event is cached (a list of requests shows the same DP-SGD events again
    # and again, 3 ms each); a whole ledger's is not (large, and new at every admission)
    small = not isinstance(event, ComposedEvent) or len(event.events) <= 16
    try:
        best = (_refined if small else ACCOUNTANTS["rdp"].refined)(grid, event, delta)
    except ArithmeticError:  # the grid's figure stands (it is valid)
        best = grid
    return {"refined_epsilon": num(best.epsilon), "refined_order": num(best.order)}


@functools.lru_cache(maxsize=512)
def _refined(grid: Spent, event: Event, delta: float) -> Spent:
    return ACCOUNTANTS["rdp"].refined(grid, event, delta)


def budget_report(state: Cost, limit: Limit, event: Event | None = None) -> dict:
    """Spent and remaining under each accountant; ``gates`` marks the policy's filter.
    ``filter_price_epsilon`` is what the filter charges above plain composition of the same
    events (its validity under adaptive choice: the union bound over orders, the delta set
    aside for approximate-DP events). With ``event``, the composition of the entries
    ``state`` sums, ``rdp`` also reports the refined plain composition (``refined``) and
    ``refined_filter_price_epsilon``, the filter's price above it."""
    out = {}
    state = limit.clamped(state)  # as the gate judged it (just past a limit: the exact sums)
    for name, acc in ACCOUNTANTS.items():
        filt = acc.filter_epsilon(state, limit.delta, limit.approx_share)
        plain = acc.spent(state, limit.delta)
        price = filt - plain.epsilon if math.isfinite(filt) and math.isfinite(plain.epsilon) else None
        out[name] = {
            **plain.as_dict(),
            "filter_epsilon": num(filt),
            "filter_price_epsilon": num(max(0.0, price)) if price is not None else None,
            "remaining_epsilon": num(max(0.0, limit.epsilon - filt)),
            "gates": name == limit.policy,
        }
    if event is not None:
        r = out["rdp"]
        r.update(refined(state, limit.delta, event))
        tight = r["refined_epsilon"]
        ok = r["filter_price_epsilon"] is not None and isinstance(tight, float)
        r["refined_filter_price_epsilon"] = num(max(0.0, float(r["filter_epsilon"]) - tight)) if ok else None
    return out


def refusal(limit: Limit, before: Cost, after: Cost, event_cost: Cost) -> BudgetExceeded:
    spent = limit.spent(before)
    total = limit.spent(after)
    delta_used = after.approx if limit.policy == "rdp" else after.delta
    reason = "epsilon" if math.isfinite(total) or not math.isfinite(event_cost.eps) else "delta"
    what = "dataset budget" if limit.scope == "dataset" else "analyst's cap"
    if math.isfinite(total) and fmt(total) == fmt(limit.epsilon):
        # decided at the last digits (the exact sums, near the limit): "to 1 (limit 1)" said nothing
        to = f"past its limit of epsilon {limit.epsilon!r} (to {total!r}; near the limit the exact sum decides)"
    else:
        to = f"to epsilon {fmt(total)} (limit {limit.epsilon:g})"
    return BudgetExceeded(
        f"Refused: this request would take the {what} {to} under the {limit.policy} filter; "
        f"{fmt(max(0.0, limit.epsilon - spent))} remains.",
        scope=limit.scope,
        policy=limit.policy,
        reason=reason,
        budget={"epsilon": limit.epsilon, "delta": limit.delta},
        spent_epsilon=num(spent),
        remaining_epsilon=num(max(0.0, limit.epsilon - spent)),
        would_cost_epsilon=num(total - spent if math.isfinite(total) else math.inf),
        would_total_epsilon=num(total),
        delta_in_use=num(delta_used),
        request_charge=charge_summary(event_cost, limit.delta),
    )


def fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "infinity"
