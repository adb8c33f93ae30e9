"""The audit trail: one hash-chained record per release, refund, refusal and replay.

Each dataset has its own chain. ``append`` is called by the ledger action it records
(``ledger.commit``, ``ledger.release``, a refusal at the gate, a replay), in that
action's transaction and under the dataset's budget row lock, so records are written in
the order the ledger changed and a rolled-back action leaves no record.

A record's ``hash`` is SHA-256 over its canonical JSON (``canonical``): the record as
``body`` gives it, ``hash`` left out, ``prev_hash`` in; keys sorted, no spaces, UTF-8,
Python's ``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
The first record's ``prev_hash`` is 64 zeros. The budget row keeps the chain's length and
head, so deleting the last records is caught too. A chain anchored nowhere else can be
rewritten whole by someone who can write the database: publish or file the head hash
that ``audit verify`` prints (exports carry it) to anchor it.

``cluster`` (a distributed run's record only): the cluster job that computed it,
``{"backend", "scheduler", "keys", "job"?}``: the scheduler's address without credentials
and the Dask keys its logs and dashboard show (``cluster_job``). The key is in the hashed
body only when it is set, so records written before it existed, and every record of a
local run, hash exactly as before (same format, ``privacy-audit/1``).

``totals`` are the dataset's *committed* spend after the record, per accountant, at the
dataset's delta (reservations in flight are not releases). ``verify`` checks the chain,
then that it agrees with the ledger: every final ledger entry has exactly its record,
events and charges match, and the running totals re-compose from the ledger's costs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction

from accounting import ACCOUNTANTS
from accounting.costs import Cost
from .limits import charge_summary
from .models import AuditRecord, Budget, Dataset, LedgerEntry

GENESIS = "0" * 64
AUDITORS_GROUP = "auditors"
FORMAT = "privacy-audit/1"

# body key -> model field, in the export's order
FIELDS = ("seq", "dataset", "action", "at", "actor", "request", "ledger_entry", "reference", "engine", "kind",
          "params", "outcome", "reason", "detail", "event", "reserved_event", "charge", "totals", "non_private",
          "result_sha256", "worker", "requested_at", "prev_hash")


def is_auditor(user) -> bool:
    """Auditors: read-only access to audit records and exports, nothing else."""
    if not (user and user.is_authenticated):
        return False
    cached = getattr(user, "_is_auditor", None)
    if cached is None:
        cached = user._is_auditor = user.groups.filter(name=AUDITORS_GROUP).exists()
    return cached


def can_audit(user) -> bool:
    """Privacy officers (staff) and auditors."""
    return bool(user and user.is_authenticated and (user.is_staff or is_auditor(user)))


# --------------------------------------------------------------------------- hashing


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.astimezone(UTC).isoformat(timespec="microseconds")


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


# Python writes a float of magnitude 1e16 or more in exponent form ("1e+16"); PostgreSQL's
# jsonb stores it as a numeric and gives it back without one ("10000000000000000"), which
# Python reads as an int. Below 1e16 (and for exponents below zero) the text comes back as
# the same float. Every float that large is a whole number, so it is kept as that int.
_EXPONENT_FORM = 1e16


def storable(value):
    """``value`` as a JSON value that every supported database stores and gives back
    unchanged, so a record hashes the same after its round trip: a float of magnitude 1e16
    or more becomes the int it equals, -0.0 becomes 0.0 (jsonb has no negative zero), NaN
    and infinities become the strings "NaN", "Infinity" and "-Infinity" (JSON has no such
    numbers), a NUL character becomes U+FFFD and a lone surrogate "?" (jsonb and UTF-8
    hold neither), tuples become lists and keys strings. Iterative: no recursion limit."""
    root = [value]
    stack = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        v = parent[key]
        if isinstance(v, float):
            if not math.isfinite(v):
                parent[key] = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            elif abs(v) >= _EXPONENT_FORM:
                parent[key] = int(v)
            elif v == 0.0:
                parent[key] = 0.0
        elif isinstance(v, str):
            parent[key] = storable_text(v)
        elif isinstance(v, dict):
            out = {(storable_text(k) if isinstance(k, str) else json.dumps(k)): item for k, item in v.items()}
            parent[key] = out
            stack.extend((out, k) for k in out)
        elif isinstance(v, (list, tuple)):
            out = list(v)
            parent[key] = out
            stack.extend((out, i) for i in range(len(out)))
    return root[0]


def storable_text(s: str) -> str:
    """``s`` without what PostgreSQL's text and jsonb refuse (NUL) or UTF-8 cannot encode
    (lone surrogates)."""
    if "\x00" in s:
        s = s.replace("\x00", "\ufffd")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def digest(body: dict) -> str:
    return hashlib.sha256(canonical(body)).hexdigest()


MAX_LEGACY_ZEROS = 8  # a legacy record with more zeros than this is not searched for the -0.0 it held


def legacy_body(body: dict, hash_: str) -> dict | None:
    """The body a record written before ``storable`` (its content as the writer hashed it)
    had, if PostgreSQL's jsonb changed it on the way in and only so: its numbers of 1e16 or
    more hashed in Python's exponent form and given back as ints, its -0.0 given back as
    0.0. None if no such reading hashes to ``hash_``. Sound for every record, old or new: a
    reading puts back exponent-form floats or -0.0, which ``storable`` never lets a new
    record hold, so no edit of a new record can hash right under it."""
    zeros: list[tuple] = []
    floats: list = []
    floated = _floated(body, zeros, floats)
    if not floats and not zeros:
        return None
    if len(zeros) > MAX_LEGACY_ZEROS:
        zeros = []
    for mask in range(1 << len(zeros)):
        for i, (parent, key) in enumerate(zeros):
            parent[key] = -0.0 if mask >> i & 1 else 0.0
        if digest(floated) == hash_:
            return floated
    return None


def _floated(value, zeros: list, floats: list):
    """A copy of ``value`` with every int of magnitude 1e16 or more as a float (each one
    appended to ``floats``); the places of its float zeros appended to ``zeros`` as
    (container, key). Records nest a few levels: recursion is safe here."""
    if isinstance(value, dict):
        out = {k: _floated(v, zeros, floats) for k, v in value.items()}
        zeros.extend((out, k) for k, v in out.items() if isinstance(v, float) and v == 0.0)
        return out
    if isinstance(value, list):
        out = [_floated(v, zeros, floats) for v in value]
        zeros.extend((out, i) for i, v in enumerate(out) if isinstance(v, float) and v == 0.0)
        return out
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _EXPONENT_FORM:
        try:
            floats.append(float(value))
            return floats[-1]
        except OverflowError:
            return value
    return value


def hashed_body(rec: AuditRecord, dataset_name: str) -> dict:
    """The body that ``rec.hash`` is the hash of: ``body``, or for a record written before
    ``storable`` and changed by jsonb, its ``legacy_body`` (what exports carry, so that a
    third party recomputes the hash)."""
    b = body(rec, dataset_name)
    if digest(b) == rec.hash:
        return b
    return legacy_body(b, rec.hash) or b


def body(rec: AuditRecord, dataset_name: str) -> dict:
    """The record as it is hashed and exported (without ``hash``)."""
    out = {
        "seq": rec.seq, "dataset": dataset_name, "action": rec.action, "at": _iso(rec.at), "actor": rec.actor,
        "request": str(rec.request_id) if rec.request_id else None, "ledger_entry": rec.ledger_entry_id,
        "reference": rec.reference, "engine": rec.engine, "kind": rec.kind, "params": rec.params,
        "outcome": rec.outcome, "reason": rec.reason, "detail": rec.detail, "event": rec.event,
        "reserved_event": rec.reserved_event, "charge": rec.charge, "totals": rec.totals,
        "non_private": rec.non_private, "result_sha256": rec.result_sha256, "worker": rec.worker,
        "requested_at": _iso(rec.requested_at), "prev_hash": rec.prev_hash,
    }
    if rec.cluster:  # optional: absent from local runs' records and from records older than it
        out["cluster"] = rec.cluster
    return out


def cluster_job(officer_report: dict | None) -> dict | None:
    """What names a distributed run's cluster job in its audit record, from the run's
    officer report: backend, scheduler address (credentials, query and fragment removed)
    and the Dask keys (a graph's final key, or a training job's rank tasks)."""
    job = (officer_report or {}).get("cluster")
    if not isinstance(job, dict):
        return None
    from engines.distributed.cluster import public_address

    keys = job.get("keys") or ([job["graph_key"]] if job.get("graph_key") else [])
    out = {"backend": str(job.get("backend", "")), "scheduler": public_address(str(job.get("scheduler", ""))),
           "keys": [str(k) for k in keys]}
    if job.get("job"):
        out["job"] = str(job["job"])
    return out


def result_digest(result) -> str:
    """SHA-256 of a released result's canonical JSON (files are in it with their own SHA-256)."""
    if result is None:
        return ""
    return hashlib.sha256(canonical(result)).hexdigest()


# --------------------------------------------------------------------------- writing


@dataclass
class Context:
    """What the ledger does not know about a release: the request and its outcome."""

    request_id: object = None
    engine: str = ""
    kind: str = ""
    params: dict | None = None
    outcome: str = ""
    reason: str = ""
    detail: str = ""
    result_sha256: str = ""
    worker: str = ""
    requested_at: datetime | None = None
    cluster: dict | None = None  # cluster_job(): a distributed run's cluster job
    extra: dict = field(default_factory=dict)

    @classmethod
    def of_request(cls, req, **kw) -> Context:
        return cls(request_id=req.pk, engine=req.engine, kind=req.kind, params=req.params, worker=req.worker,
                   requested_at=req.created_at, **kw)


def totals_of(state: Cost, delta: float) -> dict:
    """Committed spend per accountant: epsilon and delta at the dataset's ``delta`` (kept
    in the totals, since an officer may change the dataset's delta later)."""
    out = {"at_delta": delta}
    for name, acc in ACCOUNTANTS.items():
        spent = acc.spent(state, delta).as_dict()
        out[name] = {"epsilon": spent["epsilon"], "delta": spent["delta"]}
    return out


def append(budget: Budget, ds_name: str, ds_delta: float, *, action: str, actor: str, ctx: Context | None = None,
           entry: LedgerEntry | None = None, event=None, reserved_event=None, charge=None,
           committed_cost: Cost | None = None, non_private: bool = False) -> AuditRecord:
    """Write the next record of ``budget``'s dataset. The caller holds the budget row lock
    (``select_for_update``) inside a transaction; ``budget`` is that locked row."""
    rec, updates = prepare(budget, ds_name, ds_delta, action=action, actor=actor, ctx=ctx, entry=entry, event=event,
                           reserved_event=reserved_event, charge=charge, committed_cost=committed_cost,
                           non_private=non_private)
    return write(budget, rec, updates)


def write(budget: Budget, rec: AuditRecord, updates: dict) -> AuditRecord:
    """Save a prepared record and advance the locked budget row's chain head."""
    rec.save(force_insert=True)
    Budget.objects.filter(pk=budget.pk).update(**updates)
    for key, value in updates.items():
        setattr(budget, key, value)
    return rec


def prepare(budget: Budget, ds_name: str, ds_delta: float, *, action: str, actor: str, ctx: Context | None = None,
            entry: LedgerEntry | None = None, event=None, reserved_event=None, charge=None,
            committed_cost: Cost | None = None, non_private: bool = False) -> tuple[AuditRecord, dict]:
    """The next record of ``budget``'s dataset, hashed but not saved, and the budget row's
    new chain head (``audit_seq``, ``audit_head`` and, for a charge, ``committed``): what
    ``append`` writes, or a caller's own statement (``ledger.commit`` on PostgreSQL)."""
    ctx = ctx or Context()
    committed = Cost.from_json(budget.committed)
    if committed_cost is not None:
        committed = committed + committed_cost
    rec = AuditRecord(
        dataset_id=budget.pk, seq=budget.audit_seq + 1, action=action, at=datetime.now(UTC), actor=actor[:150],
        request_id=ctx.request_id, ledger_entry_id=entry.pk if entry is not None else None,
        reference=(entry.reference if entry is not None else "")[:200], engine=ctx.engine[:100],
        kind=ctx.kind[:100], params=ctx.params, outcome=ctx.outcome[:20], reason=ctx.reason[:100],
        detail=ctx.detail, event=event, reserved_event=reserved_event, charge=charge,
        totals=totals_of(committed, ds_delta), non_private=non_private, result_sha256=ctx.result_sha256,
        worker=ctx.worker[:200], cluster=ctx.cluster or None, requested_at=ctx.requested_at or (entry.created_at if entry is not None else None), prev_hash=budget.audit_head or GENESIS)
    # the hash covers the values as every supported database gives them back (``storable``)
    for name in ("params", "event", "reserved_event", "charge", "totals", "cluster"):
        setattr(rec, name, storable(getattr(rec, name)))
    for name in ("actor", "reference", "engine", "kind", "outcome", "reason", "detail", "worker"):
        setattr(rec, name, storable_text(getattr(rec, name)))
    rec.hash = digest(body(rec, ds_name))
    updates = {"audit_seq": rec.seq, "audit_head": rec.hash}
    if committed_cost is not None:
        updates["committed"] = committed.to_json()
    return rec, updates


def record_refusal(dataset: Dataset, analyst, event, error, ctx: Context) -> None:
    """A refused request: the gate's answer is part of the record (who asked for what)."""
    with transaction.atomic():
        budget = Budget.objects.select_for_update().get(pk=dataset.pk)
        write(budget, *prepare_refusal(budget, dataset.name, dataset.budget_delta, analyst, event, error, ctx))


def prepare_refusal(budget, ds_name: str, ds_delta: float, analyst, event, error,
                    ctx: Context) -> tuple[AuditRecord, dict]:
    """A refusal's record, prepared (``prepare``) on the locked ``budget`` row."""
    ctx.outcome, ctx.reason = "refused", getattr(error, "code", "")
    ctx.detail = ": ".join(filter(None, [ctx.detail, str(getattr(error, "detail", error))]))
    return prepare(budget, ds_name, ds_delta, action=AuditRecord.Action.REFUSE, actor=analyst.get_username(), ctx=ctx,
                   event=event.to_dict() if hasattr(event, "to_dict") else event)


def record_replay(dataset: Dataset, analyst, ctx: Context) -> None:
    """A stored release served again to the analyst who got it: no charge, but a record."""
    budget = Budget.objects.select_for_update().get(pk=dataset.pk)
    ctx.outcome = "replayed"
    append(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.REPLAY,
           actor=analyst.get_username(), ctx=ctx)


# --------------------------------------------------------------------------- verifying


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
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def verify_dataset(ds: Dataset, out: Verification, *, stop_at_first: bool = True) -> None:
    """Check ``ds``'s chain and its agreement with the ledger; append findings to ``out``."""
    def bad(rec, problem):
        out.findings.append(Finding(ds.name, rec.seq if rec else None, rec.pk if rec else None, problem))
        return stop_at_first

    budget = Budget.objects.get(pk=ds.pk)
    entries = {e.pk: e for e in LedgerEntry.objects.filter(dataset=ds).only(
        "id", "status", "event", "committed_event", "cost", "committed_cost", "non_private")}
    seen: set[int] = set()
    state = Cost.zero()
    prev = GENESIS
    expected_seq = 1
    n = 0
    out.datasets += 1
    for rec in AuditRecord.objects.filter(dataset=ds).order_by("seq", "id").iterator(chunk_size=2000):
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
            elif bad(rec, "its hash does not match its content (the record was edited)"):
                break
        prev = rec.hash
        problem = _agrees(rec, entries, seen, rec.totals.get("at_delta"))
        if problem is None and rec.action == AuditRecord.Action.COMMIT:
            entry = entries[rec.ledger_entry_id]
            state = state + Cost.from_json(entry.committed_cost or entry.cost)
        if problem is None and not _close(rec.totals, storable(totals_of(state, rec.totals.get("at_delta", -1.0)))):
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
    missing = [pk for pk, e in entries.items() if e.status != LedgerEntry.Status.RESERVED and pk not in seen]
    if missing:
        bad(None, f"ledger entr{'y' if len(missing) == 1 else 'ies'} {', '.join(map(str, missing[:10]))} "
                  "ha{} no audit record".format("s" if len(missing) == 1 else "ve"))
        return
    if not _close(Cost.from_json(budget.committed).to_json(), state.to_json()):
        bad(None, "the budget row's committed totals differ from the chain's")


def _agrees(rec: AuditRecord, entries: dict, seen: set, delta) -> str | None:
    """None if the record agrees with its ledger entry, else what is wrong."""
    if rec.action in (AuditRecord.Action.REFUSE, AuditRecord.Action.REPLAY):
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


def charge_of(entry: LedgerEntry, delta: float) -> dict:
    """What a committed entry charged, per accountant, reported at ``delta``."""
    return charge_summary(Cost.from_json(entry.committed_cost or entry.cost), delta)


def verify(datasets=None, *, stop_at_first: bool = True) -> Verification:
    out = Verification()
    qs = Dataset.objects.order_by("name")
    if datasets is not None:
        qs = qs.filter(pk__in=[d.pk for d in datasets])
    for ds in qs:
        verify_dataset(ds, out, stop_at_first=stop_at_first)
        if out.findings and stop_at_first:
            break
    return out
