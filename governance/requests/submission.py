"""Submitting and cancelling requests: validate, plan, gate, queue.

``submit`` runs the engine's ``plan`` (no data read), then in one transaction stores the
request as ``queued``, reserves its event through the gate and schedules the Celery task
with ``transaction.on_commit`` (so a worker never sees a request that was rolled back).
A refused request leaves no request and no reservation (the gate refuses before it writes;
a request row inserted before the gate, one with an Idempotency-Key, is deleted); its
refusal is written to the audit trail in the same transaction (who asked for what, and
why not). An identical request (same dataset version, engine, kind and parameters) that the
same analyst already got answered is answered from the stored release at no cost: it is
the same noisy value, post-processing is free. A POST retried with the same
``Idempotency-Key`` gets the first request back, whatever its state, and is not charged again.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from engines import plugins
from engines.types import EngineRequest, PlanError

from ..core import dispatch
from ..core.errors import (
    DatasetNotActive,
    IdempotencyKeyReused,
    InvalidRequest,
    LedgerConflict,
    NoGrant,
    TooManyActive,
    UserError,
)
from ..core.roles import AUDITORS_GROUP, is_auditor
from ..datasets.engine_meta import dataset_meta
from ..ledger import actions as ledger, sql as ledger_sql, trail
from ..ledger.queued import cancel_if_queued
from ..models import Dataset, Request


class EngineRequestInvalid(UserError):
    code = "request.invalid"


def fingerprint(ds: Dataset, engine: str, kind: str, params: dict) -> str:
    """What makes two requests the same question, answered by one release (a replay): the
    dataset, its rows' version, what the officer declared of it (the schema's bounds,
    domains, integer and nullable declarations, its delta and PLD setting: a correction of
    a bound or a domain is a new question, never answered by a release made under the old
    declaration), the engine, the kind and the parameters."""
    canonical = json.dumps({"dataset": ds.pk, "version": ds.sha256, "declared": {
                                "columns": ds.columns, "delta": ds.budget_delta, "pld": ds.pld_certification},
                            "engine": engine, "kind": kind, "params": params},
                           sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_size(params: dict) -> None:
    """At most ``MAX_REQUEST_PARAMS_BYTES`` of JSON: parameters are kept in the request's
    row and its audit record for good, a refusal's and a replay's too, at no charge."""
    limit = settings.MAX_REQUEST_PARAMS_BYTES
    size = len(json.dumps(params, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    if size > limit:
        raise InvalidRequest(f"params take {size:,} bytes of JSON, more than the {limit:,} a request may have "
                             "(they are kept in its audit record for good)", errors={"params": "too large"})


def plan_request(ds: Dataset, engine: str, kind: str, params: dict):
    try:
        federated_engine = bool(plugins.info(engine).get("federated"))
        if federated_engine != (ds.execution == Dataset.Execution.FEDERATED):
            raise EngineRequestInvalid(
                f"dataset {ds.name!r} is federated (its rows stay at its sites): only a federated engine runs on it"
                if not federated_engine else
                f"engine {engine!r} trains across the sites of a federated dataset; {ds.name!r} is not federated",
                errors={"engine": "a federated engine for a federated dataset, any other engine for any other"})
        return plugins.plan(engine, EngineRequest(kind=kind, params=params), dataset_meta(ds))
    except PlanError as e:
        err = EngineRequestInvalid(e.message, errors=e.errors)
        err.code = e.code
        raise err from e


def given(params):
    """The parameters as given: a top-level JSON null is a parameter not given (its default),
    for every engine alike. An engine's own check had let ``"max_grad_norm": null`` through
    to the run, charged, then failed after the read, and ``"rounds": null`` raise a 500."""
    return {k: v for k, v in params.items() if v is not None} if isinstance(params, dict) else params


def submit(analyst, ds: Dataset, engine: str, kind: str, params: dict, *,
           idempotency_key: str = "") -> tuple[Request, bool]:
    """Plan, gate and queue a request. Returns (request, replayed).

    With an ``idempotency_key`` the analyst used before, nothing is planned, gated or
    charged again: the earlier request comes back as it is now, with ``repeated = True``
    (a retry of a POST whose answer was lost, while the first may still be queued or
    running). The same key with a different request is refused (422).

    ``params`` (``given``: nulls dropped) are planned, fingerprinted and stored as every
    database gives them back (``trail.storable``: a float of 1e16 or more is the int it equals): PostgreSQL's jsonb
    read 1.5e300 back as the decimal 15 x 10^299, SQLite as the float, and the two audit
    trails recorded the same request with two different numbers."""
    if isinstance(params, dict):
        params = trail.storable(given(params))
    if idempotency_key and (earlier := _repeat_of(analyst, idempotency_key, ds, engine, kind, params)):
        return earlier, False
    if ds.status != Dataset.Status.ACTIVE:
        raise DatasetNotActive(f"Dataset {ds.name} is not active.", dataset=ds.name)
    if not isinstance(params, dict):
        raise InvalidRequest("params must be a JSON object", errors={"params": "must be an object"})
    plan = plan_request(ds, engine, kind, params)  # (an engine's own error first: it names the bad keys)
    _check_size(params)
    fp = fingerprint(ds, engine, kind, params)
    queue = plugins.info(engine)["queue"]
    refusal = None
    try:
        with transaction.atomic():
            try:
                out = _admit(analyst, ds, engine, kind, params, fp, plan, queue, idempotency_key)
            except GATE_REFUSALS as e:
                # A refusal is raised before the gate writes anything (the transaction is
                # intact): the request row is deleted and the refusal's audit record written
                # in the same transaction, so a 409 never goes out without its record (on
                # PostgreSQL in one statement, under the gate's lock). No savepoint: two
                # statements fewer on every admitted POST.
                ctx = trail.Context(engine=engine, kind=kind, params=params)
                if not ledger.refuse(e, analyst, plan.event, ctx, request_id=getattr(e, "request_id", None)):
                    _discard(getattr(e, "request_id", None))
                    trail.record_refusal(ds, analyst, plan.event, e, ctx)
                refusal = e
    except IntegrityError:
        # The same Idempotency-Key in two concurrent POSTs: the other one won (PostgreSQL
        # made this insert wait for its commit); answer with its request.
        if idempotency_key and (earlier := _repeat_of(analyst, idempotency_key, ds, engine, kind, params)):
            return earlier, False
        raise
    if refusal is not None:
        raise refusal
    return out


def access_refusal(analyst, ds: Dataset) -> UserError | None:
    """Why ``analyst`` may not use ``ds`` now, as read from the database (the dataset is not
    active, or the analyst is not an officer and holds no active grant on it); None if
    they may."""
    from ..models import Grant

    if Dataset.objects.filter(pk=ds.pk).values_list("status", flat=True).first() != Dataset.Status.ACTIVE:
        return DatasetNotActive(f"Dataset {ds.name} is not active.", dataset=ds.name)
    if not analyst.is_staff and not Grant.objects.filter(dataset=ds, analyst=analyst, revoked_at__isnull=True).exclude(
            analyst__groups__name=AUDITORS_GROUP).exists():  # (an auditor holds no grant: one from before is void)
        return NoGrant(f"{analyst} has no grant on dataset {ds.name}.", dataset=ds.name)
    return None


def _may_still_use(analyst, ds: Dataset) -> None:
    """A replay's check of the grant and the dataset's status under the budget row lock, the
    lock a revocation or a deactivation takes: one racing this replay is either seen here
    (refused, NoGrant or DatasetNotActive) or comes after the replay's record."""
    from ..models import Budget

    Budget.objects.select_for_update().filter(pk=ds.pk).exists()
    if (refusal := access_refusal(analyst, ds)) is not None:
        raise refusal


def _admit(analyst, ds, engine, kind, params, fp, plan, queue, idempotency_key) -> tuple[Request, bool]:
    if (prior := _answered(analyst, fp)) is not None:
        _may_still_use(analyst, ds)
        now = timezone.now()
        replay = Request.objects.create(
            analyst=analyst, dataset=ds, engine=engine, kind=kind, params=params, fingerprint=fp,
            idempotency_key=idempotency_key, plan=prior.plan, replay_of=prior, status=Request.Status.SUCCEEDED,
            result=prior.result, result_salt=prior.result_salt, progress={"phase": "replayed", "fraction": 1.0}, started_at=now, finished_at=now)
        trail.record_replay(ds, analyst, trail.Context.of_request(
            replay, result_sha256=trail.result_digest(prior.result, prior.result_salt), detail=f"replay of request {prior.pk}"))
        return replay, True
    _check_active(analyst)
    req = Request(analyst=analyst, dataset=ds, engine=engine, kind=kind, params=params, fingerprint=fp,
                  idempotency_key=idempotency_key, plan=_plan_json(plan), progress={"phase": "queued"})
    # A request with an Idempotency-Key is inserted before the budget lock, never under it:
    # a concurrent retry's insert of the same key waits for a worker finishing the first
    # request, which holds that request's row and waits for the budget lock (a deadlock if
    # the retry held it). One without a key waits for nothing on its insert, and the gate's
    # own statement writes it with its entry (one statement and the ORM's insert fewer).
    # No savepoint in admit: a refusal (raised before the gate writes) carries the
    # request's id and the caller deletes the row if there is one; any other error rolls
    # back everything.
    if idempotency_key:
        ledger_sql.insert_request(req)
    try:
        # the entry's id is written on the request row by the gate's own statement
        entry = ledger.admit(ds, analyst, plan.event, reference=f"request {req.pk}", savepoint=False,
                             **({"request_id": req.pk} if idempotency_key else {"new_request": req}))
    except GATE_REFUSALS as e:
        e.request_id = req.pk
        raise
    req.ledger_entry = entry
    transaction.on_commit(lambda: enqueue(req.pk, queue))
    return req, False


ACTIVE_RETRY_AFTER = 10  # seconds a refused analyst is told to wait
ACTIVE_LOCK_CLASS = 0x5071  # the advisory locks' first key: one analyst's submissions


def _check_active(analyst) -> None:
    """``TooManyActive`` if ``analyst`` has ``MAX_ACTIVE_REQUESTS`` requests queued or
    running. Counted in the submission's transaction: on PostgreSQL after a lock of the
    analyst's own (an advisory lock on their id, held to the commit), so concurrent
    submissions of one analyst count one another; SQLite's transaction holds the write
    lock already. Replays do no work and are not counted."""
    cap = settings.MAX_ACTIVE_REQUESTS
    if not cap:
        return
    with connection.cursor() as cur:  # plain SQL: the ORM's count cost ~0.5 ms of CPU on every POST
        if connection.vendor == "postgresql":
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [ACTIVE_LOCK_CLASS, analyst.pk % 2**31])
        cur.execute(f"SELECT COUNT(*) FROM {Request._meta.db_table} WHERE analyst_id = %s AND status IN (%s, %s)",
                    [analyst.pk, Request.Status.QUEUED, Request.Status.RUNNING])
        n = cur.fetchone()[0]
    if n >= cap:
        raise TooManyActive(f"{analyst} has {n} requests queued or running, the most one analyst may have at once; "
                            "submit this one when one of them has ended (or cancel one).",
                            active=n, max_active=cap, retry_after=ACTIVE_RETRY_AFTER)


def _answered(analyst, fp: str) -> Request | None:
    """The analyst's first succeeded request with fingerprint ``fp`` (to replay), or None:
    the release itself, never one of its replays (a replay is succeeded with the same
    fingerprint: one stamped earlier by a web process whose clock was behind became the
    "first", and every later replay pointed at it and found no files, a probe's 404s).
    Its id by one statement written out (the ORM's query building was ~1 ms of every POST,
    which almost never finds one); the row only when there is one."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id FROM {Request._meta.db_table} WHERE analyst_id = %s AND fingerprint = %s"
                    " AND status = %s AND replay_of_id IS NULL ORDER BY created_at LIMIT 1",
                    [analyst.pk, fp, Request.Status.SUCCEEDED])
        row = cur.fetchone()
    return None if row is None else Request.objects.get(pk=row[0])


def resent(analyst, key: str, dataset_name: str, engine: str, kind: str, params) -> Request | None:
    """The analyst's earlier request sent with ``key``, for a POST naming a dataset she may
    no longer use (deactivated, her grant revoked since): a retry of a POST whose answer
    was lost is that same POST, and gets the request as it is now, as she sees it in her
    list; nothing is planned, gated or charged. None if she never sent ``key``; the same
    key with another request is refused (422) whether or not ``dataset_name`` exists."""
    if is_auditor(analyst):  # an analyst made an auditor sees none of her requests: not even their ids (probe CO)
        return None
    if isinstance(params, dict):
        params = trail.storable(given(params))
    ds = Dataset.objects.filter(name=dataset_name).only("pk").first()
    return _repeat_of(analyst, key, ds, engine, kind, params)


def _repeat_of(analyst, key: str, ds: Dataset | None, engine: str, kind: str, params) -> Request | None:
    """The analyst's earlier request sent with ``key``, if it is this same request. Looked
    up by one written-out statement (on every POST with a key; it seldom finds one)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id FROM {Request._meta.db_table} WHERE analyst_id = %s AND idempotency_key = %s",
                    [analyst.pk, key])
        row = cur.fetchone()
    if row is None:
        return None
    earlier = Request.objects.get(pk=row[0])
    # the same POST: the same dataset, engine, kind and parameters (whatever changed in the
    # dataset since, the earlier request is the answer to this one)
    same = (ds is not None and earlier.dataset_id == ds.pk and earlier.engine == engine and earlier.kind == kind
            and isinstance(params, dict) and earlier.params == params)
    if not same:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for request {earlier.pk} "
            f"({earlier.engine}.{earlier.kind} on {earlier.dataset.name}) with other parameters; "
            "use a new key for a new request.", request=str(earlier.pk))
    earlier.repeated = True
    return earlier


GATE_REFUSALS = ledger.GATE_REFUSALS


def _discard(request_id) -> None:
    """Delete a refused request's row (inserted before the gate; nothing refers to it yet)."""
    if request_id is not None:
        with connection.cursor() as cur:
            cur.execute(f"DELETE FROM {Request._meta.db_table} WHERE id = %s",
                        [Request._meta.pk.get_db_prep_value(request_id, connection)])


def _plan_json(plan) -> dict:
    return {"event": plan.event, "columns": list(plan.columns), "details": plan.details}


def enqueue(request_id, queue: str):
    """Send the request's task (by name, ``governance.core.dispatch``); marked unsent if the broker refuses."""
    dispatch.send(request_id, queue)


def cancel(req: Request) -> Request:
    """Queued: cancelled and refunded. Running: cancellation requested (the charge stands,
    the data is being read). Finished: a conflict."""
    with transaction.atomic():
        if cancel_if_queued(req, "request.cancelled", "Cancelled before it ran."):
            return Request.objects.get(pk=req.pk)
        if Request.objects.filter(pk=req.pk, status=Request.Status.RUNNING).update(cancel_requested=True):
            return Request.objects.get(pk=req.pk)
    current = Request.objects.get(pk=req.pk)
    raise LedgerConflict(f"Request {req.pk} is {current.status}; it can no longer be cancelled.",
                         status_now=current.status)
