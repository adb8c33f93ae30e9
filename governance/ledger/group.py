"""Group commit of the ledger: several reserved entries of one dataset committed under one
budget row lock, with their audit records chained in order (``governance.requests.outcomes``).

``ledger.commit`` holds the budget row for two statements per entry (the lock, then the
compare-and-set with its audit record and chain head), with the record hashed in Python
between them. ``commit_many`` holds it for two statements per *group* on PostgreSQL: one
locks the budget row and reads every entry (``ledger_sql`` ``lock``, for ``e.id = ANY``);
the records are prepared in order, each on the chain head the previous one left; one
data-modifying statement moves every entry ``reserved -> committed`` by compare-and-set,
inserts the records and advances the head, the last two only when every entry moved.

What it does not change: the same records as ``commit`` writes (the same ``trail.prepare``),
in the caller's transaction, under the budget row lock. An entry that is not ``reserved``
under the lock (a second delivery, the sweep) raises ``GroupConflict`` before anything is
written, and an entry that moved meanwhile makes the statement write no record: the caller
rolls its transaction back and commits the entries one by one (``ledger.commit`` knows
the rules for each case). Entries with an actual event (a refund) and refunds go through
``ledger.commit`` and ``ledger.release``; so does everything on SQLite, whose transaction
is itself the lock.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from django.db import connection
from django.utils import timezone

from accounting.costs import Cost

from ..models import AuditRecord, Budget, LedgerEntry
from . import actions as ledger, sql as ledger_sql, trail
from .limits import charge_summary


class GroupConflict(Exception):
    """An entry of the group was not reserved under the lock; commit them one by one."""


def commit_many(items: list[tuple[int, trail.Context]]) -> list[LedgerEntry]:
    """``reserved -> committed`` for each ``(entry id, audit context)``, all entries of one
    dataset, in the caller's transaction (see the module doc); the committed entries, in
    order."""
    if connection.vendor != "postgresql" or len(items) < 2:
        return [ledger.commit(entry_id, audit_ctx=ctx, savepoint=False) for entry_id, ctx in items]
    ids = [entry_id for entry_id, _ in items]
    with connection.cursor() as cur:
        cur.execute(_lock_sql(), [ids])
        locked = {row[0]: ledger_sql.locked_entry(row[0], row[1:]) for row in cur.fetchall()}
        if set(locked) != set(ids) or len(ids) != len(set(ids)) or any(
                e.status != LedgerEntry.Status.RESERVED for e in locked.values()) or len(
                {e.dataset_id for e in locked.values()}) != 1:
            raise GroupConflict(f"ledger entries {ids}: not all reserved entries of one dataset")
        first = locked[ids[0]]
        chain = SimpleNamespace(pk=first.dataset_id, committed=first.committed, audit_seq=first.audit_seq,
                                audit_head=first.audit_head)
        now = timezone.now()
        values, entries = [], []
        for entry_id, ctx in items:
            e = locked[entry_id]
            cost = Cost.from_json(e.cost)
            done = ledger._entry(e, status=LedgerEntry.Status.COMMITTED, committed_at=now)
            entries.append(done)
            rec, head = trail.prepare(chain, e.dataset_name, e.budget_delta, action="commit", actor=e.username,
                                      ctx=ctx or trail.Context(outcome="charged"), entry=done, event=e.event,
                                      charge=charge_summary(cost, e.budget_delta), committed_cost=cost,
                                      non_private=e.non_private)
            chain.committed, chain.audit_seq, chain.audit_head = (head["committed"], head["audit_seq"],
                                                                  head["audit_head"])
            values += ledger_sql.audit_values(rec)
        k = len(items)
        cur.execute(_commit_sql(k), [LedgerEntry.Status.COMMITTED, connection.ops.adapt_datetimefield_value(now), ids,
                                     LedgerEntry.Status.RESERVED] + values + [k, chain.audit_seq, chain.audit_head,
                                                                              ledger_sql.dumps(chain.committed),
                                                                              first.dataset_id, k])
        moved = cur.fetchone()[0]
    if moved != k:
        raise GroupConflict(f"ledger entries {ids}: {moved} of {k} moved; nothing recorded")
    return entries


@functools.cache
def _lock_sql() -> str:
    lock = ledger_sql.settle_sql().lock
    assert lock.startswith("SELECT ") and "WHERE e.id = %s" in lock
    return lock.replace("SELECT ", "SELECT e.id, ", 1).replace("WHERE e.id = %s", "WHERE e.id = ANY(%s)")


@functools.cache
def _commit_sql(k: int) -> str:
    fields = [f for f in AuditRecord._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(f.column for f in fields)
    row = "(" + ", ".join(f"%s::{f.cast_db_type(connection)}" for f in fields) + ")"
    entry, budget = LedgerEntry._meta.db_table, Budget._meta.db_table
    return (f"WITH c AS (UPDATE {entry} SET status = %s, committed_at = %s WHERE id = ANY(%s) AND status = %s "
            f"RETURNING id), "
            f"a AS (INSERT INTO {AuditRecord._meta.db_table} ({columns}) SELECT * FROM (VALUES "
            f"{', '.join([row] * k)}) v WHERE (SELECT count(*) FROM c) = %s), "
            f"h AS (UPDATE {budget} SET audit_seq = %s, audit_head = %s, committed = %s::jsonb "
            f"WHERE dataset_id = %s AND (SELECT count(*) FROM c) = %s) "
            f"SELECT count(*) FROM c")
