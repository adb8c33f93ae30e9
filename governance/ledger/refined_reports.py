"""Refined RDP figures in reports: the events behind a budget, composed off the grid.

The ledger keeps each budget's RDP curve on the fixed grid of orders (what the gate's
filter needs, O(orders) per admission). A report of what was spent may use any order
(``limits.refined``), but that needs the events: this module reads them from the ledger
(an entry's own, or every committed and reserved entry of a dataset) and adds
``refined_epsilon``/``refined_order`` to the ``rdp`` figures. Reading is O(entries),
refining O(distinct mechanisms) (``accounting.refine.collapse``): about 60 ms for 2,000
aggregate releases. So it runs where a report is shown (a dataset's detail, a request's
or ledger entry's charge, the officer's overview), never at admission.
"""

from __future__ import annotations

from django.db.models import Count

from accounting import events as ev
from accounting.costs import Cost, cost_of

from ..models import Dataset, Grant, LedgerEntry
from .limits import Limit, budget_report, charge_summary, refined


def entry_event(entry: LedgerEntry) -> ev.Event:
    """What ``entry`` charges: its committed event if it committed less, else its event."""
    return ev.parse_event(entry.committed_event or entry.event)


def active_event(dataset: Dataset | int, grant: Grant | None = None) -> ev.Event:
    """The composition of a dataset's committed and reserved entries (a grant's: charged
    to that analyst's share): the events its budget (grant) row's ``state`` sums."""
    pk = dataset.pk if isinstance(dataset, Dataset) else dataset
    rows = LedgerEntry.objects.filter(dataset_id=pk).exclude(status=LedgerEntry.Status.RELEASED)
    if grant is not None:
        rows = rows.filter(grant=grant)
    # equal events read once, counted (a ledger of many equal releases: 100,000 entries of
    # three kinds were 1.0 s of the overview page to read and walk one by one)
    rows = rows.values("event", "committed_event").annotate(n=Count("id")).values_list("event", "committed_event", "n")
    return ev.compose([_times(ev.parse_event(committed or event), n)
                       for event, committed, n in rows.order_by().iterator(chunk_size=2000)])


def _times(event: ev.Event, n: int) -> ev.Event:
    return event if n == 1 else ev.SelfComposedEvent(event, n)


def entry_charge(entry: LedgerEntry, delta: float, *, refine: bool = True) -> dict:
    """An entry's charge: the committed cost's at ``delta`` if it committed less, else the
    stored one, with ``rdp``'s refined figures at the same delta (unless ``refine`` is
    false: the answer to a POST, on the admission path)."""
    committed = entry.committed_cost
    base = charge_summary(Cost.from_json(committed), delta) if committed else dict(entry.charge)
    if not refine:
        return base
    cost = Cost.from_json(committed or entry.cost)
    try:
        event = entry_event(entry)
    except ev.EventError:  # a stored event always parses; if not, the stored figures stand
        return base
    at = base["rdp"].get("delta", delta)  # the stored charge's delta (the budget's when it was reserved)
    return {**base, "rdp": {**base["rdp"], **refined(cost, at, event)}}


def event_refined(event: dict, delta: float) -> dict:
    """``refined_epsilon``/``refined_order`` of one committed event (JSON, as the ledger
    stamped it) at ``delta``, its non-private parts not charged (an audit record's
    release)."""
    parsed = ev.without_non_private(ev.parse_event(event))
    return refined(cost_of(parsed), delta, parsed)


def dataset_report(dataset: Dataset) -> dict:
    """``budget_report`` of the dataset's whole budget with ``rdp``'s refined figures."""
    return budget_report(Cost.from_json(dataset.budget.state), Limit.of_dataset(dataset), active_event(dataset))
