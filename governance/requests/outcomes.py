"""Writing a run's outcome: the request row, then the ledger's commit or refund with its
audit record, in one transaction; and group commit, several outcomes in one transaction.

One outcome (``write``): the request row's compare-and-set ``running -> final`` first (as
the recovery sweep does), then the ledger. A request the sweep already declared lost is
left as it is and the run's result is dropped (never shown).

A group (``write_group``, the releaser thread's path: every outcome due at one moment in
one transaction): all the request rows' compare-and-sets first (one statement on
PostgreSQL), then the ledger entries dataset by dataset in id order: a dataset's plain
charges (no actual event) by ``ledger_group.commit_many``, its records chained in
hand-over order under one budget row lock; refunds and charges with an actual event by
``ledger.commit``/``release``, which find that lock already held. The orders keep every lock graph
acyclic: a sweep or a cancel holds one request row and then at most one budget row, and
the group takes no budget row before it holds all its request rows; two groups (two
worker processes) and the web's admissions take budget rows in dataset order, the
analyst's grant row after its budget row. When anything in a group fails (an actual event
that costs more than its reservation, a database error), the whole group is rolled back
and each outcome is written again on its own, so one bad outcome loses no other.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from ..ledger import actions as ledger, group as ledger_group, trail
from ..models import Request
from .result_files import drop_unreleased
from .waiting import final_state, signal_done, signal_done_many

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """A finished run's outcome, waiting to be written."""

    req: Request
    status: str
    result: dict | None = None
    error: dict | None = None
    actual_event: object = None
    charge: bool = True
    officer_report: dict | None = None
    salt: str = field(default_factory=lambda: secrets.token_hex(16))  # the result's, for its audit hash
    failing_since: float | None = None  # monotonic time of its first write that found the database away
    tries: int = 0  # writes tried again since

    def __post_init__(self):
        # the result as every database gives it back (``trail.storable``), stored and hashed
        # alike: PostgreSQL's jsonb gave a released 1e17 back as an int, and the analyst's
        # sha256(salt + canonical(result)) never matched the record's (probe CR)
        if self.result is not None:
            self.result = trail.storable(self.result)


def write(outcome: Outcome) -> str:
    """Write one outcome in its own transaction; returns the request's status now."""
    with transaction.atomic():
        if outcome.req.pk not in _finish_rows([outcome]):
            return _status(outcome)
        _signal_on_commit(outcome, _settle(outcome))
    return outcome.status


def write_group(outcomes: list[Outcome]) -> None:
    """Write ``outcomes`` in one transaction (see the module doc); on any failure, each on
    its own. Every outcome given has reached its tick."""
    if len(outcomes) == 1:
        _write_logged(outcomes[0])
        return
    try:
        with transaction.atomic():
            moved = _finish_rows(outcomes)
            finished = [o for o in outcomes if o.req.pk in moved]
            settled: dict = {}  # request id -> its ledger entry as committed or refunded
            plain: list[Outcome] = []  # consecutive plain charges of one dataset: one ledger_group call
            for o in sorted(finished, key=lambda o: o.req.dataset_id):  # stable: each chain in hand-over order
                if plain and (o.req.dataset_id != plain[0].req.dataset_id or not _plain(o)):
                    _commit_plain(plain, settled)
                    plain = []
                if _plain(o):
                    plain.append(o)
                else:
                    settled[o.req.pk] = _settle(o)
            if plain:
                _commit_plain(plain, settled)
            states = [(o.req.pk, final_state(o.req, settled.get(o.req.pk))) for o in finished]
            transaction.on_commit(lambda: signal_done_many(states))  # one Redis round trip
    except Exception:  # noqa: BLE001 - retried one by one below
        log.warning("group commit of %d outcomes failed; writing each on its own", len(outcomes), exc_info=True)
        for o in outcomes:
            _write_logged(o)


def _commit_plain(plain: list[Outcome], settled: dict) -> None:
    entries = ledger_group.commit_many([(o.req.ledger_entry_id, _context(o)) for o in plain])
    settled.update(zip((o.req.pk for o in plain), entries))


def _signal_on_commit(o: Outcome, entry) -> None:
    """After the commit, wake a ``?wait`` on the request with what was committed (the
    request's outcome columns and its ledger entry: ``waiting.final_state``)."""
    state = final_state(o.req, entry)
    transaction.on_commit(lambda: signal_done(o.req.pk, state))


def write_or_retry(outcome: Outcome) -> str:
    """``write``, and if the database is away, written again later (``_again``); the
    request's status as far as this process knows."""
    from ..core.errors import storage_unwritable

    try:
        return write(outcome)
    except DatabaseError as e:
        if not (isinstance(e, DATABASE_AWAY) or storage_unwritable(e)):  # (a PostgreSQL standby: read-only)
            raise
        _again(outcome, e)
        return Request.Status.RUNNING


def _write_logged(outcome: Outcome) -> None:
    try:
        write_or_retry(outcome)
    except Exception:  # noqa: BLE001 - the request stays running; the sweep finishes it
        log.exception("writing the outcome of request %s failed; the recovery sweep will finish it", outcome.req.pk)


DATABASE_AWAY = (OperationalError, InterfaceError)
RETRY_DELAYS = (1.0, 2.0, 5.0)  # seconds before the 1st, 2nd, and every later try


def _again(outcome: Outcome, error: Exception) -> None:
    """The database was away (locked past its timeout, restarting, unreachable) when the
    outcome was written: the run is done and its result in hand, so the write is tried
    again on this process's releaser thread, every few seconds for OUTCOME_RETRY_SECONDS
    (before: the result was dropped and the sweep later charged the reservation in full,
    ``request.worker_lost``). The transaction rolled back, so nothing was half written."""
    from django.conf import settings

    from .releaser import RELEASER

    now = time.monotonic()
    if outcome.failing_since is None:
        outcome.failing_since = now
    waited = now - outcome.failing_since
    if waited > settings.OUTCOME_RETRY_SECONDS:
        log.error("the outcome of request %s could not be written for %.0f s (%s); the recovery sweep will finish "
                  "it", outcome.req.pk, waited, error)
        return
    _beat(outcome)
    delay = RETRY_DELAYS[min(outcome.tries, len(RETRY_DELAYS) - 1)]
    outcome.tries += 1
    log.warning("writing the outcome of request %s found the database away (%s); trying again in %g s",
                outcome.req.pk, error, delay)
    RELEASER.at(now + delay, outcome, group=write_group)


def _beat(outcome: Outcome) -> None:
    """The request's heartbeat, while its outcome waits to be written: the task has
    returned and its clock thread with it, and the sweep took the silence for a dead
    worker. A probe's nearly full database disk took the sweep's small commit but not the
    outcome's: the live run was finished as ``worker_lost``, charged in full, its table
    dropped. A beat that cannot be written either changes nothing (the sweep then cannot
    write its own)."""
    from .recovery import db_time

    try:
        Request.objects.filter(pk=outcome.req.pk, status=Request.Status.RUNNING).update(heartbeat_at=db_time())
    except DATABASE_AWAY:
        pass


_ROW = ("status", "result", "result_salt", "error", "finished_at", "officer_report", "progress")


def _finish_rows(outcomes: list[Outcome]) -> set:
    """Every request row's compare-and-set; the ids that moved. A result whose cancel was
    asked while it waited for its release (the releaser's tick, up to the dataset's release
    clock: the cancel answered 200 "running") is not released: it is written cancelled,
    charged as it was (``_cancelled_late``). Any other row no longer running was finished
    elsewhere (the recovery sweep): its outcome is dropped."""
    moved = _compare_and_set(outcomes)
    missed = [o for o in outcomes if o.req.pk not in moved]
    asked = [o.req.pk for o in missed if o.status == Request.Status.SUCCEEDED]
    cancelled = set(Request.objects.filter(pk__in=asked, status=Request.Status.RUNNING, cancel_requested=True)
                    .values_list("pk", flat=True)) if asked else set()
    for o in missed:
        if o.req.pk in cancelled:
            _cancelled_late(o)
            if _compare_and_set([o]):
                moved.add(o.req.pk)
                continue
        _dropped(o)
    return moved


def _compare_and_set(outcomes: list[Outcome]) -> set:
    """``running -> final`` for each row (a success only while no cancel was asked); the ids
    that moved. PostgreSQL: one ``UPDATE ... FROM (VALUES ...)`` for the group; SQLite: one
    by one."""
    now = timezone.now()
    rows = {o.req.pk: _row(o, now) for o in outcomes}
    if connection.vendor != "postgresql":
        moved = set()
        for o in outcomes:
            not_cancelled = {"cancel_requested": False} if o.status == Request.Status.SUCCEEDED else {}
            if Request.objects.filter(pk=o.req.pk, status=Request.Status.RUNNING, **not_cancelled).update(
                    **rows[o.req.pk]):
                moved.add(o.req.pk)
    else:
        field = Request._meta.get_field
        params = []
        for o in outcomes:
            params.append(field("id").get_db_prep_value(o.req.pk, connection))
            params += [field(k).get_db_prep_save(v, connection) for k, v in rows[o.req.pk].items()]
        with connection.cursor() as cur:
            cur.execute(_finish_rows_sql(len(outcomes)), params + [Request.Status.RUNNING, Request.Status.SUCCEEDED])
            moved = {row[0] for row in cur.fetchall()}
    for o in outcomes:
        if o.req.pk in moved:
            _written(o, rows[o.req.pk])
    return moved


CANCELLED_RUNNING = "Cancelled while running; the data was read, the charge for the work done stands."


def _cancelled_late(o: Outcome) -> None:
    """``o``, a result not to be released: cancelled, its charge (and actual event) as it
    was, its files removed."""
    log.info("request %s: cancel asked while its result waited for release; not released", o.req.pk)
    if (o.result or {}).get("files") or (o.officer_report or {}).get("files"):
        drop_unreleased(o.req.pk)
    if (o.officer_report or {}).get("files"):  # removed with the rest: not listed as if they were there
        o.officer_report = {**o.officer_report, "files": []}
    o.status, o.result = Request.Status.CANCELLED, None
    o.error = {"code": "request.cancelled", "detail": CANCELLED_RUNNING}


def _dropped(o: Outcome) -> None:
    """The run's outcome is not written: the request was finished elsewhere (the recovery
    sweep, its run taken for lost). Files the run kept are no release's."""
    log.warning("request %s was finished elsewhere (recovery sweep); its run's outcome is dropped", o.req.pk)
    if (o.result or {}).get("files") or (o.officer_report or {}).get("files"):
        drop_unreleased(o.req.pk)


def _row(o: Outcome, now) -> dict:
    """The request row's outcome columns as the compare-and-set writes them."""
    salt = o.salt if o.result is not None else ""
    return dict(zip(_ROW, (o.status, o.result, salt, o.error, now, o.officer_report,
                           {"phase": o.status, "fraction": 1.0})))


def _written(o: Outcome, values: dict) -> None:
    """``o.req`` as its row now is, ``values`` (``_row``'s) written (for the pushed final state)."""
    for k, v in values.items():
        setattr(o.req, k, v)


@functools.cache
def _finish_rows_sql(k: int) -> str:
    field = Request._meta.get_field
    cols = [field("id")] + [field(name) for name in _ROW]
    row = "(" + ", ".join(f"%s::{f.cast_db_type(connection)}" for f in cols) + ")"
    sets = ", ".join(f"{field(name).column} = v.{field(name).column}" for name in _ROW)
    status, cancel = field("status").column, field("cancel_requested").column
    return (f"UPDATE {Request._meta.db_table} r SET {sets} FROM (VALUES {', '.join([row] * k)}) "
            f"v({', '.join(f.column for f in cols)}) WHERE r.id = v.id AND r.{status} = %s "
            f"AND NOT (v.{status} = %s AND r.{cancel}) RETURNING r.id")


def _settle(o: Outcome):
    """The ledger's half: commit (with the actual event) or refund, with the audit record;
    the entry as it now is (None without one).
    No savepoint: an error rolls back the caller's whole transaction, the request row too."""
    if not o.req.ledger_entry_id:
        return None
    ctx = _context(o)
    if o.charge:
        return ledger.commit(o.req.ledger_entry_id, o.actual_event, audit_ctx=ctx, savepoint=False)
    return ledger.release(o.req.ledger_entry_id, audit_ctx=ctx, savepoint=False)


def _plain(o: Outcome) -> bool:
    """A charge of the whole reservation (no actual event): ``ledger_group`` can commit it."""
    return bool(o.req.ledger_entry_id) and o.charge and o.actual_event is None


def _context(o: Outcome) -> trail.Context:
    error = o.error or {}
    return trail.Context.of_request(o.req, outcome=o.status, reason=error.get("code", ""),
                                    detail=error.get("detail", ""), result_sha256=trail.result_digest(o.result, o.salt),
                                    cluster=trail.cluster_job(o.officer_report))


def _status(o: Outcome) -> str:
    return Request.objects.filter(pk=o.req.pk).values_list("status", flat=True).first()
