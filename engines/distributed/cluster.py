"""The Dask client and running a task graph on it.

``scheduler`` is a Dask scheduler address (``tcp://host:8786``) or ``""``: the graph then
runs on threads in the calling process (the embedded default needs no cluster). One
``distributed.Client`` per address and process, kept for the life of the process (a
Celery worker runs many requests).

Retries: Dask re-runs a task whose worker died, and ``retries`` more times a task that
raised. The tasks sent here are pure functions of a partition or of a unit bucket's
pieces (``by_unit``; exact partial aggregates); they write no file;
they never draw released noise and never touch the ledger, so a re-run changes nothing
that is charged or released: the noise is drawn once, by the caller, from the gathered
result, and the host charges the request once (compare-and-set on its ledger entry).

A file's task and a unit bucket's task run inside ``heap.kept()``: their large temporary
arrays reuse freed heap pages instead of faulting in fresh ones (heap.py).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import dask

from engines.types import Cancelled, EngineError

from . import heap

__all__ = ["ClusterUnavailable", "client", "compute", "lost", "tree_reduce", "per_partition", "by_unit",
           "buckets_for", "id_span", "public_address", "submitted", "take_submitted"]

_clients: dict = {}
_lock = threading.Lock()
_sent = threading.local()  # the jobs this thread sent to a cluster (see take_submitted)
MAX_NOTED = 64
MAX_BUCKETS = 128
MIN_BUCKET_ROWS = 2_000  # a bucket per this many rows at most (see buckets_for)
POLL_SECONDS = 0.25
CONNECT_SECONDS = 30  # a scheduler that does not answer within this is out of reach
WAIT_FOR_WORKER_SECONDS = 30.0  # a graph is sent once the cluster has a worker, waited for this long
NO_WORKER_SECONDS = 60.0  # a graph under way on a cluster left without a worker this long fails
FROZEN_WORKER_SECONDS = 60.0  # a graph under way with a worker whose heartbeat stood still this long fails
WORKER_CHECK_SECONDS = 5.0  # how often a graph under way asks the scheduler for its workers
SCHEDULER_ANSWER_SECONDS = 5.0  # a question to the scheduler unanswered this long: TimeoutError


#: distributed's scheduler's message when it cannot deserialize a graph (scheduler.update_graph)
GRAPH_REFUSED = "Error during deserialization of the task graph"


class ClusterUnavailable(EngineError):
    """The scheduler could not be reached, or had no worker: before this run sent the
    cluster anything, ``nothing_read`` (the host refunds); a graph under way whose cluster
    lost every worker for ``NO_WORKER_SECONDS`` is not (its tasks may have read rows)."""

    def __init__(self, message: str, nothing_read: bool):
        super().__init__(message)
        self.nothing_read = nothing_read


def lost(e: BaseException) -> bool:
    """``e`` says the cluster is unavailable, not that the data is wrong: ``ClusterUnavailable``,
    or distributed's own for a scheduler or a connection lost mid-graph (a graph cancelled
    with the scheduler, a closed comm, a timeout)."""
    from distributed.comm.core import CommClosedError

    return isinstance(e, (ClusterUnavailable, CommClosedError, TimeoutError, ConnectionError,
                          concurrent.futures.CancelledError))


def _ready_client(scheduler: str):
    """The client, once the scheduler answers and has a running worker: a cluster down
    failed the run after it was charged (nothing read), one without a worker waited for
    ever, and one whose only workers were paused by their memory monitors (they run no
    task) failed each run after NO_WORKER_SECONDS, charged, with no task run (a probe)."""
    nothing_sent = not getattr(_sent, "jobs", None)
    try:
        c = client(scheduler)
        deadline = time.monotonic() + WAIT_FOR_WORKER_SECONDS
        while not _working(workers := scheduler_info(c).get("workers")):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no running worker" + (" (every one paused by its memory monitor)"
                                                          if workers else ""))
            if workers:
                time.sleep(min(1.0, left))
            else:
                c.wait_for_workers(1, timeout=left)
    except ClusterUnavailable:  # (client: workers without the engine's code)
        raise
    except Exception as e:  # noqa: BLE001 - unreachable, refused, timed out: the cluster's state
        raise ClusterUnavailable(
            f"the Dask cluster could not be reached or had no running worker within {WAIT_FOR_WORKER_SECONDS:g} s "
            f"({type(e).__name__}{': ' + str(e) if isinstance(e, TimeoutError) and str(e) else ''})"
            + ("; nothing was sent to it" if nothing_sent else ""),
            nothing_read=nothing_sent) from None
    return c


def client(address: str):
    """The process's ``distributed.Client`` for ``address`` (connects on first use), with
    ``NoSpill`` on every worker of the cluster, those joining later too."""
    from distributed import Client

    from .no_spill import NoSpill

    with _lock:
        c = _clients.get(address)
        if c is None or c.status not in ("running", "connecting"):
            c = Client(address, set_as_default=False, timeout=f"{CONNECT_SECONDS}s")
            try:  # (register_plugin's own call waits for ever on a scheduler frozen since: scheduler_info)
                c.sync(c._register_worker_plugin, plugin=NoSpill(), name=NoSpill.name, idempotent=True,
                       callback_timeout=CONNECT_SECONDS)
            except BaseException as e:
                c.close(timeout=1)
                if lost(e) or not isinstance(e, Exception):
                    raise
                # a worker that cannot load the plugin cannot run the engine's tasks either
                raise ClusterUnavailable(f"the Dask workers could not load the engine's code ({type(e).__name__}: "
                                         f"{str(e)[:200]}): the same code and packages must be installed on the "
                                         "scheduler and its workers; nothing was sent", nothing_read=True) from None
            _clients[address] = c
        return c


def public_address(address: str) -> str:
    """A scheduler address fit for a report or an audit record: any user name, password,
    query or fragment removed (``tls://user:secret@host:8786?x`` -> ``tls://host:8786``)."""
    from urllib.parse import urlsplit, urlunsplit

    if "://" not in address:
        return address
    try:
        parts = urlsplit(address)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return address.split("://", 1)[0] + "://(unparsable address)"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + (f":{port}" if port else ""), parts.path, "", ""))


def submitted(scheduler: str, keys: list, job: str = "") -> None:
    """Note that this thread sent ``keys`` to ``scheduler``: the host names the cluster job
    in the run's audit record whatever the run's outcome (``take_submitted``)."""
    jobs = getattr(_sent, "jobs", None)
    if jobs is None:
        jobs = _sent.jobs = []
    jobs.append({"backend": "dask", "scheduler": public_address(scheduler), "keys": [str(k) for k in keys],
                 **({"job": job} if job else {})})
    del jobs[:-MAX_NOTED]  # a thread nobody takes from (the web's registrations) keeps the last few


def take_submitted() -> dict | None:
    """The jobs this thread sent since the last call, merged (``{"backend", "scheduler",
    "keys", "job"?}``), or None; forgets them."""
    jobs, _sent.jobs = getattr(_sent, "jobs", None) or [], []
    if not jobs:
        return None
    return {**jobs[0], "keys": [k for j in jobs for k in j["keys"]]}


def _on_file(table, path: str, fn, args):
    with heap.kept():
        return fn(table.read_file(path), *args)


def per_partition(table, fn, *args) -> list:
    """One delayed ``fn(pyarrow.Table, *args)`` per file of ``table`` (a
    ``PartitionedTable``). ``fn`` may be re-run (a retry, a lost worker): it must release
    nothing and write nothing, only return what it computed from its partition; and it must
    be importable on the workers."""
    return [dask.delayed(_on_file, pure=False)(table.one(i), p, fn, args) for i, p in enumerate(table.paths)]


def buckets_for(table) -> int:
    """How many unit buckets ``by_unit`` deals a table's rows into: one per file, at most
    ``MAX_BUCKETS`` (each bucket task holds ~rows / buckets rows) and at most one per
    ``MIN_BUCKET_ROWS`` rows: every file sends a piece to every bucket, so many small files
    made files x buckets pieces (100 files of 200 rows: 10,000 pieces, 17 s for a query the
    local engine answers in 0.07 s; a helper's probe)."""
    return max(1, min(len(table.paths), MAX_BUCKETS, -(-table.num_rows // MIN_BUCKET_ROWS)))


def _split(table, path: str, unit: str, buckets: int, pre, pre_args, ranges=None) -> tuple:
    """One file's rows dealt into ``buckets`` pieces by their unit id (``_bucket_of``: the
    same rule in every file, so all of a unit's rows go to the same bucket)."""
    with heap.kept():
        return _deal(table.read_file(path), unit, buckets, pre, pre_args, ranges)


def _deal(data, unit: str, buckets: int, pre, pre_args, ranges) -> tuple:
    import numpy as np
    import pyarrow as pa

    mask = None
    if pre is not None:
        data, mask = pre(data, *pre_args)
    if buckets == 1:
        return (data if mask is None else data.filter(pa.array(mask)),)
    which = _bucket_of(data.column(unit), buckets, ranges)
    if mask is not None:
        which[~mask] = buckets  # rows no bucket gets: sorted last, never taken
    order = np.argsort(which, kind="stable")  # a radix sort on 8 bits
    cuts = np.concatenate(([0], np.cumsum(np.bincount(which, minlength=buckets + 1))))
    order = order[:cuts[buckets]]
    # One gather, then zero-copy slices: a slice sent to another worker is serialised
    # alone (Arrow IPC writes only its range), one kept here shares the gathered buffers.
    dealt = data.take(pa.array(order))
    return tuple(dealt.slice(int(cuts[b]), int(cuts[b + 1] - cuts[b])) for b in range(buckets))


def id_span(table, unit: str) -> tuple[int, int] | None:
    """(min, max) of the unit ids from the files' footers when they are integers in a
    compact range (under 4 ids per row: ``units.compact``), else None. The ranges are
    those the manifest check read from the same footers when known (``ranges_of``).
    Callers use it to spread work, never to drop an id outside it."""
    from engines.aggregates.units import compact

    from .source import span as span_of

    span = span_of(table.ranges_of(unit))
    if span is None or span[0] < -(2**63) or span[1] >= 2**63 or not compact(*span, table.num_rows):
        return None
    return span


def _id_ranges(table, unit: str, buckets: int) -> tuple[int, int] | None:
    """``(lo, width)`` of range buckets (bucket b: ids in [lo + b * width, lo + (b + 1) *
    width)), when the unit ids are integers in a compact range (``id_span``: each bucket
    then codes its units by ``id - min`` and counts them in an array of about rows /
    buckets slots, where hashed buckets span the whole range); else None (hashed
    buckets)."""
    span = id_span(table, unit)
    if span is None:
        return None
    return span[0], (span[1] - span[0]) // buckets + 1


def _bucket_of(col, buckets: int, ranges=None):
    """Each row's bucket (uint8; MAX_BUCKETS <= 256), a function of its unit id only.
    ``ranges`` (``_id_ranges``): the id's range bucket (an id outside the footers' range, or
    a null, still has exactly one: the last bucket below and above the range, the first
    for a null). Else integer ids: the top byte of a Fibonacci hash (one multiplication:
    the bucket needs spread, not the full mix ``unit_hash`` gives, which costs seven
    passes over the column); anything else ``unit_hash``."""
    import numpy as np

    from engines.aggregates.units import integer_ids, unit_hash

    if ranges is not None and (ids := integer_ids(col, null=ranges[0])) is not None:
        lo, width = ranges
        with np.errstate(over="ignore"):
            which = (ids - np.int64(lo)).view(np.uint64)  # below lo: past 2**63, the last bucket
        which //= np.uint64(width)
        np.minimum(which, np.uint64(buckets - 1), out=which)
        return which.astype(np.uint8)
    if (ids := integer_ids(col)) is not None:  # by type: every file deals a unit to the same bucket
        with np.errstate(over="ignore"):
            top = ids.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        top >>= np.uint64(56)
        return (np.arange(256) % buckets).astype(np.uint8)[top.astype(np.uint8)]
    return (unit_hash(col) % np.uint64(buckets)).astype(np.uint8)


def _bucket(pieces: list, fn, args):
    import pyarrow as pa

    with heap.kept():
        return fn(pa.concat_tables(pieces) if len(pieces) != 1 else pieces[0], *args)


def by_unit(table, unit: str, fn, *args, pre=None, pre_args: tuple = (), buckets: int | None = None) -> list:
    """One delayed ``fn(pyarrow.Table, *args)`` per unit bucket: a table holding every row
    (of ``table``'s planned columns) of the privacy units whose id falls in the bucket
    (``_bucket_of``: a range of a compact integer id, else a hash), wherever they are
    stored. No shuffle service, no disk: each file's task deals its rows into pieces
    (``pre(table, *pre_args)`` first: the columns to deal and a mask of the rows to deal,
    or None for all of them), each bucket's task receives its piece of every file as an
    ordinary task result, in memory, from whichever worker holds it. Every task is a pure
    function of its inputs, so a task re-run after a retry or a lost worker computes the
    same pieces, and a bucket either gets every piece or does not run: the answer is
    exact or the run fails, on workers that share no disk as on one machine. Nothing is
    written to disk (unless a worker is configured to spill memory: deploy/README.md)."""
    n = buckets or buckets_for(table)
    ranges = _id_ranges(table, unit, n) if n > 1 else None
    splits = [dask.delayed(_split, pure=False, nout=n)(table.one(i), p, unit, n, pre, pre_args, ranges)
              for i, p in enumerate(table.paths)]
    return [dask.delayed(_bucket, pure=False)([s[b] for s in splits], fn, args) for b in range(n)]


def tree_reduce(leaves: list, combine, fan_in: int = 8, finish=None):
    """A delayed value combining ``leaves`` (delayed values) ``fan_in`` at a time, so no
    single task receives every partition's partial result; ``finish`` (if given) combines
    the last ``fan_in`` or fewer into the answer, in the same task."""
    level = list(leaves)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > (fan_in if finish is not None else 1):
        level = [dask.delayed(combine, pure=True)(level[i:i + fan_in]) for i in range(0, len(level), fan_in)]
    return level[0] if finish is None else dask.delayed(finish, pure=True)(level)


def scheduler_info(c, n_workers: int = -1) -> dict:
    """``c.scheduler_info(n_workers)``, a ``TimeoutError`` once the scheduler has not answered
    for ``SCHEDULER_ANSWER_SECONDS``: distributed's own call waits for ever on a scheduler
    whose connection stays open while it does not answer (a frozen process, a paused host).
    A probe's run then heard no cancel and no lost cluster for as long as the scheduler was
    frozen, and a registration's POST held its web thread as long."""
    return dict(c.sync(c.scheduler.identity, n_workers=n_workers, callback_timeout=SCHEDULER_ANSWER_SECONDS))


def _workers(c) -> dict | None:
    """The scheduler's workers (address -> identity), None when it does not answer."""
    try:
        return scheduler_info(c).get("workers") or {}
    except (TimeoutError, OSError):
        return None


def _working(workers: dict | None) -> bool:
    """Whether the cluster has a worker that runs tasks: one paused by Dask's memory monitor
    runs none until its memory falls (a probe's two workers paused for good, and the run
    waited on them, its reservation held, until the 3 h time limit). A scheduler that does
    not answer has none either."""
    return any(w.get("status", "running") == "running" for w in (workers or {}).values())


class _Heartbeats:
    """Each worker's last heartbeat as the scheduler saw it (``last_seen``, in the
    scheduler's clock), watched on this process's monotonic clock: a worker whose heartbeat
    stood still for ``FROZEN_WORKER_SECONDS`` is frozen (a stopped process, a paused host).
    Its status stays "running" and its tasks never end: a probe's run with one of two
    workers stopped (SIGSTOP) waited more than 9 minutes, and only the 3 h time limit would
    have ended it. No clock is shared with the scheduler: only whether the value changed."""

    def __init__(self):
        self.seen: dict[str, tuple[float, float]] = {}  # address -> (last_seen, first looked at)

    def frozen(self, workers: dict | None, now: float) -> str | None:
        """The address of a worker frozen by ``now`` (None: none, or no answer to judge by)."""
        if workers is None:
            return None
        seen = {}
        for address, w in workers.items():
            beat = w.get("last_seen")
            if beat is None:
                continue  # (a scheduler that does not say: nothing to judge by)
            old = self.seen.get(address)
            seen[address] = (beat, old[1] if old and old[0] == beat else now)
        self.seen = seen
        return next((a for a, (_, since) in seen.items() if now - since > FROZEN_WORKER_SECONDS), None)


def compute(value, scheduler: str, retries: int, progress=None, phase: str = "aggregating on the cluster"):
    """Compute one delayed value on ``scheduler`` (threads here when ``""``), reporting
    progress while it runs; a ``Cancelled`` raised by ``progress`` cancels the graph."""
    if not scheduler:
        if progress is not None:
            progress({"phase": phase, "fraction": 0.5})
        (out,) = dask.compute(value, scheduler="threads")
        return out
    c = _ready_client(scheduler)
    first = not getattr(_sent, "jobs", None)  # the run's first graph: none of its tasks ran before
    future = c.compute(value, retries=retries)
    submitted(scheduler, [future.key])
    try:
        # Waited for with a done-callback and an Event, then one result() without a
        # timeout: distributed's result(timeout=...) can lose a race between its own
        # timeout and the answer under load and raise UnboundLocalError (its sync() catches
        # Exception, not the CancelledError its wait_for leaves), which failed a run that
        # had succeeded. The Event returns as soon as the graph is done (a sleep between
        # polls of done() added up to POLL_SECONDS to every run).
        finished = threading.Event()
        future.add_done_callback(lambda _: finished.set())
        alone_since, looked, beats = None, time.monotonic(), _Heartbeats()
        while not finished.wait(POLL_SECONDS):
            if time.monotonic() - looked >= WORKER_CHECK_SECONDS:
                looked, workers = time.monotonic(), _workers(c)
                if frozen := beats.frozen(workers, looked):
                    raise ClusterUnavailable(f"the Dask worker {frozen} sent no heartbeat for {FROZEN_WORKER_SECONDS:g} s "
                                             "(a stopped process or a paused host) while the run's graph was under "
                                             "way", nothing_read=False)
                if _working(workers):
                    alone_since = None
                elif looked - (alone_since := alone_since or looked) > NO_WORKER_SECONDS:
                    raise ClusterUnavailable(f"the Dask cluster had no running worker (none, or every one paused "
                                             f"by its memory monitor, or a scheduler that did not answer) for "
                                             f"{NO_WORKER_SECONDS:g} s while the run's "
                                             "graph was under way", nothing_read=False)
            # No elapsed time in the report: how long the cluster takes depends on the
            # data, and what the analyst sees of a run changes only on the run clock's
            # ticks (README, "Release-path side channels"). The call lets a
            # cancellation through.
            if progress is not None:
                progress({"phase": phase, "fraction": 0.5})
        try:
            return future.result()
        except RuntimeError as e:
            if GRAPH_REFUSED not in str(e):
                raise
            # the scheduler could not unpickle the graph (an environment without this
            # code, or with other versions): no task of it was created, none ran
            raise ClusterUnavailable("the Dask scheduler could not read the run's graph (its Python environment "
                                     "differs from this worker's: the same code and packages must be installed on "
                                     "the scheduler and its workers)" + ("; nothing was read" if first else ""),
                                     nothing_read=first) from None
    except (Cancelled, ClusterUnavailable):
        future.cancel()
        raise
    finally:
        future.release()
