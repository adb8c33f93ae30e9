"""The limits a request is gated against, and how spending is reported.

``Limit`` is a budget (the dataset's, or an analyst's cap within it) read through the
dataset's policy: its accountant's privacy filter decides admission. ``charge_summary``
and ``budget_report`` state a cost under every accountant side by side; ``refusal``
builds the 409 an analyst sees, with the numbers that explain it. No database access.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from accounting import ACCOUNTANTS
from accounting.base import Spent
from accounting.costs import Cost
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
        return self.accountant.filter_epsilon(state, self.delta, self.approx_share)

    def admits(self, state: Cost) -> bool:
        return self.spent(state) <= self.epsilon

    def pool(self, state: Cost) -> float:
        return max(0.0, self.accountant.gate_pool(state, self.delta))


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
    return BudgetExceeded(
        f"Refused: this request would take the {what} to epsilon {fmt(total)} "
        f"(limit {limit.epsilon:g}) under the {limit.policy} filter; "
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
