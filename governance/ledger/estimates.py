"""What events would cost against a dataset's budget now, and how many more would fit.

The read-only side of the gate (``POST /api/datasets/{name}/estimate/``, the officer's
estimate form): the same planning as ``ledger.admit`` on the budget and grant as they
stand, without locking or writing anything.
"""

from __future__ import annotations

import contextlib

from accounting import events as ev
from accounting import work
from accounting.costs import Cost, cost_of

from ..core.errors import TooCostly
from ..models import Budget, Dataset, Grant
from . import actions as ledger
from .limits import budget_report, charge_summary


@contextlib.contextmanager
def bounded_work(units: int | None = None):
    """A budget of work units (``accounting.work``, default ``MAX_UNITS``: about one CPU
    second) for the accounting done inside, for endpoints whose cost grows with their
    input; past it, a 400 ``request.too_costly`` before the work is done."""
    try:
        with work.limit(units) as meter:
            yield meter
    except work.TooCostly as e:
        raise TooCostly(e.message, work_units=e.needed, max_work_units=e.limit) from None


def estimate(dataset: Dataset, user, events) -> dict:
    """What ``events`` would cost, whether they would be admitted now, and how many fit.

    Reads the budget without locking or writing: the answer can be stale by the time a
    request is sent, the gate is what decides. Bounded: events whose curves would take
    more than about a CPU second are refused (``bounded_work``) before any is computed.
    """
    with ledger.event_errors():
        parsed = ev.parse_events(events)
    with bounded_work():
        work.charge_grid(parsed)
        return _estimate(dataset, user, parsed)


def _estimate(dataset: Dataset, user, parsed) -> dict:
    budget = Budget.objects.get(pk=dataset.pk)
    grant = None
    if user is not None:
        grant = Grant.objects.filter(dataset=dataset, analyst=user, revoked_at__isnull=True).first()
    items = []
    total = Cost.zero()
    limits = None
    refused = False
    for event in parsed:
        stamped, cost, limits = ledger._plan(event, dataset, budget, grant, refuse_non_private=False)
        if ev.has_non_private(stamped) and not dataset.allow_non_private:
            refused = True  # the gate would refuse it whatever the budget: its whole cost (inf) shown
            with ledger.event_errors():
                cost = cost_of(stamped)
        total = total + cost
        items.append({"event": stamped.to_dict(), "charge": charge_summary(cost, dataset.budget_delta)})
    sums = {limit.scope: ledger.EntrySums(dataset.pk, grant and grant.pk, limit) for limit, _state in limits or ()}
    admitted = not refused and (all(limit.holds(state + total, sums[limit.scope].plus((total, 1)))
                                    for limit, state in limits) if limits else True)
    if dataset.status != Dataset.Status.ACTIVE or (grant is None and not getattr(user, "is_staff", False)):
        admitted = False  # the gate refuses every request on a draft, and analysts without a grant
    return {
        "events": items,
        "total": charge_summary(total, dataset.budget_delta),
        "would_admit": admitted,
        "has_grant": grant is not None,
        "fits": _how_many_fit(total, limits, sums) if limits else None,
        "budget": {lim.scope: budget_report(state, lim) for lim, state in limits} if limits else {},
    }


def _how_many_fit(cost: Cost, limits, sums, cap: int = 10**7) -> int | None:
    """Largest k such that k more copies (each charged like this one) pass every filter."""
    def ok(k):
        return all(limit.holds(state + cost.times(k), sums[limit.scope].plus((cost, k))) for limit, state in limits)

    if not ok(1):
        return 0
    if ok(cap):
        return None  # effectively unlimited (e.g. a no-op)
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
