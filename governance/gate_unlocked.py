"""The gate without a lock held across round trips (PostgreSQL).

``ledger.admit`` locks the dataset's budget row and the analyst's grant, decides in
Python, writes, and holds both locks until its COMMIT: two round trips and the filter's
maths with the lock held. Under load on one dataset those holders queue behind each other
(and the workers' commits behind them), and a web thread that loses the CPU while holding
the lock stalls everyone (bench/README.md, "Request path").

``admit_unlocked`` decides on the same two rows read without a lock, then writes with one
statement (``ledger_sql.write_if_unchanged``) that locks both rows, checks that the
budget's and the grant's running states, the grant's caps and its being unrevoked are
still what was read, and only then inserts the entry and the request row and updates both
states; otherwise it writes nothing and the gate reads and decides again. So the decision
is ``admit``'s decision on the state it is written on (the filter's rule is a function of
that state and the dataset's budget, read in the same statement as ever), no lock outlives
the statement, and outside a transaction the admission needs no BEGIN or COMMIT.

It answers only the common case: an analyst with an active grant asking for a new request
(no Idempotency-Key) that the gate admits. Everything else returns None and goes through
``ledger.admit`` under the locks as before: SQLite, no grant, a refusal (written with its
audit record under the lock, after deciding again there), a dataset not active, or a
state that moved ``TRIES`` times in a row.
"""

from __future__ import annotations

from django.db import connection

from . import ledger, ledger_sql
from .models import Dataset, LedgerEntry, Request

TRIES = 3


def admit_unlocked(ds: Dataset, analyst, event, *, reference: str, new_request: Request) -> LedgerEntry | None:
    """Reserve ``event`` on ``ds`` for ``analyst`` and write ``new_request`` with its entry,
    or None (nothing written) when ``ledger.admit`` must decide."""
    sql = ledger_sql.admit_sql()
    if sql.write_if_unchanged is None:
        return None
    event = ledger.to_event(event)
    ledger.warm_caches(event)
    for _ in range(TRIES):
        with connection.cursor() as cur:
            cur.execute(sql.budget_grant_read, [analyst.pk, ds.pk])
            row = cur.fetchone()
            if row is None:  # no active grant: admit tells why
                return None
            state, b_delta, (g_id, g_cap_eps, g_cap_delta, g_state) = row[0], row[4], row[11:]
            try:
                grant, stamped, cost, limits = ledger.decide(ds.pk, analyst, event, row)
            except ledger.GATE_REFUSALS:
                return None  # refused on what was read: decided again (and recorded) under the lock
            now, fields, entry_row, budget_row, grant_row = ledger.writes(ds.pk, analyst, grant, stamped, cost, limits,
                                                                          b_delta, reference)
            cur.execute(sql.write_if_unchanged, [g_id, g_state, g_cap_eps, g_cap_delta, ds.pk, state] + entry_row
                        + budget_row + grant_row + ledger_sql.request_values(new_request))
            written = cur.fetchone()
        if written is not None:
            ledger_sql.saved(new_request, written[0])
            return LedgerEntry(id=written[0], dataset_id=ds.pk, analyst=analyst, grant_id=g_id, reference=reference[:200],
                               status=LedgerEntry.Status.RESERVED, created_at=now, **fields)
    return None
