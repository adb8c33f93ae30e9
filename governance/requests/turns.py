"""Whose request runs next: analysts take turns.

A request's message is a turn of its queue (``cpu`` or ``gpu``), not an order to run that
one request. The worker that takes a message runs the queued request of that queue whose
analyst has the fewest requests running on it, the analyst served least recently first
among equals, and her oldest request (``fairest``); the message's own request waits for a
later turn. Every message is one turn and every queued request was sent one, so each turn
runs a request or finds the queue empty: no request is left without a turn, and one
analyst's backlog (up to ``MAX_ACTIVE_REQUESTS``) no longer holds every other analyst's
request behind it (a probe's count waited 218 s behind 100 grouped quantiles, first in,
first out). A turn whose request ended meanwhile (cancelled, a second delivery) runs the
next one the same way. The sweep's re-sends (``recovery`` rule 2) are turns too: a queue
whose broker holds fewer messages than requests queued on it gets the difference, sent as
requests queued past ``REQUEST_REQUEUE_AFTER_SECONDS`` with no message of their own; a
turn more than requests queued changes nothing but an empty look.
"""

from __future__ import annotations

from django.db import connection

from engines import plugins

from ..models import Request


def queue_engines(engine: str) -> list[str] | None:
    """The engines served by ``engine``'s queue on this worker (None: ``engine`` unknown here)."""
    known = plugins.engines()
    if engine not in known:
        return None
    queue = known[engine].get("queue")
    return sorted(name for name, info in known.items() if info.get("queue") == queue)


def fairest(engines: list[str]) -> str | None:
    """The id of the queued request of ``engines`` to run next, or None when none is queued:
    among the analysts with one queued, the one with the fewest of them running, then the
    one served least recently (her last request's start, never first), then the one whose
    oldest queued request is oldest; her oldest. Without "least recently served" a worker
    between two runs sees nobody running, and the analyst with the oldest request, the one
    with the backlog, would win every turn. One statement: a pass over the queued and
    running rows (the status index) and one index step per waiting analyst."""
    table = Request._meta.db_table
    marks = ", ".join(["%s"] * len(engines))
    with connection.cursor() as cur:
        cur.execute(
            f"WITH busy AS (SELECT analyst_id, COUNT(*) AS n FROM {table} "
            f"              WHERE status = %s AND engine IN ({marks}) GROUP BY analyst_id), "
            f"waiting AS (SELECT analyst_id, MIN(created_at) AS first FROM {table} "
            f"            WHERE status = %s AND engine IN ({marks}) GROUP BY analyst_id), "
            f"turn AS (SELECT a.analyst_id FROM ("
            f"    SELECT w.analyst_id, w.first, COALESCE(b.n, 0) AS n, "
            f"           (SELECT MAX(s.started_at) FROM {table} s WHERE s.analyst_id = w.analyst_id) AS last "
            f"    FROM waiting w LEFT JOIN busy b ON b.analyst_id = w.analyst_id) a "
            f"  ORDER BY a.n, a.last IS NOT NULL, a.last, a.first, a.analyst_id LIMIT 1) "
            f"SELECT q.id FROM {table} q JOIN turn ON q.analyst_id = turn.analyst_id "
            f"WHERE q.status = %s AND q.engine IN ({marks}) ORDER BY q.created_at, q.id LIMIT 1",
            [Request.Status.RUNNING, *engines, Request.Status.QUEUED, *engines, Request.Status.QUEUED, *engines])
        row = cur.fetchone()
    return None if row is None else str(Request._meta.pk.to_python(row[0]))
