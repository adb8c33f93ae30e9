"""The audit trail: one hash-chained record per release, refund, refusal and replay, per
federated site secret handed out, per officer's change of the budget or a privacy setting
and per grant given, re-capped or revoked (``governance.ledger.grants``).

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
and the Dask keys its logs and dashboard show (``cluster_job``). A federated run's record
names its SuperLink, its Flower run and its sites: ``{"backend": "flower", "superlink",
"job"?, "sites": {"connected", "aggregated", "refused"}}`` (refused: why, per node). The key is in the hashed
body only when it is set, so records written before it existed, and every record of a
local run, hash exactly as before (same format, ``privacy-audit/1``).

``totals`` are the dataset's *committed* spend after the record, per accountant, at the
dataset's delta (reservations in flight are not releases).

This module writes the chain and fixes its encoding; ``governance.audit.verification``
reads it back and checks it against the ledger.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction

from accounting import ACCOUNTANTS
from accounting.costs import Cost
from ..models import AuditRecord, Budget, Dataset, LedgerEntry
from ..stored_json import _EXPONENT_FORM, storable, storable_text  # noqa: F401 (used as trail.storable)

GENESIS = "0" * 64
FORMAT = "privacy-audit/1"

# body key -> model field, in the export's order
FIELDS = ("seq", "dataset", "action", "at", "actor", "request", "ledger_entry", "reference", "engine", "kind",
          "params", "outcome", "reason", "detail", "event", "reserved_event", "charge", "totals", "non_private",
          "result_sha256", "worker", "requested_at", "prev_hash")


# --------------------------------------------------------------------------- hashing


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.astimezone(UTC).isoformat(timespec="microseconds")


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


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
    if job.get("backend") == "flower":  # a federated run (governance.requests.federated_runs)
        sites = job.get("sites") or {}
        out = {"backend": "flower", "superlink": str(job.get("superlink", "")),
               "sites": {k: [str(x) for x in sites.get(k) or []] for k in ("connected", "aggregated", "refused")}}
        if job.get("job"):
            out["job"] = str(job["job"])
        return out
    from engines.distributed.cluster import public_address

    keys = job.get("keys") or ([job["graph_key"]] if job.get("graph_key") else [])
    out = {"backend": str(job.get("backend", "")), "scheduler": public_address(str(job.get("scheduler", ""))),
           "keys": [str(k) for k in keys]}
    if job.get("job"):
        out["job"] = str(job["job"])
    return out


def result_digest(result, salt: str = "") -> str:
    """SHA-256 of the request's ``result_salt`` (hex text) followed by the released result's
    canonical JSON (files are in it with their own SHA-256). The salt goes to the analyst
    with the result, never into the trail: without it, the few numbers a count or a
    histogram releases could be found from the hash by trying them (a few million guesses)."""
    if result is None:
        return ""
    return hashlib.sha256(salt.encode() + canonical(result)).hexdigest()


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
    reference: str = ""  # a record with no ledger entry (a refused external charge): the officer's reference

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
        reference=(entry.reference if entry is not None else ctx.reference)[:200], engine=ctx.engine[:100],
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


def record_site_key(dataset: Dataset, actor: str, site: str) -> None:
    """A federated site's secret handed out (``governance.datasets.federated.issue_secret``):
    who asked, for which site. No charge; the caller's transaction."""
    budget = Budget.objects.select_for_update().get(pk=dataset.pk)
    ctx = Context(engine="federated", outcome="issued", detail=f"site {site!r}: its agent's secret handed out")
    append(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.SITE_KEY, actor=actor, ctx=ctx)


# What an officer may change that decides what the ledger admits or how a release is made:
# the values a dataset is registered with are the first ``settings`` record of its audit
# chain (``record_registration``), each later change another (``record_settings``).
AUDITED_SETTINGS = ("budget_epsilon", "budget_delta", "delta_auto", "policy", "approx_delta_share",
                    "allow_non_private", "release_quantum_ms", "pld_certification")


def audited_settings(dataset: Dataset) -> dict:
    """The dataset's ``AUDITED_SETTINGS`` and ``schema_sha256``, the digest of its declared
    schema (the bounds and domains set what a release's noise is calibrated to, so a
    change of them is an officer's change of a privacy setting too)."""
    values = {k: getattr(dataset, k) for k in AUDITED_SETTINGS}
    values["schema_sha256"] = digest(storable(dataset.schema))
    return values


def record_settings(budget: Budget, dataset: Dataset, actor: str, changed: dict) -> None:
    """An officer's change of the dataset's budget or of a privacy setting
    (``governance.datasets.registry.update``): who, and each setting's old and new value in
    ``params`` (``{"budget_epsilon": [1.0, 2.0], ...}``). No charge; the totals are at the
    dataset's delta after the change. The caller holds ``budget``, the locked row."""
    detail = "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
    ctx = Context(outcome="changed", params={k: list(v) for k, v in changed.items()}, detail=detail)
    append(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.SETTINGS, actor=actor, ctx=ctx)


def record_registration(dataset: Dataset) -> None:
    """The budget and privacy settings a dataset was registered with, as a ``settings``
    record from nothing (``{"budget_epsilon": [None, 1.0], ...}``) naming who registered it:
    the start every later change of a setting must follow, so ``audit verify`` can compare
    a dataset's settings with its records from its first day. Written in the registration's
    transaction, when its budget is final (a table read by a worker: when the read is done)."""
    budget = Budget.objects.select_for_update().get(pk=dataset.pk)
    values = audited_settings(dataset)
    detail = "registered with " + "; ".join(f"{k} {v!r}" for k, v in values.items())
    ctx = Context(outcome="registered", params={k: [None, v] for k, v in values.items()}, detail=detail)
    append(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.SETTINGS,
           actor=dataset.created_by.get_username(), ctx=ctx)


def record_replay(dataset: Dataset, analyst, ctx: Context) -> None:
    """A stored release served again to the analyst who got it: no charge, but a record."""
    budget = Budget.objects.select_for_update().get(pk=dataset.pk)
    ctx.outcome = "replayed"
    append(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.REPLAY,
           actor=analyst.get_username(), ctx=ctx)
