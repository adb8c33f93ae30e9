"""Outcomes written on their tick without holding a worker's task slot.

A run that read data shows its outcome on the next tick of its release clock
(``governance.requests.execution.RunClock``). Sleeping until that tick in the task would hold one
worker process per run for up to a quantum, capping a pool of N processes at N runs per
quantum (2 per second at the 1 s default, whatever the query costs). Instead the task
hands the outcome's write to this process's releaser, a thread that runs each write at its
tick, and returns. The next task's claim still waits for that tick
(``execution.execute``): a claim made the moment the engine finished showed the run's
exact duration to whoever's request came next. So a process runs at most one request per
quantum when its runs are shorter than one (runs that read no data, refusals and replays
do not wait); more processes or threads (``-c``) keep up the throughput, as they wait
idle. The run clocks' progress and heartbeat writes go
through it too, so that they use its one persistent database connection (a short-lived
thread's own connection is a new PostgreSQL backend each time).

Group commit: the outcome writes due when the thread wakes are handed over together and
written in one transaction (``governance.requests.outcomes.write_group``: one BEGIN/COMMIT and one
budget row lock per dataset for the group instead of per request); at quantum 0 a real
worker's task hands its outcome here too, so outcomes that finish while a group is being
written form the next group. Progress and heartbeat writes stay one by one.

What this does not change: the outcome is still written on a tick (never earlier); its
write is one transaction with the request row first, then the ledger's commit or refund
with its audit record. A process that dies with writes pending leaves those requests ``running``
with ``data_read`` set, as a process that died while sleeping did: the recovery sweep
finishes them as lost and charges the reservation in full. A worker shut down cleanly
runs its pending writes first (``drain``, connected to Celery's shutdown signals in
``workers.tasks``). The run's heartbeat stops when its task returns, so a wait longer
than half of ``REQUEST_LOST_AFTER_SECONDS`` (a quantum of a minute with a short grace
period) is still slept in the task, with the clock thread beating.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time

log = logging.getLogger(__name__)


class Releaser:
    def __init__(self):
        self.cv = threading.Condition()
        self.heap: list = []
        self.order = itertools.count()
        self.running = 0
        self.thread: threading.Thread | None = None

    def at(self, due: float, write, *, group=None) -> None:
        """Run ``write()`` at monotonic time ``due`` (at once if it has passed). With
        ``group`` (a function of a list of writes), the writes of that group that are due
        when the thread wakes are handed to it together instead, in the order they were
        due (group commit: ``governance.requests.outcomes.write_group``)."""
        with self.cv:
            heapq.heappush(self.heap, (due, next(self.order), write, group))
            if self.thread is None or not self.thread.is_alive():  # also after a fork
                self.thread = threading.Thread(target=self._loop, name="releaser", daemon=True)
                self.thread.start()
            self.cv.notify()

    def pending(self) -> int:
        with self.cv:
            return len(self.heap) + self.running

    def drain(self, timeout: float = 120.0) -> bool:
        """Wait until every pending write ran (ticks are not advanced); False on timeout."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.heap or self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("worker shutdown: %d outcome(s) not written; the recovery sweep will finish them",
                              len(self.heap) + self.running)
                    return False
                self.cv.wait(min(left, 0.05))
        return True

    def _loop(self):
        from django.db import close_old_connections

        while True:
            with self.cv:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cv.wait(None if not self.heap else self.heap[0][0] - time.monotonic())
                now = time.monotonic()
                due = []
                while self.heap and self.heap[0][0] <= now:  # every write due now, in due order
                    due.append(heapq.heappop(self.heap)[2:])
                self.running += len(due)
            try:
                close_old_connections()  # a connection broken since the last write is replaced
                self._run(due)
            finally:
                with self.cv:
                    self.running -= len(due)
                    self.cv.notify_all()

    @staticmethod
    def _run(due: list) -> None:
        """Lone writes one by one, then each group's writes in one call."""
        groups: dict = {}
        for write, group in due:
            if group is not None:
                groups.setdefault(group, []).append(write)
                continue
            try:
                write()
            except Exception:  # noqa: BLE001 - the request stays running; the sweep finishes it
                log.exception("writing a run's outcome failed; the recovery sweep will finish the request")
        for group, writes in groups.items():
            try:
                group(writes)
            except Exception:  # noqa: BLE001 - as above
                log.exception("writing %d outcomes failed; the recovery sweep will finish them", len(writes))


RELEASER = Releaser()
