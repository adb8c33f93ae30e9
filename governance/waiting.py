"""Waiting for a request's answer in the call that asks (``?wait=seconds``), not by polling.

The worker that finishes a request (``governance.execution._finish``) signals it after the
commit: with Redis (``REDIS_URL``) an entry pushed on a short-lived list per request, which
a waiting web thread takes with ``BLPOP``; the waiter then reads the row. Without Redis
(the embedded default) the waiter re-reads the row at growing intervals (5 ms to 100 ms).
Either way the row is the truth: a lost signal (a sweep finished the request, a web
restart) costs at most one ``SLICE`` of extra waiting, never a wrong answer.

What is waited for is the row a worker wrote on a tick of the run's release clock, so a
long-poll reveals nothing a poll would not: it only saves the round trips.
"""

from __future__ import annotations

import functools
import logging
import time

from django.conf import settings

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
    from .errors import InvalidRequest

    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 <= value <= MAX_WAIT_SECONDS:  # NaN fails too
        raise InvalidRequest(f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}.",
                             errors={"wait": f"a number from 0 to {MAX_WAIT_SECONDS:g}"})
    return value


def signal_done(request_id) -> None:
    """Wake whoever waits for ``request_id`` (after the commit that finished it)."""
    client = _client()
    if client is None:
        return
    key = PREFIX + str(request_id)
    try:
        client.pipeline(transaction=False).rpush(key, 1).expire(key, SIGNAL_TTL).execute()
    except Exception:  # noqa: BLE001 - a waiter falls back to reading the row
        log.warning("could not signal request %s finished", request_id, exc_info=True)


def wait_final(request_id, seconds: float, fetch_final):
    """The request's row once ``fetch_final()`` returns it (the request is final), or None
    when ``seconds`` have passed. The caller has just seen the request not final, so with
    Redis the first read of the row comes after the first wake-up (a signal pushed before
    the wait began is still on its list); without Redis the row is read at once, then at
    growing intervals."""
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
                client.blpop([PREFIX + str(request_id)], timeout=max(0.01, min(SLICE, left)))
            except Exception:  # noqa: BLE001 - Redis restarting: read the row at intervals instead
                log.warning("waiting for request %s through Redis failed; polling the row", request_id, exc_info=True)
                client = None
        else:
            time.sleep(min(interval, left))
            interval = min(interval * 2, 0.1)
        if (row := fetch_final()) is not None:
            return row
