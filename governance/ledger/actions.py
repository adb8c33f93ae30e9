"""The gate and every ledger write: admit, commit, release, charge.

Each action runs in one transaction holding a row lock on the dataset's budget row
(``select_for_update``; on SQLite the transaction itself takes the write lock, see
settings), then on the analyst's grant, always in that order. The budget row carries the
running cost vector of all reserved and committed entries, so admission costs O(orders).

Rules:
- ``admit``: the policy's privacy filter must hold for the dataset budget *and* for the
  analyst's grant cap with the new event added; the entry is written ``reserved`` and
  the running totals updated in the same transaction. Gaussian-type events that state no
  delta are given one (half of the delta still free for per-release deltas, split over
  the event's parts) so that basic and advanced composition can charge them; the stated
  event is what the ledger stores.
- ``commit``: ``reserved -> committed``; an actual event, if given, must cost no more
  than the reserved one in every field (e.g. training that stopped early) and the
  difference is refunded. Committing twice is a no-op.
- ``release``: ``reserved -> released``; the reservation is refunded.
- Non-private releases (events with a ``non_private`` part, e.g. the epsilon = inf
  baseline of a DP-SGD sweep) are refused (``budget.non_private``, 409) unless the
  officer set the dataset's ``allow_non_private``. When allowed, the entry stores the
  whole event, is flagged ``non_private`` and counted apart; the non-private part is not
  charged against the epsilon budget (it would make every later request infinite), and
  the dataset's DP guarantee does not cover it.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from accounting import events as ev
from accounting.costs import Cost, NoDeltaLeft, Price, price

from ..core.errors import (
    BudgetExceeded,
    DatasetNotActive,
    InvalidEvent,
    LedgerConflict,
    NoGrant,
    NonPrivateRefused,
)
from ..models import Budget, Dataset, Grant, LedgerEntry, Request
from . import sql as ledger_sql, trail
from .limits import Limit, charge_summary, exact_sums, num, refusal


@contextmanager
def event_errors():
    """A malformed event, or one the accountants cannot compute with, is a 400 (``event.invalid``)."""
    try:
        yield
    except ev.EventError as e:
        raise InvalidEvent(str(e), path=e.path) from e


def to_event(data) -> ev.Event:
    if isinstance(data, ev.Event):
        return data
    with event_errors():
        return ev.parse_event(data)


# --------------------------------------------------------------------------- actions


# Under the RDP policy per-release deltas only feed the basic/advanced columns of the
# report; once approximate-DP events have used the whole delta there, Gaussian events
# are stated at this tiny share of the budget's delta rather than refused.
REPORT_ONLY_DELTA_FLOOR = 1e-12


def _price(event: ev.Event, limits: list[tuple[Limit, Cost]]) -> Price | None:
    """The event's whole price, with a per-release delta stated on Gaussian-type parts
    that give none (see the module doc); None when no delta is left for them."""
    limit, _state = limits[0]
    floor = limit.delta * REPORT_ONLY_DELTA_FLOOR if limit.policy == "rdp" and limit.delta > 0 else 0.0
    with event_errors():
        try:
            return price(event, min(lim.pool(state) for lim, state in limits) / 2, floor=floor)
        except NoDeltaLeft:
            return None  # the caller refuses


def _plan(event, ds: Dataset, budget: Budget, grant: Grant | None, refuse_non_private: bool = True):
    """(stamped event, its cost, [(limit, state before)]) for an event on a locked budget
    (``refuse_non_private=False``: priced even where the gate would refuse it as
    non-private, for an estimate that says so)."""
    event = to_event(event)
    if refuse_non_private and ev.has_non_private(event) and not ds.allow_non_private:
        raise NonPrivateRefused(
            f"Refused: this request includes a non-private release (no DP guarantee) and dataset {ds.name} does "
            "not allow them; a privacy officer can allow non-private baselines (allow_non_private).",
            dataset=ds.name)
    limits = [(Limit.of_dataset(ds), Cost.from_json(budget.state))]
    if grant is not None:
        glimit = Limit.of_grant(grant, ds)
        if glimit is not None:
            limits.append((glimit, Cost.from_json(grant.state)))
    priced = _price(event, limits)
    if priced is None:
        limit, state = limits[0]
        raise BudgetExceeded(
            f"Refused: no delta is left in the {limit.scope} budget to charge a Gaussian-type release "
            f"under the {limit.policy} policy.", scope=limit.scope, policy=limit.policy, reason="delta",
            budget={"epsilon": limit.epsilon, "delta": limit.delta},
            spent_epsilon=num(limit.spent(state)), remaining_epsilon=num(max(0.0, limit.epsilon - limit.spent(state))))
    return priced.event, priced.cost, limits


GATE_REFUSALS = (BudgetExceeded, NonPrivateRefused, NoGrant, DatasetNotActive)


def admit(dataset: Dataset | int, analyst, event, *, reference: str = "", savepoint: bool = True,
          request_id=None, new_request: Request | None = None) -> LedgerEntry:
    """Reserve ``event`` on the dataset for ``analyst`` or raise ``BudgetExceeded``.

    The hot path of the service, so its statements are written as SQL (the ORM's query
    building cost four times the database work): lock the budget row and the analyst's
    active grant (one statement on PostgreSQL, joined with the dataset's budget and
    policy), insert the entry, update both running states and, given ``request_id``, write
    the entry on that request row, or given ``new_request`` (unsaved), insert that row with
    the entry on it (one data-modifying statement on PostgreSQL). The maths before and
    after is the same as everywhere.

    ``savepoint=False`` saves two statements when the caller's transaction already undoes
    everything on an error, as ``submission`` and ``execution`` do. A refusal (the
    ``GATE_REFUSALS``) is decided before anything is written and raised after the atomic
    block, so the caller's transaction stays usable (to record the refusal).
    """
    dataset_id = dataset if isinstance(dataset, int) else dataset.pk
    event = to_event(event)
    warm_caches(event)  # slow curve maths happens before the lock, not while holding it
    sql = ledger_sql.admit_sql()
    refused = None
    with transaction.atomic(savepoint=savepoint), connection.cursor() as cur:
        row = None
        if sql.budget_grant is not None:  # PostgreSQL: budget and grant rows in one statement
            cur.execute(sql.budget_grant, [analyst.pk, dataset_id])
            row = cur.fetchone()
        if row is None:
            cur.execute(sql.budget, [dataset_id])
            row = cur.fetchone()
            if row is None:
                raise Budget.DoesNotExist(f"no budget row for dataset {dataset_id}")
            cur.execute(sql.grant, [dataset_id, analyst.pk])
            row = tuple(row) + (cur.fetchone() or (None, None, None, None))
        (state, name, status, b_eps, b_delta, policy, allow_np, approx_share, committed, audit_seq, audit_head,
         g_id, g_cap_eps, g_cap_delta, g_state) = row
        ds = ledger_sql.DatasetRow(dataset_id, name, status, b_eps, b_delta, policy, bool(allow_np), approx_share)
        budget = ledger_sql.StateRow(dataset_id, ledger_sql.loads(state))
        grant = None if g_id is None else ledger_sql.GrantRow(g_id, g_cap_eps, g_cap_delta, ledger_sql.loads(g_state))
        try:
            if grant is None and not analyst.is_staff:
                raise NoGrant(f"{analyst} has no grant on dataset {name}.", dataset=name)
            if status != Dataset.Status.ACTIVE:
                raise DatasetNotActive(f"Dataset {name} is not active (status {status}).", dataset=name)
            stamped, cost, limits = _plan(event, ds, budget, grant)
            afters = []
            for limit, before in limits:
                summed = before + cost
                ok, after = limit.judge(summed, EntrySums(dataset_id, grant and grant.pk, limit).plus((cost, 1)))
                if not ok:
                    raise refusal(limit, before, summed, cost)
                afters.append(after)  # (just past a limit and within it exactly: at the limit)
        except GATE_REFUSALS as e:
            # the locked row's chain head, for the refusal's audit record (``refuse``)
            e.budget_row = SimpleNamespace(pk=dataset_id, committed=ledger_sql.loads(committed), audit_seq=audit_seq,
                                           audit_head=audit_head or "", name=name, delta=b_delta)
            refused = e
        else:
            entry_id, now, fields = _reserve(cur, sql, dataset_id, analyst, grant, stamped, cost, afters, b_delta,
                                             reference, request_id, new_request)
    if refused is not None:
        raise refused
    return LedgerEntry(id=entry_id, dataset_id=dataset_id, analyst=analyst, grant_id=grant.pk if grant else None,
                       reference=reference[:200], status=LedgerEntry.Status.RESERVED, created_at=now, **fields)


def _reserve(cur, sql, dataset_id, analyst, grant, stamped, cost, afters, b_delta, reference, request_id,
             new_request):
    """The admitted entry's writes (under the locks): the entry, both running states and
    the request row's link (or the new request row). Returns (entry id, now, the entry's
    JSON fields)."""
    now = timezone.now()
    fields = {"event": stamped.to_dict(), "cost": cost.to_json(), "charge": charge_summary(cost, b_delta)}
    when = connection.ops.adapt_datetimefield_value(now)
    fields["non_private"] = ev.has_non_private(stamped)
    entry_row = [dataset_id, analyst.pk, grant.pk if grant else None, reference[:200], ledger_sql.dumps(fields["event"]),
                 ledger_sql.dumps(fields["cost"]), ledger_sql.dumps(fields["charge"]), LedgerEntry.Status.RESERVED, when,
                 fields["non_private"]]
    budget_row = [ledger_sql.dumps(afters[0].to_json()), when, dataset_id]
    grant_row = None
    if grant is not None:
        grant_after = afters[1] if len(afters) > 1 else Cost.from_json(grant.state) + cost
        grant_row = [ledger_sql.dumps(grant_after.to_json()), grant.pk]
    request_pk = None if request_id is None else Request._meta.pk.get_db_prep_value(request_id, connection)
    new_row = None if new_request is None else ledger_sql.request_values(new_request)
    if sql.write_all is not None:  # PostgreSQL: the four writes in one round trip
        if new_row is not None:
            cur.execute(sql.write_all_new, entry_row + budget_row + (grant_row or [None, None]) + new_row)
        else:
            cur.execute(sql.write_all, entry_row + budget_row + (grant_row or [None, None]) + [request_pk])
        entry_id = cur.fetchone()[0]
    else:
        cur.execute(sql.insert, entry_row)
        entry_id = cur.fetchone()[0]
        cur.execute(sql.update_budget, budget_row)
        if grant_row is not None:
            cur.execute(sql.update_grant, grant_row)
        if request_pk is not None:
            cur.execute(sql.link_request, [entry_id, request_pk])
        if new_row is not None:
            cur.execute(sql.insert_request, new_row + [entry_id])
    if new_request is not None:
        ledger_sql.saved(new_request, entry_id)
    return entry_id, now, fields


def refuse(error, analyst, event, ctx: trail.Context, *, request_id) -> bool:
    """Record a refusal ``admit`` just raised, still under its lock, in one statement
    (PostgreSQL): delete the request row ``request_id`` if it was inserted before the gate
    (a request with an Idempotency-Key; others are written by the gate itself), write the
    refusal's audit record and advance the chain head. False where that statement does not
    exist (SQLite) or the refusal did not come from the lock: the caller records it."""
    sql = ledger_sql.admit_sql()
    budget = getattr(error, "budget_row", None)
    if sql.refuse is None or budget is None or request_id is None:
        return False
    rec, head = trail.prepare_refusal(budget, budget.name, budget.delta, analyst, event, error, ctx)
    with connection.cursor() as cur:
        cur.execute(sql.refuse, [Request._meta.pk.get_db_prep_value(request_id, connection)]
                    + ledger_sql.audit_values(rec) + [head["audit_seq"], head["audit_head"], budget.pk])
    return True


def warm_caches(event: ev.Event) -> None:
    """Compute the expensive per-mechanism curves (DP-SGD) into their caches."""
    from accounting.costs import normalise
    from accounting.rdp_math import subsampled_gaussian_curve

    for leaf in normalise(event).leaves():
        if isinstance(leaf, ev.SubsampledGaussianEvent):
            subsampled_gaussian_curve(leaf.sample_rate, leaf.noise_multiplier, 1)


def _status_now(cur, sql, entry_id: int) -> str:
    """After a compare-and-set that moved nothing: the entry's status now (under the lock)."""
    cur.execute(sql.status, [entry_id])
    return cur.fetchone()[0]


NOT_RESERVED = "only a reserved entry can be committed."
NEVER_REFUNDED = "a committed charge is never refunded."


def _settled(entry_id: int, status: str, target: str, refusal: str) -> LedgerEntry:
    """An entry found ``status`` where it was to move from reserved to ``target``: already
    there (a second delivery) is a no-op, anything else a conflict."""
    if status == target:
        return LedgerEntry.objects.get(pk=entry_id)
    raise LedgerConflict(f"Ledger entry {entry_id} is {status}; {refusal}")


def _audit_budget(locked: ledger_sql.LockedEntry):
    """What ``trail.append`` reads and advances of the locked budget row."""
    return SimpleNamespace(pk=locked.dataset_id, committed=locked.committed, audit_seq=locked.audit_seq,
                           audit_head=locked.audit_head)


def _entry(locked: ledger_sql.LockedEntry, **fields) -> LedgerEntry:
    return LedgerEntry(id=locked.pk, dataset_id=locked.dataset_id, analyst_id=locked.analyst_id,
                       grant_id=locked.grant_id, reference=locked.reference, event=locked.event, cost=locked.cost,
                       charge=locked.charge, non_private=locked.non_private, created_at=locked.created_at, **fields)


def _refund(cur, sql, locked: ledger_sql.LockedEntry, delta_cost: Cost, when, *, entries: int = 0) -> None:
    """Add ``delta_cost`` (negative: a refund) to the budget's and the grant's running states."""
    cur.execute(sql.budget_state, [ledger_sql.dumps((Cost.from_json(locked.state) + delta_cost).to_json()), entries,
                                   when, locked.dataset_id])
    if locked.grant_id is not None:
        cur.execute(sql.grant, [locked.grant_id])  # budget row, then grant row: the gate's order
        gstate = Cost.from_json(ledger_sql.loads(cur.fetchone()[0])) + delta_cost
        cur.execute(sql.grant_state, [ledger_sql.dumps(gstate.to_json()), locked.grant_id])


def commit(entry: LedgerEntry | int, actual_event=None, *, audit_ctx: trail.Context | None = None,
           savepoint: bool = True) -> LedgerEntry:
    """``reserved -> committed``, optionally with a cheaper actual event (refunding the
    rest), and the release's audit record written in the same transaction.

    Like ``admit``, written as SQL (``ledger_sql.settle_sql``): one statement locks the
    budget row and reads the entry, dataset and analyst; a compare-and-set UPDATE moves the
    status; the audit record and the chain head follow (4 statements; 6 with a refund). On
    PostgreSQL without a refund the last three are one statement (``commit_audited``)."""
    entry_id = entry if isinstance(entry, int) else entry.pk
    sql = ledger_sql.settle_sql()
    with transaction.atomic(savepoint=savepoint), connection.cursor() as cur:
        locked = ledger_sql.lock_entry(cur, entry_id)
        if locked is None:
            raise LedgerEntry.DoesNotExist(f"no ledger entry {entry_id}")
        if locked.status != LedgerEntry.Status.RESERVED:
            return _settled(entry_id, locked.status, LedgerEntry.Status.COMMITTED, NOT_RESERVED)
        reserved = Cost.from_json(locked.cost)
        committed_event = committed_cost = None
        if actual_event is not None:
            actual = to_event(actual_event)
            if ev.has_non_private(actual) and not locked.non_private:
                raise InvalidEvent("The committed event has a non-private part the reservation did not have.",
                                   reserved=locked.event, actual=actual.to_dict())
            with event_errors():
                priced = price(actual, reserved.delta, floor=1e-300)
            actual, actual_cost = priced.event, priced.cost
            if not actual_cost.dominated_by(reserved):
                raise InvalidEvent("The committed event costs more than the reservation in some accountant; "
                                   "a reservation can only shrink.", reserved=locked.event, actual=actual.to_dict())
            committed_event, committed_cost = actual.to_dict(), actual_cost.to_json()
        now = timezone.now()
        when = connection.ops.adapt_datetimefield_value(now)
        cas = [LedgerEntry.Status.COMMITTED, when, None if committed_event is None else ledger_sql.dumps(committed_event),
               None if committed_cost is None else ledger_sql.dumps(committed_cost), entry_id,
               LedgerEntry.Status.RESERVED]
        spent = Cost.from_json(committed_cost) if committed_cost is not None else reserved
        done = _entry(locked, status=LedgerEntry.Status.COMMITTED, committed_at=now, committed_event=committed_event,
                      committed_cost=committed_cost)
        chain = {"action": "commit", "actor": locked.username, "ctx": audit_ctx or trail.Context(outcome="charged"),
                 "entry": done, "event": committed_event or locked.event,
                 "reserved_event": locked.event if committed_event else None,
                 "charge": charge_summary(spent, locked.budget_delta), "committed_cost": spent,
                 "non_private": locked.non_private}
        one_statement = sql.commit_audited is not None and committed_cost is None
        if one_statement:
            # PostgreSQL, nothing refunded: the compare-and-set, the audit record (hashed
            # here, under the lock) and the chain head in one statement; the last two are
            # written only if the first moved the entry.
            rec, head = trail.prepare(_audit_budget(locked), locked.dataset_name, locked.budget_delta, **chain)
            cur.execute(sql.commit_audited, cas + ledger_sql.audit_values(rec) + ledger_sql.head_values(head, locked))
            moved = cur.fetchone()[0]
        else:
            cur.execute(sql.commit, cas)
            moved = cur.rowcount
        if moved != 1:  # committed or released since the row was read: decide on the status now
            return _settled(entry_id, _status_now(cur, sql, entry_id), LedgerEntry.Status.COMMITTED, NOT_RESERVED)
        if not one_statement:
            if committed_cost is not None:
                _refund(cur, sql, locked, Cost.from_json(committed_cost) - reserved, when)
            trail.append(_audit_budget(locked), locked.dataset_name, locked.budget_delta, **chain)
        return done


def release(entry: LedgerEntry | int, *, audit_ctx: trail.Context | None = None,
            savepoint: bool = True) -> LedgerEntry:
    """``reserved -> released``: refund the reservation, with its audit record. Releasing
    twice is a no-op. SQL like ``commit``."""
    entry_id = entry if isinstance(entry, int) else entry.pk
    sql = ledger_sql.settle_sql()
    with transaction.atomic(savepoint=savepoint), connection.cursor() as cur:
        locked = ledger_sql.lock_entry(cur, entry_id)
        if locked is None:
            raise LedgerEntry.DoesNotExist(f"no ledger entry {entry_id}")
        if locked.status != LedgerEntry.Status.RESERVED:
            return _settled(entry_id, locked.status, LedgerEntry.Status.RELEASED, NEVER_REFUNDED)
        now = timezone.now()
        when = connection.ops.adapt_datetimefield_value(now)
        cur.execute(sql.release, [LedgerEntry.Status.RELEASED, when, entry_id, LedgerEntry.Status.RESERVED])
        if cur.rowcount != 1:
            return _settled(entry_id, _status_now(cur, sql, entry_id), LedgerEntry.Status.RELEASED, NEVER_REFUNDED)
        _refund(cur, sql, locked, Cost.zero() - Cost.from_json(locked.cost), when, entries=-1)
        done = _entry(locked, status=LedgerEntry.Status.RELEASED, released_at=now)
        trail.append(_audit_budget(locked), locked.dataset_name, locked.budget_delta, action="release",
                     actor=locked.username, ctx=audit_ctx or trail.Context(outcome="released"), entry=done,
                     event=locked.event)
        return done


def charge(dataset: Dataset, user, event, *, reference: str = "", recorded_by=None) -> LedgerEntry:
    """Record a release made outside the service: admitted through the gate and committed,
    as ``user``'s (an officer's own, or an analyst's under her grant, ``recorded_by`` the
    officer, whom the audit record names). Refused by the gate, the refusal is recorded
    alike (the officer, the reference) and the gate's error raised."""
    ctx = trail.Context(kind="external charge", outcome="charged",
                        detail=f"recorded by {recorded_by.get_username()}" if recorded_by is not None else "")
    try:
        with transaction.atomic():
            entry = admit(dataset, user, event, reference=reference)
            return commit(entry, audit_ctx=ctx)
    except GATE_REFUSALS as e:
        ctx.reference = reference
        trail.record_refusal(dataset, user, event, e, ctx)
        raise


STATE_CHUNK = 1000  # entries read at a time by recompute_state (each with its cost curve)


class EntrySums:
    """``Limit.holds``'s exact sums: of the reserved and committed entries under a limit
    (the dataset's, or with a grant's limit that grant's; read once, O(history), and only
    when a state lies near the limit), plus new costs: ``sums.plus((cost, times), ...)``."""

    def __init__(self, dataset_id: int, grant_id: int | None, limit: Limit, up_to: int | None = None):
        self.dataset_id, self.grant_id, self.limit, self.up_to = dataset_id, grant_id, limit, up_to
        self._entries: dict[tuple, dict] = {}

    def entries(self, fields: list[int]) -> dict:
        key = tuple(fields)
        if key not in self._entries:
            entries = _live_entries(self.dataset_id, self.grant_id if self.limit.scope == "grant" else None,
                                    self.up_to)
            costs = (committed or cost for cost, committed in
                     entries.values_list("cost", "committed_cost").iterator(chunk_size=STATE_CHUNK))
            self._entries[key] = exact_sums(costs, fields)
        return self._entries[key]

    def plus(self, *extra: tuple[Cost, int]):
        def sums(fields):
            out, more = dict(self.entries(fields)), exact_sums((), fields, extra)
            return {i: None if out[i] is None or more[i] is None else out[i] + more[i] for i in fields}
        return sums


def holds_on_ledger(limit: Limit, state: Cost, dataset_id: int, grant_id: int | None = None, *,
                    up_to: int | None = None) -> bool:
    """``limit.holds`` of a running state as it stands (no new cost added), the ledger's
    exact sums deciding just past the limit (``up_to``: as ``_live_entries``)."""
    return limit.holds(state, EntrySums(dataset_id, grant_id, limit, up_to).plus())


def _live_entries(dataset_id: int, grant_id: int | None = None, up_to: int | None = None):
    """The entries a state sums (committed and reserved): the dataset's, or with
    ``grant_id`` that grant's; with ``up_to``, the reservations admitted after entry
    ``up_to`` left out (what stood ahead of it in the queue)."""
    entries = LedgerEntry.objects.filter(dataset_id=dataset_id).exclude(status=LedgerEntry.Status.RELEASED)
    if grant_id is not None:
        entries = entries.filter(grant_id=grant_id)
    if up_to is not None:
        entries = entries.filter(Q(status=LedgerEntry.Status.COMMITTED) | Q(pk__lte=up_to))
    return entries


def recompute_state(dataset_id: int, grant_id: int | None = None, up_to: int | None = None) -> Cost:
    """The running state re-derived from the ledger (for verification; O(history)): the
    dataset's, or with ``grant_id`` that grant's (``up_to``: as ``_live_entries``)."""
    total = Cost.zero()
    for cost, committed_cost in _live_entries(dataset_id, grant_id, up_to).values_list(
            "cost", "committed_cost").iterator(chunk_size=STATE_CHUNK):
        total = total + Cost.from_json(committed_cost or cost)
    return total
