"""The gate's hot path as SQL: the statements ``ledger.admit`` runs, per database vendor.

The ORM's query building cost four times the database work on this path, so the lock,
the entry's insert and the running states' updates are written out here once per vendor
(PostgreSQL does the three writes in one data-modifying CTE). Rows come back as the small
frozen records below.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import orjson
from django.db import connection

from .models import Budget, Dataset, Grant, LedgerEntry


@dataclass(frozen=True)
class DatasetRow:
    pk: int
    name: str
    status: str
    budget_epsilon: float
    budget_delta: float
    policy: str
    allow_non_private: bool


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
    return SimpleNamespace(
        budget=(f"SELECT b.state, d.name, d.status, d.budget_epsilon, d.budget_delta, d.policy, d.allow_non_private "
                f"FROM {budget} b JOIN {dataset} d ON d.id = b.dataset_id WHERE b.dataset_id = %s"
                + (" FOR UPDATE OF b" if pg else "")),  # SQLite: BEGIN IMMEDIATE holds the write lock
        grant=(f"SELECT id, cap_epsilon, cap_delta, state FROM {grant} "
               f"WHERE dataset_id = %s AND analyst_id = %s AND revoked_at IS NULL LIMIT 1"
               + (" FOR UPDATE" if pg else "")),
        insert=(f"INSERT INTO {entry} (dataset_id, analyst_id, grant_id, reference, event, cost, charge, status, "
                f"created_at, non_private) VALUES (%s, %s, %s, %s, %s{js}, %s{js}, %s{js}, %s, %s, %s) RETURNING id"),
        update_budget=(f"UPDATE {budget} SET state = %s{js}, active_entries = active_entries + 1, "
                       f"updated_at = %s WHERE dataset_id = %s"),
        update_grant=f"UPDATE {grant} SET state = %s{js} WHERE id = %s",
        # Data-modifying CTEs (PostgreSQL): insert the entry and update both running states
        # in one statement; a NULL grant id updates no grant row.
        write_all=(f"WITH e AS (INSERT INTO {entry} (dataset_id, analyst_id, grant_id, reference, event, cost, "
                   f"charge, status, created_at, non_private) "
                   f"VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb, %s, %s, %s) "
                   f"RETURNING id), "
                   f"b AS (UPDATE {budget} SET state = %s::jsonb, active_entries = active_entries + 1, "
                   f"updated_at = %s WHERE dataset_id = %s), "
                   f"g AS (UPDATE {grant} SET state = %s::jsonb WHERE id = %s) "
                   f"SELECT id FROM e") if pg else None,
    )


def admit_sql() -> SimpleNamespace:
    return _sql_for(connection.vendor)
