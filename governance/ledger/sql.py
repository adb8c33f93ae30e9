"""The gate's hot path as SQL: the statements ``ledger.admit`` runs, per database vendor.

The ORM's query building cost four times the database work on this path, so the lock,
the entry's insert and the running states' updates are written out here once per vendor
(PostgreSQL does the three writes in one data-modifying CTE). ``commit`` and ``release``
(the worker's side) get the same treatment: one statement locks the budget row and reads
the entry, its dataset and its analyst; compare-and-set UPDATEs move the status. Rows come
back as the small frozen records below.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import orjson
from django.db import connection

from ..models import AuditRecord, Budget, Dataset, Grant, LedgerEntry, Request


@dataclass(frozen=True)
class DatasetRow:
    pk: int
    name: str
    status: str
    budget_epsilon: float
    budget_delta: float
    policy: str
    allow_non_private: bool
    approx_delta_share: float = 0.1  # Dataset.approx_delta_share (the RDP filter's rule)


@dataclass(frozen=True)
class StateRow:
    pk: int
    state: dict


@dataclass(frozen=True)
class GrantRow:
    pk: int
    cap_epsilon: float | None
    cap_delta: float | None
    state: dict


def loads(value):
    return orjson.loads(value) if isinstance(value, (str, bytes)) else (value or {})


def dumps(value) -> str:
    return orjson.dumps(value).decode()


@functools.cache
def _sql_for(vendor: str) -> SimpleNamespace:
    pg = vendor == "postgresql"
    js = "::jsonb" if pg else ""
    budget, dataset = Budget._meta.db_table, Dataset._meta.db_table
    grant, entry = Grant._meta.db_table, LedgerEntry._meta.db_table
    request = Request._meta.db_table
    return SimpleNamespace(
        budget=(f"SELECT b.state, d.name, d.status, d.budget_epsilon, d.budget_delta, d.policy, d.allow_non_private, "
                f"d.approx_delta_share, b.committed, b.audit_seq, b.audit_head "
                f"FROM {budget} b JOIN {dataset} d ON d.id = b.dataset_id WHERE b.dataset_id = %s"
                + (" FOR UPDATE OF b FOR SHARE OF d" if pg else "")),  # SQLite: BEGIN IMMEDIATE: the write lock
        # The budget row and the analyst's active grant locked in one statement, in the
        # gate's order (FOR UPDATE OF b, g locks b first; a row updated meanwhile is re-read
        # at its newest version). Only the rows a statement locks are re-read: the dataset
        # row d is share-locked, after b, for its settings as committed once the wait is over
        # (an officer's change holds b's lock until it commits; read from the statement's
        # snapshot, taken before the wait, a budget cut meanwhile was not seen and a request
        # admitted past it). No row: no active grant (or no budget row), and the two
        # statements below tell which.
        budget_grant=(f"SELECT b.state, d.name, d.status, d.budget_epsilon, d.budget_delta, d.policy, "
                      f"d.allow_non_private, d.approx_delta_share, b.committed, b.audit_seq, b.audit_head, "
                      f"g.id, g.cap_epsilon, g.cap_delta, g.state "
                      f"FROM {budget} b JOIN {dataset} d ON d.id = b.dataset_id JOIN {grant} g "
                      f"ON g.dataset_id = b.dataset_id AND g.analyst_id = %s AND g.revoked_at IS NULL "
                      f"WHERE b.dataset_id = %s FOR UPDATE OF b, g FOR SHARE OF d") if pg else None,
        grant=(f"SELECT id, cap_epsilon, cap_delta, state FROM {grant} "
               f"WHERE dataset_id = %s AND analyst_id = %s AND revoked_at IS NULL LIMIT 1"
               + (" FOR UPDATE" if pg else "")),
        insert=(f"INSERT INTO {entry} (dataset_id, analyst_id, grant_id, reference, event, cost, charge, status, "
                f"created_at, non_private) VALUES (%s, %s, %s, %s, %s{js}, %s{js}, %s{js}, %s, %s, %s) RETURNING id"),
        update_budget=(f"UPDATE {budget} SET state = %s{js}, active_entries = active_entries + 1, "
                       f"updated_at = %s WHERE dataset_id = %s"),
        update_grant=f"UPDATE {grant} SET state = %s{js} WHERE id = %s",
        link_request=f"UPDATE {request} SET ledger_entry_id = %s WHERE id = %s",
        # Data-modifying CTEs (PostgreSQL): insert the entry, update both running states and
        # write the entry's id on its request row in one statement; a NULL grant (request)
        # id updates no grant (request) row.
        write_all=_write_all(f"UPDATE {request} SET ledger_entry_id = (SELECT id FROM e) WHERE id = %s::uuid")
        if pg else None,
        # The same with the request row inserted (a request without an Idempotency-Key:
        # nothing to wait for on its insert, so it can be written under the gate's lock).
        write_all_new=_write_all(_request_insert("SELECT {}, e.id FROM e")) if pg else None,
        insert_request=_request_insert("VALUES ({}, %s)"),
        # A refusal under the gate's lock (PostgreSQL): the request row inserted before the
        # gate deleted, the refusal's audit record and the chain head, in one statement.
        refuse=(f"WITH x AS (DELETE FROM {request} WHERE id = %s::uuid), "
                f"a AS ({_audit_insert('VALUES ({})')}), "
                f"h AS (UPDATE {budget} SET audit_seq = %s, audit_head = %s WHERE dataset_id = %s) "
                f"SELECT 1") if pg else None,
    )


def _write_all(request_part: str) -> str:
    """PostgreSQL, one data-modifying statement: insert the entry, update both running
    states, and ``request_part`` (the request row's link to the entry, or its insert); a
    NULL grant id updates no grant row."""
    budget, grant, entry = Budget._meta.db_table, Grant._meta.db_table, LedgerEntry._meta.db_table
    return (f"WITH e AS (INSERT INTO {entry} (dataset_id, analyst_id, grant_id, reference, event, cost, "
            f"charge, status, created_at, non_private) "
            f"VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb, %s, %s, %s) RETURNING id), "
            f"b AS (UPDATE {budget} SET state = %s::jsonb, active_entries = active_entries + 1, "
            f"updated_at = %s WHERE dataset_id = %s), "
            f"g AS (UPDATE {grant} SET state = %s::jsonb WHERE id = %s), "
            f"r AS ({request_part}) "
            f"SELECT id FROM e")


def _request_fields():
    """A new request row's columns but its ledger entry (the gate writes that one)."""
    return [f for f in Request._meta.concrete_fields if f.name != "ledger_entry"]


def _request_insert(source: str) -> str:
    """INSERT of a new request row (``request_values``' order, each parameter cast to its
    column's type on PostgreSQL), its ledger entry's id last, from ``source``: a VALUES or
    SELECT with ``{}`` for the values."""
    pg = connection.vendor == "postgresql"
    columns = ", ".join(f.column for f in _request_fields())
    values = ", ".join(f"%s::{f.cast_db_type(connection)}" if pg else "%s" for f in _request_fields())
    ledger_entry = Request._meta.get_field("ledger_entry").column
    return f"INSERT INTO {Request._meta.db_table} ({columns}, {ledger_entry}) " + source.format(values)


def request_values(req: Request) -> list:
    """An unsaved request's column values in ``_request_insert``'s order (as the ORM's
    insert computes them: ``pre_save`` fills ``created_at``)."""
    return [f.get_db_prep_save(f.pre_save(req, True), connection) for f in _request_fields()]


def saved(req: Request, entry_id: int | None) -> Request:
    """``req`` as the ORM's insert leaves it, once a statement here wrote it."""
    req.ledger_entry_id = entry_id
    req._state.adding, req._state.db = False, connection.alias
    return req


def insert_request(req: Request) -> Request:
    """Insert an unsaved request without its ledger entry (one written-out statement: the
    ORM's insert was ~0.9 ms of Python on every POST that carries an Idempotency-Key)."""
    with connection.cursor() as cur:
        cur.execute(admit_sql().insert_request, request_values(req) + [None])
    return saved(req, None)


def admit_sql() -> SimpleNamespace:
    return _sql_for(connection.vendor)


@dataclass(frozen=True)
class LockedEntry:
    """A ledger entry with its dataset's budget row locked (what commit and release need)."""

    pk: int
    status: str
    cost: dict
    event: dict
    charge: dict
    non_private: bool
    reference: str
    created_at: object
    analyst_id: int
    grant_id: int | None
    dataset_id: int
    state: dict
    committed: dict
    audit_seq: int
    audit_head: str
    dataset_name: str
    budget_delta: float
    username: str


@functools.cache
def _settle_sql_for(vendor: str) -> SimpleNamespace:
    from django.contrib.auth import get_user_model

    pg = vendor == "postgresql"
    js = "::jsonb" if pg else ""
    budget, dataset = Budget._meta.db_table, Dataset._meta.db_table
    grant, entry = Grant._meta.db_table, LedgerEntry._meta.db_table
    user_model = get_user_model()
    user, username = user_model._meta.db_table, user_model._meta.get_field(user_model.USERNAME_FIELD).column
    return SimpleNamespace(
        # The budget row is locked (PostgreSQL re-reads a locked row at its newest version),
        # then the dataset row share-locked for its delta as committed (see ``admit_sql``);
        # the entry's immutable columns come with them. Its status may be older than the lock:
        # the compare-and-set UPDATEs below decide (every status change holds this lock).
        lock=(f"SELECT e.status, e.cost, e.event, e.charge, e.non_private, e.reference, e.created_at, e.analyst_id, "
              f"e.grant_id, e.dataset_id, b.state, b.committed, b.audit_seq, b.audit_head, d.name, d.budget_delta, "
              f"u.{username} FROM {entry} e JOIN {budget} b ON b.dataset_id = e.dataset_id "
              f"JOIN {dataset} d ON d.id = e.dataset_id JOIN {user} u ON u.id = e.analyst_id WHERE e.id = %s"
              + (" FOR UPDATE OF b FOR SHARE OF d" if pg else "")),
        status=f"SELECT status FROM {entry} WHERE id = %s",
        grant=f"SELECT state FROM {grant} WHERE id = %s" + (" FOR UPDATE" if pg else ""),
        commit=(f"UPDATE {entry} SET status = %s, committed_at = %s, committed_event = %s{js}, "
                f"committed_cost = %s{js} WHERE id = %s AND status = %s"),
        release=f"UPDATE {entry} SET status = %s, released_at = %s WHERE id = %s AND status = %s",
        budget_state=(f"UPDATE {budget} SET state = %s{js}, active_entries = active_entries + %s, updated_at = %s "
                      f"WHERE dataset_id = %s"),
        grant_state=f"UPDATE {grant} SET state = %s{js} WHERE id = %s",
        # PostgreSQL: ``commit``, the audit record and the chain head in one statement; the
        # record and the head are written only when the compare-and-set moved the entry.
        commit_audited=(f"WITH c AS (UPDATE {entry} SET status = %s, committed_at = %s, committed_event = %s::jsonb, "
                        f"committed_cost = %s::jsonb WHERE id = %s AND status = %s RETURNING id), "
                        f"a AS ({_audit_insert('SELECT {} FROM c')}), "
                        f"h AS (UPDATE {budget} SET audit_seq = %s, audit_head = %s, committed = %s::jsonb "
                        f"WHERE dataset_id = %s AND EXISTS (SELECT 1 FROM c)) "
                        f"SELECT count(*) FROM c") if pg else None,
    )


def settle_sql() -> SimpleNamespace:
    return _settle_sql_for(connection.vendor)


def _audit_fields():
    return [f for f in AuditRecord._meta.concrete_fields if not f.primary_key]


def _audit_insert(source: str) -> str:
    """PostgreSQL: INSERT of one audit record (``audit_values``' order, each parameter cast
    to its column's type) from ``source``, a VALUES or SELECT with ``{}`` for the values."""
    columns = ", ".join(f.column for f in _audit_fields())
    values = ", ".join(f"%s::{f.cast_db_type(connection)}" for f in _audit_fields())
    return f"INSERT INTO {AuditRecord._meta.db_table} ({columns}) " + source.format(values)


def audit_values(rec: AuditRecord) -> list:
    """An unsaved audit record's column values, in ``commit_audited``'s order."""
    return [f.get_db_prep_save(getattr(rec, f.attname), connection) for f in _audit_fields()]


def head_values(head: dict, locked: LockedEntry) -> list:
    """The budget row's new chain head (``trail.prepare``) in ``commit_audited``'s order."""
    return [head["audit_seq"], head["audit_head"], dumps(head["committed"]), locked.dataset_id]


def aware(value):
    """A datetime read through a raw cursor, as the ORM would give it (aware, UTC)."""
    from datetime import UTC

    from django.utils.dateparse import parse_datetime

    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def lock_entry(cur, entry_id: int) -> LockedEntry | None:
    cur.execute(settle_sql().lock, [entry_id])
    row = cur.fetchone()
    return None if row is None else locked_entry(entry_id, row)


def locked_entry(entry_id: int, row) -> LockedEntry:
    """A row of ``settle_sql().lock`` as a record."""
    (status, cost, event, charge, non_private, reference, created_at, analyst_id, grant_id, dataset_id, state, committed,
     audit_seq, audit_head, name, delta, username) = row
    return LockedEntry(entry_id, status, loads(cost), loads(event), loads(charge), bool(non_private), reference, aware(created_at),
                       analyst_id, grant_id, dataset_id, loads(state), loads(committed), audit_seq, audit_head or "",
                       name, delta, username)
