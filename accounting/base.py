"""What every accountant returns, and the helper that composes a plain list of events."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import events as ev
from .costs import Cost, cost_of, resolve, stated_delta

# The per-release delta stated on Gaussian events for accountants that do not use it.
REPORT_ONLY_DELTA = 1e-300


@dataclass(frozen=True)
class Spent:
    """epsilon and delta of a composition; ``order`` is the RDP order that attained it."""

    epsilon: float
    delta: float
    order: float | None = None

    def as_dict(self) -> dict:
        d = {"epsilon": _json_float(self.epsilon), "delta": self.delta}
        if self.order is not None:
            d["order"] = _json_float(self.order)
        return d


def _json_float(x: float):
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def compose_events(accountant, events, delta: float) -> Spent:
    """Compose a list of events under ``accountant`` for a target total delta.

    Gaussian-type events that state no delta share the accountant's delta pool equally.
    """
    if not 0 <= delta < 1 or math.isnan(delta):
        raise ev.EventError(f"delta must be in [0, 1), got {delta}", "delta")
    events = list(events)
    if not events:
        return accountant.spent(Cost.zero(), delta)
    event = ev.compose(events)
    stated = stated_delta(event)
    if stated >= 1:  # (epsilon, 1)-DP holds of any mechanism: no number here would mean anything
        raise ev.EventError(f"the events' own deltas add up to {stated:.6g}: at or above 1, a composition "
                            f"that guarantees nothing", "events")
    pool = accountant.report_pool(delta) - stated
    if not pool > 0 and not accountant.NEEDS_RELEASE_DELTAS:
        pool = REPORT_ONLY_DELTA  # only the (unused) basic fields of the cost depend on it
    return accountant.spent(cost_of(resolve(event, pool)), delta)
