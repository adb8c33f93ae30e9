"""One consistent view of the database for a read of many statements.

``audit verify`` and the exports read a dataset's budget row, its ledger and its records
in separate statements. Under PostgreSQL's READ COMMITTED each statement sees the commits
made before it, and SQLite's autocommit reads likewise: a release committed between two of
them (its ledger entry, its record and the budget row's head, one transaction) showed as
"ledger entry N is reserved, the record says commit" or "records were added at the end",
and a sound chain was reported broken while releases were being written (a probe: 16 of 16
verifications during writes on PostgreSQL, 15 of 16 on SQLite).

``snapshot()`` runs its block as one REPEATABLE READ, READ ONLY transaction on PostgreSQL
(one snapshot, taken at its first query; no locks, writers go on), and as one deferred
read transaction on SQLite (WAL mode: the snapshot of its first read; writers go on). Inside
a transaction already (a test's, or a caller's) it adds nothing: that one's view holds.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from django.db import connection, transaction

_inside = threading.local()


@contextmanager
def snapshot():
    if getattr(_inside, "depth", 0) or connection.in_atomic_block:
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            yield
        finally:
            _inside.depth -= 1
        return
    _inside.depth = 1
    try:
        if connection.vendor == "postgresql":
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield
        elif connection.vendor == "sqlite":
            # Django's atomic() would BEGIN IMMEDIATE (settings: the gate's write lock); a
            # reader needs none: a plain deferred BEGIN on the connection, in autocommit mode
            connection.ensure_connection()
            with connection.cursor() as cur:
                cur.execute("BEGIN DEFERRED")
            try:
                yield
            finally:
                # (a generator reading inside it may be closed late, its connection closed and
                # the transaction gone: `audit export | head` did, and COMMIT raised)
                if connection.connection is not None and connection.connection.in_transaction:
                    with connection.cursor() as cur:
                        cur.execute("COMMIT")
        else:
            yield
    finally:
        _inside.depth = 0
