"""Rényi differential privacy over a fixed grid of orders.

Report: RDP curves add under composition (Mironov 2017, Prop. 1); the composed curve is
turned into (epsilon, delta) by the conversion of Balle et al. 2020, Thm. 21 (as in
Opacus), minimised over the grid ``ORDERS`` (1.001 ... 4096 and infinity). Where basic
composition of the same events is tighter (a single Laplace release, one Gaussian
charged with the exact analytic Gaussian) the minimum of the two is reported.

Approximate-DP ``epsilon_delta`` events (delta > 0) enter as delta-approximate RDP
(Bun-Steinke 2016, approximate zCDP): their pure part adds the randomised-response curve
of their epsilon and their deltas add to the total delta.

Gate rule: an RDP privacy filter over the fixed grid (Feldman-Zrnic 2021, Thm. 3.1, one
filter per order; Lécuyer 2021). A request is admitted if at least one order alpha
keeps sum rho_i(alpha) <= eps_g - c(alpha, delta_alpha), c being the conversion term.
At the end the first order still within budget (a function of the transcript) certifies
the output, so the failure probabilities of the orders add: the finite orders share
(1 - APPROX_SHARE) * delta_g equally (delta_alpha = that / #orders), alpha = inf needs
none (it is the pure-DP filter), and approximate-DP events may use at most
APPROX_SHARE * delta_g in total (their deltas are failure probabilities of their own,
added to the orders' by the union bound; Bun-Steinke 2016, delta-approximate zCDP).
APPROX_SHARE is a per-dataset setting (``Dataset.approx_delta_share``); 0.1 is the
default: a larger share admits more (epsilon, delta) releases and makes every other
request dearer (each order gets less delta, so c(alpha, delta_alpha) grows by
log((1 - s) / (1 - s')) / (alpha - 1)).

Why the gate stays on the grid while reports refine the order (``refined``): the filter
is a union bound over a set of orders fixed before any request is seen; each order's
filter stays valid whatever the analysts do. An order chosen after the fact, at the
minimum for the transcript so far, would make the set of orders (and the union bound)
a function of the answers, and would need a delta for every order it could pick. A
report of what was spent may pick any order (Mironov 2017, Prop. 3: every alpha gives a
valid conversion of a fixed composition).

The report (``spent``, ``compose``) is plain composition: the parameters taken as fixed,
all of the target delta used by one conversion at the best order, no union bound. The
difference ``filter_epsilon - spent`` is what the filter's validity under adaptivity costs
(``filter_price``), shown per dataset beside both.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from . import events as ev
from .base import Spent, compose_events
from .costs import Cost
from .rdp_math import FINITE_ORDERS, ORDERS, conversion_terms
from .refine import curve_at, refine

NAME = "rdp"
NEEDS_RELEASE_DELTAS = False  # its curve does not depend on per-release deltas
THEOREM = ("Rényi DP (Mironov 2017) with the conversion of Balle et al. 2020, Thm. 21; "
           "filter: Feldman-Zrnic 2021 over a fixed grid, delta split across orders")
APPROX_SHARE = 0.1  # default per-dataset share of delta_g for approximate-DP events


def spent(cost: Cost, delta: float) -> Spent:
    rdp = cost.rdp
    rest = delta - cost.approx
    if rest > 0:
        eps_all = rdp + conversion_terms(rest)
    else:  # only alpha = inf (pure DP) is usable
        eps_all = np.full(len(ORDERS), math.inf)
        eps_all[-1] = rdp[-1]
    eps_all = np.where(np.isnan(eps_all), math.inf, eps_all)
    i = int(np.argmin(eps_all))
    best = Spent(max(0.0, float(eps_all[i])), delta if rest > 0 else cost.approx, float(ORDERS[i]))
    if cost.delta <= delta and cost.eps < best.epsilon:
        return Spent(cost.eps, delta, None)
    return best


def order_deltas(budget_delta: float, approx_share: float | None = None) -> float:
    share = APPROX_SHARE if approx_share is None else approx_share
    return (1 - share) * budget_delta / len(FINITE_ORDERS)


def filter_epsilon(cost: Cost, budget_delta: float, approx_share: float | None = None) -> float:
    """The smallest eps_g for which the RDP filter would still admit this state, with
    ``approx_share`` (default ``APPROX_SHARE``) of ``budget_delta`` set aside for
    approximate-DP events."""
    share = APPROX_SHARE if approx_share is None else approx_share
    if cost.approx > share * budget_delta:
        return math.inf
    rdp = cost.rdp
    per_order = order_deltas(budget_delta, share)
    if per_order > 0:
        eps_all = rdp + conversion_terms(per_order)
    else:
        eps_all = np.full(len(ORDERS), math.inf)
        eps_all[-1] = rdp[-1]
    eps_all = np.where(np.isnan(eps_all), math.inf, eps_all)
    return max(0.0, float(np.min(eps_all)))


def gate_pool(cost: Cost, budget_delta: float) -> float:
    # Only used to state per-release deltas for the basic and advanced columns of the
    # report; half the budget's delta (advanced composition's delta'' pool) keeps both finite.
    return budget_delta / 2 - cost.delta


def report_pool(delta: float) -> float:
    return delta


def compose(events, delta: float) -> Spent:
    """Plain composition of a fixed list of events: the grid's minimum, then the order
    refined off the grid (``accounting.refine``; valid for a fixed composition, not as a
    filter)."""
    events = list(events)
    best = compose_events(sys.modules[__name__], events, delta)
    return refined(best, ev.compose(events), delta) if events else best


def refined(best: Spent, event: ev.Event, delta: float) -> Spent:
    """``best`` (this accountant's ``spent`` of ``event``'s cost at ``delta``: the grid's
    minimum) with the order refined off the grid for the composition ``event`` (the
    ledger's reports: the committed and reserved events of a budget, one entry's event).
    Never above ``best``. O(distinct mechanisms in ``event``): see ``refine.collapse``."""
    if best.order is None or not math.isfinite(best.order) or not math.isfinite(best.epsilon):
        return best
    event = ev.without_non_private(event)
    _curve, approx = curve_at(event, np.array([best.order]))
    if not delta - approx > 0:
        return best
    eps, order = refine(event, delta - approx, best.order)
    return Spent(eps, delta, order) if eps < best.epsilon else best
