"""Accountants: pure functions from mechanism events to epsilon. No Django here.

``ACCOUNTANTS`` maps a policy name to its module. Each module has

- ``spent(cost, delta) -> Spent``: the composition of a ledger's cost vector, reported at
  a target delta (parameters taken as fixed; the number users compare with others);
- ``filter_epsilon(cost, budget_delta, approx_share=None) -> float``: the epsilon its
  *privacy filter* charges, valid when each request is chosen after seeing earlier
  answers; the gate admits a request only if this stays within the budget's epsilon
  (``approx_share``: the dataset's share of delta for approximate-DP events, used by
  the RDP filter only);
- ``gate_pool(cost, budget_delta)``: delta still free for per-release deltas;
- ``compose(events, delta) -> Spent``: the same for a plain list of events;
- ``NAME`` and ``THEOREM``.
"""

from . import advanced, basic, rdp
from .base import Spent
from .costs import Cost, cost_of
from .events import EventError, parse_event, parse_events

ACCOUNTANTS = {"basic": basic, "advanced": advanced, "rdp": rdp}
POLICIES = tuple(ACCOUNTANTS)
DEFAULT_POLICY = "rdp"

__all__ = ["ACCOUNTANTS", "POLICIES", "DEFAULT_POLICY", "Cost", "cost_of", "Spent",
           "EventError", "parse_event", "parse_events", "basic", "advanced", "rdp"]
