"""Verifying the audit trail: the hash chain, then its agreement with the ledger.

``verify`` checks each dataset's chain (``governance.ledger.trail`` wrote it: each
record's hash over its canonical body, each ``prev_hash`` the hash before it, the budget
row's length and head), then that it agrees with the ledger: every final ledger entry has
exactly its record, events and charges match, and the running totals re-compose from the
ledger's costs; and that the officer's settings and grant records follow one another and
leave the dataset's settings and grants as they are now.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from accounting.costs import Cost

from ..core.batched import batched
from ..core.snapshot import snapshot
from ..ledger.limits import charge_summary
from ..ledger.trail import GENESIS, audited_settings, body, digest, legacy_body, storable, totals_of
from ..models import UNREADABLE, AuditRecord, Budget, Dataset, LedgerEntry

@dataclass
class Finding:
    dataset: str
    seq: int | None
    record_id: int | None
    problem: str

    def __str__(self):
        where = f"record {self.seq} (id {self.record_id})" if self.seq is not None else "the chain"
        return f"dataset {self.dataset}: {where}: {self.problem}"


@dataclass
class Verification:
    datasets: int = 0
    records: int = 0
    findings: list[Finding] = field(default_factory=list)
    heads: dict = field(default_factory=dict)
    legacy: list = field(default_factory=list)  # (dataset, seq) that verify only under legacy_body

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first_broken(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def as_dict(self) -> dict:
        first = self.first_broken
        return {"ok": self.ok, "datasets": self.datasets, "records": self.records, "heads": self.heads,
                "first_broken": None if first is None else {"dataset": first.dataset, "seq": first.seq,
                                                            "record_id": first.record_id, "problem": first.problem},
                "problems": [str(f) for f in self.findings[:100]],
                "legacy_records": [{"dataset": d, "seq": q} for d, q in self.legacy[:100]]}


def _close(a, b) -> bool:
    if isinstance(a, (dict, list)) and a == b:  # the usual case, at C speed: a cost's curve is
        return True                              # hundreds of numbers
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):  # a cost's curve, summed in another order
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def verify_dataset(ds: Dataset, out: Verification, *, stop_at_first: bool = True) -> None:
    """Check ``ds``'s chain and its agreement with the ledger; append findings to ``out``."""
    def bad(rec, problem):
        out.findings.append(Finding(ds.name, rec.seq if rec else None, rec.pk if rec else None, problem))
        return stop_at_first

    budget = Budget.objects.get(pk=ds.pk)
    statuses = dict(LedgerEntry.objects.filter(dataset=ds).values_list("pk", "status"))
    seen: set[int] = set()
    officer: dict = {}  # the settings and grants as the last settings / grant records left them
    registered = False  # the chain opens with the registration's record: every grant since has records
    state = Cost.zero()
    prev = GENESIS
    expected_seq = 1
    n = 0
    expected_totals = {}  # the totals the state re-composes to, by delta: until the next commit
    out.datasets += 1
    for rec, entries in _with_entries(ds, AuditRecord.objects.filter(dataset=ds).order_by("seq", "id")):
        n += 1
        b = body(rec, ds.name)
        if rec.seq != expected_seq:
            if bad(rec, f"out of sequence: expected record {expected_seq}, found {rec.seq} "
                        "(a record was deleted, inserted or reordered)"):
                break
        expected_seq = rec.seq + 1
        if rec.prev_hash != prev:
            if bad(rec, "prev_hash does not match the hash of the record before it "
                        "(a record before it was deleted, inserted, reordered or edited)"):
                break
        if digest(b) != rec.hash:
            if legacy_body(b, rec.hash) is not None:
                out.legacy.append((ds.name, rec.seq))
            else:
                if bad(rec, "its hash does not match its content (the record was edited)"
                       + (": a JSON column cannot be read" if UNREADABLE in str(b) else "")):
                    break
                prev = rec.hash  # its content is not the record's: not checked against the ledger
                continue
        prev = rec.hash
        if n == 1:
            registered = rec.action == AuditRecord.Action.SETTINGS and rec.outcome == "registered"
        problem = _agrees(rec, entries, seen, rec.totals.get("at_delta")) or _follows(rec, officer)
        if problem is None and rec.action == AuditRecord.Action.COMMIT:
            entry = entries[rec.ledger_entry_id]
            state = state + Cost.from_json(entry.committed_cost or entry.cost)
            expected_totals.clear()
        if problem is None:
            at = rec.totals.get("at_delta", -1.0)
            key = repr(at)  # refusals and replays leave the state: their totals are the last commit's
            if key not in expected_totals:
                expected_totals[key] = storable(totals_of(state, at))
            if not _close(rec.totals, expected_totals[key]):
                problem = "its running totals do not re-compose from the ledger's committed costs"
        if problem is not None and bad(rec, problem):
            break
    out.records += n
    out.heads[ds.name] = {"seq": budget.audit_seq, "hash": budget.audit_head or GENESIS}
    if out.findings and stop_at_first:
        return
    if n != budget.audit_seq or prev != (budget.audit_head or GENESIS):
        bad(None, f"the budget row records {budget.audit_seq} records ending in {budget.audit_head[:12] or '-'}, "
                  f"the chain has {n} ending in {prev[:12]} (records were deleted or added at the end)")
        return
    missing = [pk for pk, status in statuses.items() if status != LedgerEntry.Status.RESERVED and pk not in seen]
    if missing:
        bad(None, f"ledger entr{'y' if len(missing) == 1 else 'ies'} {', '.join(map(str, missing[:10]))} "
                  "ha{} no audit record".format("s" if len(missing) == 1 else "ve"))
        return
    if not _close(Cost.from_json(budget.committed).to_json(), state.to_json()):
        bad(None, "the budget row's committed totals differ from the chain's")
        return
    for problem in _officer_state_now(ds, officer, registered):
        if bad(None, problem):
            return
    for problem in _gate_state(ds):
        if bad(None, problem):
            return


CHUNK = 1000  # records read at a time, with their ledger entries


def _with_entries(ds: Dataset, records) -> Iterator[tuple[AuditRecord, dict]]:
    """Each of ``records`` with ``{pk: ledger entry}`` of its chunk's entries in ``ds``'s
    ledger: read ``CHUNK`` records at a time, so memory does not grow with the trail (every
    entry at once, each with its cost curve, was 100 MB at 100,000 records)."""
    for chunk in batched(records.iterator(chunk_size=CHUNK), CHUNK):
        ids = {r.ledger_entry_id for r in chunk if r.ledger_entry_id is not None}
        entries = {e.pk: e for e in LedgerEntry.objects.filter(dataset=ds, pk__in=ids).select_related(
            "analyst", "grant").only("id", "status", "event", "committed_event", "cost", "committed_cost",
                                     "non_private", "reference", "analyst", "grant")}
        yield from ((r, entries) for r in chunk)


def _gate_state(ds: Dataset) -> list[str]:
    """What the gate admits against, re-derived from the ledger: the budget's and each
    grant's running state (reserved and committed costs), within the budget; a reservation
    only while its request is queued or running. Read in ``verify``'s snapshot, with the
    chain: a charge under way is in all of them or in none, and no lock is taken (on
    SQLite the lock was the database's one write lock, every writer waiting)."""
    return _gate_problems(ds)


def _state_matches(state: Cost, derived: Cost, dataset_id: int, grant_id: int | None = None) -> bool:
    """A running state is the ledger's live costs summed as they came and went, each sum
    rounded up (``accounting.costs``): never below the ledger's sum, and above it by at
    most the roundings at the magnitudes it passed through. A probe's refunded synthesis
    (RDP up to 8.4e8 at some orders) left 1e-7 behind on a state of about 1, and the chain
    of an untampered database was reported broken."""
    if _close(state.to_json(), derived.to_json()):
        return True
    if not np.array_equal(state.infs, derived.infs):
        return False
    close = 1e-9 * np.abs(derived.finite) + 1e-15
    if (state.finite < derived.finite - close).any():
        return False
    entries = LedgerEntry.objects.filter(dataset_id=dataset_id)
    if grant_id is not None:
        entries = entries.filter(grant_id=grant_id)
    seen, ops = np.zeros_like(derived.finite), 1
    for cost, committed in entries.values_list("cost", "committed_cost").iterator(chunk_size=1000):
        for c in (cost, committed):
            if c:
                seen += np.abs(Cost.from_json(c).finite)
                ops += 2  # added, and taken out (a release) or replaced (a commit's own cost)
    return bool((state.finite <= derived.finite + close + 2.0 * ops * np.finfo(float).eps * seen).all())


def _gate_problems(ds: Dataset) -> list[str]:
    from ..ledger.actions import holds_on_ledger, recompute_state
    from ..ledger.limits import Limit
    from ..models import Grant, Request

    problems = []
    budget = Budget.objects.get(pk=ds.pk)
    derived = recompute_state(ds.pk)
    if not _state_matches(Cost.from_json(budget.state), derived, ds.pk):
        problems.append("the budget row's running state (what the gate admits against) differs from the "
                        "ledger's reserved and committed costs")
    for grant in Grant.objects.filter(dataset=ds).order_by("pk"):
        if not _state_matches(Cost.from_json(grant.state), recompute_state(ds.pk, grant.pk), ds.pk, grant.pk):
            problems.append(f"grant {grant.pk}'s running state differs from its ledger entries' costs")
    limit = Limit.of_dataset(ds)
    spent = limit.spent(derived)
    if not holds_on_ledger(limit, derived, ds.pk):
        problems.append(f"the ledger spends epsilon {spent:.6g} under {limit.policy}, past the budget of "
                        f"{limit.epsilon:g}")
    stray = list(LedgerEntry.objects.filter(dataset=ds, status=LedgerEntry.Status.RESERVED).exclude(
        request__status__in=[Request.Status.QUEUED, Request.Status.RUNNING]).values_list("pk", flat=True)[:10])
    if stray:
        problems.append(f"ledger entr{'y' if len(stray) == 1 else 'ies'} {', '.join(map(str, stray))} "
                        "reserved without a request in flight")
    return problems


def _follows(rec: AuditRecord, officer: dict) -> str | None:
    """None if a settings or grant record starts where the last one of the same setting or
    grant left it (else it was changed without a record in between); notes where it leaves
    it in ``officer``: ``{setting: value, ("grant", id): (cap_epsilon, cap_delta, active)}``."""
    params = rec.params if isinstance(rec.params, dict) else {}
    if rec.action == AuditRecord.Action.SETTINGS:
        for name, change in params.items():
            if not (isinstance(change, list) and len(change) == 2):
                return f"its change of {name} is not [old, new]"
            if name in officer and not _close(officer[name], change[0]):
                return f"it changes {name} from {change[0]!r}, the record before left it at {officer[name]!r}"
            officer[name] = change[1]
    elif rec.action == AuditRecord.Action.GRANT:
        caps = [params.get("cap_epsilon"), params.get("cap_delta")]
        if not all(isinstance(c, list) and len(c) == 2 for c in caps):
            return "its caps are not [old, new]"
        key = ("grant", params.get("grant"))
        last = officer.get(key)
        if last is not None and params.get("analyst") != last[3]:
            return (f"it names grant {params.get('grant')}'s analyst {params.get('analyst')!r}, the record before "
                    f"{last[3]!r}")
        if last is not None and rec.outcome == "granted" and last[2]:
            return f"it gives grant {params.get('grant')} again, the record before left it active"
        if rec.outcome != "granted" and last is not None and not (
                last[2] and _close(list(last[:2]), [c[0] for c in caps])):
            return (f"it finds grant {params.get('grant')} with caps {[c[0] for c in caps]}, the record before "
                    f"left it at {list(last[:2])}{'' if last[2] else ' and revoked'}")
        officer[key] = (caps[0][1], caps[1][1], rec.outcome != "revoked", params.get("analyst"))
    return None


def _officer_state_now(ds: Dataset, officer: dict, registered: bool) -> list[str]:
    """The dataset's settings and grants as the last records left them (those with a record),
    read in ``verify``'s snapshot, with the records. On a dataset whose chain opens with its
    registration (registered since grants are recorded) every grant has a record: one
    without was given in the database (a probe's INSERT gave an analyst a dataset, and her
    releases verified)."""
    from ..models import Grant

    if not officer:  # no settings or grant record: nothing to compare
        return []
    problems = []
    grants = {g.pk: g for g in Grant.objects.filter(dataset=ds).select_related("analyst")}
    if registered:
        unrecorded = sorted(pk for pk in grants if ("grant", pk) not in officer)
        if unrecorded:
            problems.append(f"grant{'s' if len(unrecorded) > 1 else ''} {', '.join(map(str, unrecorded[:10]))} "
                            "ha{} no grant record: given without one (in the database)".format(
                                "ve" if len(unrecorded) > 1 else "s"))
    now = audited_settings(ds)
    for key, value in officer.items():
        if isinstance(key, str) and key in now and not _close(storable(now[key]), value):
            problems.append(f"the dataset's {key} is {now[key]!r}, its last settings record set "
                            f"{value!r} (changed without a record)")
    for key, (cap_epsilon, cap_delta, active, analyst) in ((k, v) for k, v in officer.items() if isinstance(k, tuple)):
        g = grants.get(key[1])
        if g is None or not _close([storable(g.cap_epsilon), storable(g.cap_delta)], [cap_epsilon, cap_delta]) \
                or g.active != active or g.analyst.get_username()[:150] != analyst:
            problems.append(f"grant {key[1]} differs from what its last grant record left ({analyst}'s, caps "
                            f"{[cap_epsilon, cap_delta]}, {'active' if active else 'revoked'}): changed without "
                            "a record")
    return problems


def _agrees(rec: AuditRecord, entries: dict, seen: set, delta) -> str | None:
    """None if the record agrees with its ledger entry, else what is wrong."""
    if rec.action in (AuditRecord.Action.REFUSE, AuditRecord.Action.REPLAY, AuditRecord.Action.SITE_KEY,
                      AuditRecord.Action.SETTINGS, AuditRecord.Action.GRANT):
        if rec.ledger_entry_id is not None or rec.charge is not None:
            return f"a {rec.action} record carries a ledger entry or a charge"
        return None
    entry = entries.get(rec.ledger_entry_id)
    if entry is None:
        return f"ledger entry {rec.ledger_entry_id} does not exist in this dataset's ledger"
    if rec.ledger_entry_id in seen:
        return f"ledger entry {rec.ledger_entry_id} has a second final record"
    seen.add(rec.ledger_entry_id)
    want = LedgerEntry.Status.COMMITTED if rec.action == AuditRecord.Action.COMMIT else LedgerEntry.Status.RELEASED
    if entry.status != want:
        return f"ledger entry {entry.pk} is {entry.status}, the record says {rec.action}"
    if rec.actor != entry.analyst.get_username()[:150]:
        return f"its actor differs from ledger entry {entry.pk}'s analyst"
    if entry.grant is not None and entry.grant.analyst_id != entry.analyst_id:
        return f"ledger entry {entry.pk}'s grant is another analyst's"
    if entry.grant is None and not entry.analyst.is_staff:
        return f"ledger entry {entry.pk} has no grant and its analyst is not an officer"
    if rec.reference != entry.reference[:200]:
        return f"its reference differs from ledger entry {entry.pk}'s"
    reserved_cost, reserved_non_private = priced(entry.event)
    if not _close(entry.cost, reserved_cost) or (
            entry.committed_event is not None and not _close(entry.committed_cost, priced(entry.committed_event)[0])):
        return f"ledger entry {entry.pk}'s cost is not its event's"
    if reserved_non_private != entry.non_private:
        return f"ledger entry {entry.pk}'s non_private flag is not its event's (a non-private part counts apart)"
    if rec.reserved_event is not None and not _close(rec.reserved_event, entry.event):
        return f"its reserved event differs from ledger entry {entry.pk}'s"
    spent = entry.committed_event or entry.event
    if rec.action == AuditRecord.Action.COMMIT:
        if not _close(rec.event, spent):
            return f"its event differs from ledger entry {entry.pk}'s"
        if not isinstance(delta, float) or not _close(rec.charge, storable(charge_of(entry, delta))):
            return f"its charge differs from ledger entry {entry.pk}'s cost"
        if rec.non_private != entry.non_private:
            return f"its non_private flag differs from ledger entry {entry.pk}'s"
    elif not _close(rec.event, entry.event):
        return f"its event differs from ledger entry {entry.pk}'s"
    return None


def priced(event) -> tuple[dict, bool | None]:
    """(the cost vector, whether it has a non-private part) of an event, as its ledger
    entry must store them (``{"unparseable": True}`` and None for an unreadable one)."""
    return _priced_text(json.dumps(event, sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _priced_text(text: str) -> tuple[dict, bool | None]:
    """Cached by the event's JSON: a ledger repeats a few shapes of event many times (read only)."""
    from accounting.costs import private_cost
    from accounting.events import has_non_private, parse_event

    try:  # as the ledger stores it: an allowed non-private part is counted apart, not in the cost
        event = parse_event(json.loads(text))
        return private_cost(event).to_json(), has_non_private(event)
    except (ValueError, TypeError, KeyError):
        return {"unparseable": True}, None


def charge_of(entry: LedgerEntry, delta: float) -> dict:
    """What a committed entry charged, per accountant, reported at ``delta``."""
    return charge_summary(Cost.from_json(entry.committed_cost or entry.cost), delta)


def verify(datasets=None, *, stop_at_first: bool = True) -> Verification:
    """Every dataset's chain (or ``datasets``'), each read in one snapshot
    (``core.snapshot``: releases written meanwhile are not half seen)."""
    out = Verification()
    qs = Dataset.objects.order_by("name")
    if datasets is not None:
        qs = qs.filter(pk__in=[d.pk for d in datasets])
    for pk in qs.values_list("pk", flat=True):
        with snapshot():  # the dataset's row too: an officer's change meanwhile is seen with its record
            verify_dataset(Dataset.objects.get(pk=pk), out, stop_at_first=stop_at_first)
        if out.findings and stop_at_first:
            break
    return out
