"""Basic composition: epsilons add, deltas add (Dwork-Roth 2014, Thm. 3.16).

Gate rule: the basic-composition privacy filter -- halt before sum eps_i > eps_g or sum
delta_i > delta_g -- is valid when parameters are chosen adaptively (Rogers, Roth,
Ullman, Vadhan 2016, Thm. 3.6 / Whitehouse et al. 2023).

Gaussian-type events are charged at the delta they state: the exact analytic Gaussian
epsilon (Balle-Wang 2018) for ``gaussian``; the RDP conversion for one
``subsampled_gaussian`` run. The ledger states a delta on each such event when it is
admitted (half of the delta still free, split over the event's unstated parts); a list
composed outside the ledger shares the target delta equally among them.
"""

from __future__ import annotations

import math
import sys

from .base import Spent, compose_events
from .costs import Cost

NAME = "basic"
NEEDS_RELEASE_DELTAS = True  # per-release deltas of Gaussian events enter its totals
THEOREM = "Basic composition (Dwork-Roth 2014, Thm. 3.16); filter: Rogers et al. 2016, Thm. 3.6"


def spent(cost: Cost, delta: float) -> Spent:
    return Spent(cost.eps, cost.delta)


def filter_epsilon(cost: Cost, budget_delta: float, approx_share: float | None = None) -> float:
    """The epsilon the basic filter charges: sum of epsilons, if the deltas fit (every
    delta is charged as it is; ``approx_share`` is the RDP filter's and not used here)."""
    if cost.delta > budget_delta:
        return math.inf
    return cost.eps


def gate_pool(cost: Cost, budget_delta: float) -> float:
    """Delta still free for per-release deltas under this filter."""
    return budget_delta - cost.delta


def report_pool(delta: float) -> float:
    return delta


def compose(events, delta: float) -> Spent:
    return compose_events(sys.modules[__name__], events, delta)
