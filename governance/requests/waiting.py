"""Waiting for a request's answer in the call that asks (``?wait=seconds``), not by polling.

The worker that finishes a request (``governance.requests.execution``) signals it after the commit:
with Redis (``REDIS_URL``) an entry pushed on a short-lived list per request, which a
waiting web thread takes with ``BLPOP``; the waiter then reads the row. Without Redis (the
embedded default) the waiter re-reads the row at growing intervals (5 ms to 100 ms).
Either way the row is the truth: a lost signal (a sweep finished the request, a web
restart) costs at most one ``SLICE`` of extra waiting, never a wrong answer.

The entry can carry the final state the worker just committed (``final_state``: the
request's outcome columns and its ledger entry's, under ``FINAL_STATE_MAX_BYTES``), so
that the POST that asked, which holds the rest of the row, answers without reading it
again (``apply_final_state``); a larger outcome, or a waiter without the row in hand,
reads the row. It is a copy of what was committed, pushed after the commit; it goes to
the thread serving the analyst's own POST, and the answer is rendered by the same
``request_json`` with the same rules (results to the analyst who asked only).

What is waited for is the row a worker wrote on a tick of the run's release clock, so a
long-poll reveals nothing a poll would not: it only saves the round trips.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time

import orjson
from django.conf import settings
from django.utils.dateparse import parse_datetime

log = logging.getLogger(__name__)
MAX_WAIT_SECONDS = 30.0  # the longest ?wait= a client may ask for (a web thread is held meanwhile)
SLICE = 0.5  # the longest a waiter trusts the signal before reading the row again
SIGNAL_TTL = 60  # seconds a signal nobody took stays in Redis
PREFIX = "governance:done:"


@functools.cache
def _redis(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=SLICE + 5, socket_connect_timeout=1)


def _client():
    return _redis(settings.REDIS_URL) if settings.REDIS_URL else None


def parse_wait(raw) -> float:
    """``?wait=`` as seconds in [0, MAX_WAIT_SECONDS]; raises ``InvalidRequest`` (400) otherwise."""
    from ..core.errors import InvalidRequest

    from ..datasets.budget import is_plain_number

    # ASCII digits only: float() also reads "1_0" (10) and other scripts' digits
    value = float(raw) if isinstance(raw, str) and is_plain_number(raw) else float("nan")
    if not 0 <= value <= MAX_WAIT_SECONDS:  # NaN fails too
        raise InvalidRequest(f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}.",
                             errors={"wait": f"a number from 0 to {MAX_WAIT_SECONDS:g}"})
    return value


FINAL_STATE_MAX_BYTES = 32 * 1024  # a larger final state is read from the row
REQUEST_COLUMNS = ("status", "progress", "result", "result_salt", "officer_report", "error")
REQUEST_TIMES = ("started_at", "finished_at")
ENTRY_COLUMNS = ("status", "committed_event", "committed_cost")
ENTRY_TIMES = ("committed_at", "released_at")


def final_state(req, entry=None) -> bytes | None:
    """What the worker committed for ``req`` (its outcome columns, and ``entry``'s after the
    commit or refund), for ``signal_done``; None if too large to push."""
    state = {k: getattr(req, k) for k in REQUEST_COLUMNS}
    state.update({k: _iso(getattr(req, k)) for k in REQUEST_TIMES})
    if entry is not None:
        state["entry"] = {k: getattr(entry, k) for k in ENTRY_COLUMNS}
        state["entry"].update({k: _iso(getattr(entry, k)) for k in ENTRY_TIMES})
    try:
        data = orjson.dumps(state)
    except orjson.JSONEncodeError:  # e.g. an integer past 64 bits in a result: the waiter reads the row
        return None
    return data if len(data) <= FINAL_STATE_MAX_BYTES else None


def apply_final_state(req, data: bytes):
    """``req`` (the POST's admitted request, with its ledger entry) with the final state
    ``data`` from ``final_state``; None if the state has no entry and ``req`` has one."""
    state = orjson.loads(data)
    if req.ledger_entry_id is not None and "entry" not in state:
        return None
    for k in REQUEST_COLUMNS:
        setattr(req, k, state[k])
    for k in REQUEST_TIMES:
        setattr(req, k, parse_datetime(state[k]) if state[k] else None)
    if "entry" in state and req.ledger_entry_id is not None:
        entry = req.ledger_entry
        for k in ENTRY_COLUMNS:
            setattr(entry, k, state["entry"][k])
        for k in ENTRY_TIMES:
            setattr(entry, k, parse_datetime(state["entry"][k]) if state["entry"][k] else None)
    return req


def _iso(value):
    return None if value is None else value.isoformat()


def signal_done(request_id, state: bytes | None = None) -> None:
    """Wake whoever waits for ``request_id`` (after the commit that finished it), with its
    committed final state (``final_state``) if given."""
    signal_done_many([(request_id, state)])


def signal_done_many(finished) -> None:
    """``signal_done`` for each (request id, state) in ``finished``, in one Redis round trip
    (a group of outcomes committed together)."""
    client = _client()
    if client is None or not finished:
        return
    pipe = client.pipeline(transaction=False)
    for request_id, state in finished:
        key = PREFIX + str(request_id)
        pipe.rpush(key, state or 1).expire(key, SIGNAL_TTL)
    try:
        pipe.execute()
    except Exception:  # noqa: BLE001 - a waiter falls back to reading the row
        log.warning("could not signal %d finished request(s), the first %s", len(finished), finished[0][0],
                    exc_info=True)


_waiting: dict = {}  # user id -> ?wait= calls this process holds for her now
_waiting_lock = threading.Lock()


@contextlib.contextmanager
def wait_slot(user_id):
    """Whether this call may wait (True at most ``WAITS_PER_ANALYST`` at once per user in
    this process): each wait holds a web thread, and one analyst's waits held them all."""
    limit = settings.WAITS_PER_ANALYST
    with _waiting_lock:
        granted = not limit or _waiting.get(user_id, 0) < limit
        if granted:
            _waiting[user_id] = _waiting.get(user_id, 0) + 1
    try:
        yield granted
    finally:
        if granted:
            with _waiting_lock:
                _waiting[user_id] -= 1
                if not _waiting[user_id]:
                    del _waiting[user_id]


def wait_final(request_id, seconds: float, fetch_final, from_state=None):
    """The request's row once ``fetch_final()`` returns it (the request is final), or None
    when ``seconds`` have passed. The caller has just seen the request not final, so with
    Redis the first read of the row comes after the first wake-up (a signal pushed before
    the wait began is still on its list); without Redis the row is read at once, then at
    growing intervals. A wake-up carrying the final state is given to ``from_state``
    (if any) instead of reading the row; its None reads the row."""
    deadline = time.monotonic() + seconds
    client = _client()
    interval = 0.005
    if client is None and (row := fetch_final()) is not None:
        return row
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if client is not None:
            try:
                # BLPOP's timeout is in seconds (float since Redis 6); 0 would block forever
                popped = client.blpop([PREFIX + str(request_id)], timeout=max(0.01, min(SLICE, left)))
                if popped and from_state is not None and popped[1] != b"1":
                    if (row := from_state(popped[1])) is not None:
                        return row
            except Exception:  # noqa: BLE001 - Redis restarting: read the row at intervals instead
                log.warning("waiting for request %s through Redis failed; polling the row", request_id, exc_info=True)
                client = None
        else:
            time.sleep(min(interval, left))
            interval = min(interval * 2, 0.1)
        if (row := fetch_final()) is not None:
            return row
