"""Advanced composition of heterogeneous (eps_i, delta_i) releases.

Report: Kairouz, Oh, Viswanath 2015 (Thm. 3.5, heterogeneous form; the improvement of
Dwork, Rothblum, Vadhan 2010): for any delta' in (0, 1], the composition is
(eps_tot, delta' + sum delta_i)-DP with

    eps_tot = min( sum eps_i,
                   sum eps_i tanh(eps_i/2) + sqrt(2 sum eps_i^2 log(e + sqrt(sum eps_i^2) / delta')),
                   sum eps_i tanh(eps_i/2) + sqrt(2 sum eps_i^2 log(1 / delta')) )

(eps tanh(eps/2) = eps (e^eps - 1)/(e^eps + 1)). Reported at a target delta, delta' is
what the target leaves after sum delta_i.

Gate rule: the advanced-composition privacy filter of Whitehouse, Ramdas, Rogers, Wu
2023 ("Fully-adaptive composition in differential privacy", ICML): with
delta_g = delta' + delta'', halting before

    sqrt(2 log(1/delta') sum eps_i^2) + 1/2 sum eps_i^2 > eps_g   or   sum delta_i > delta''

gives (eps_g, delta_g)-DP under fully adaptive choice of the eps_i, delta_i. Here
delta' = delta'' = delta_g / 2. (It improves the constants of Rogers et al. 2016, Thm. 5.1.)
"""

from __future__ import annotations

import math
import sys

from .base import Spent, compose_events
from .costs import Cost

NAME = "advanced"
NEEDS_RELEASE_DELTAS = True  # per-release deltas of Gaussian events enter its totals
THEOREM = ("Advanced composition, heterogeneous (Kairouz-Oh-Viswanath 2015, Thm. 3.5); "
           "filter: Whitehouse-Ramdas-Rogers-Wu 2023")


def kov_epsilon(sum_eps: float, sum_sq: float, sum_tanh: float, delta_prime: float) -> float:
    if not delta_prime > 0:
        return sum_eps
    if sum_sq == 0:
        return sum_eps
    a = sum_tanh + math.sqrt(2 * sum_sq * math.log(math.e + math.sqrt(sum_sq) / delta_prime))
    b = sum_tanh + math.sqrt(2 * sum_sq * math.log(1 / delta_prime))
    return min(sum_eps, a, b)


def spent(cost: Cost, delta: float) -> Spent:
    delta_prime = delta - cost.delta
    if not delta_prime > 0 or not math.isfinite(cost.sq):
        return Spent(cost.eps, cost.delta)
    return Spent(kov_epsilon(cost.eps, cost.sq, cost.tanh, delta_prime), delta)


def filter_epsilon(cost: Cost, budget_delta: float, approx_share: float | None = None) -> float:
    """The epsilon the Whitehouse et al. filter charges, if the deltas fit in delta''
    (``approx_share`` is the RDP filter's and not used here)."""
    if cost.delta > budget_delta / 2:
        return math.inf
    if cost.sq == 0:
        return 0.0
    if not budget_delta > 0 or not math.isfinite(cost.sq):
        return math.inf
    return math.sqrt(2 * math.log(2 / budget_delta) * cost.sq) + cost.sq / 2


def gate_pool(cost: Cost, budget_delta: float) -> float:
    return budget_delta / 2 - cost.delta


def report_pool(delta: float) -> float:
    # Unstated Gaussian deltas take half the target; the other half is delta'.
    return delta / 2


def compose(events, delta: float) -> Spent:
    return compose_events(sys.modules[__name__], events, delta)
