"""The Dask client and running a task graph on it.

``scheduler`` is a Dask scheduler address (``tcp://host:8786``) or ``""``: the graph then
runs on threads in the calling process (the embedded default needs no cluster). One
``distributed.Client`` per address and process, kept for the life of the process (a
Celery worker runs many requests).

Retries: Dask re-runs a task whose worker died, and ``retries`` more times a task that
raised. The tasks sent here are pure functions of a partition (exact partial aggregates);
they never draw released noise and never touch the ledger, so a re-run changes nothing
that is charged or released: the noise is drawn once, by the caller, from the gathered
result, and the host charges the request once (compare-and-set on its ledger entry).
"""

from __future__ import annotations

import threading

import dask

from engines.types import Cancelled

__all__ = ["client", "compute", "tree_reduce", "per_partition", "public_address", "submitted", "take_submitted"]

_clients: dict = {}
_lock = threading.Lock()
_sent = threading.local()  # the jobs this thread sent to a cluster (see take_submitted)
MAX_NOTED = 64
POLL_SECONDS = 0.25


def client(address: str):
    """The process's ``distributed.Client`` for ``address`` (connects on first use)."""
    from distributed import Client

    with _lock:
        c = _clients.get(address)
        if c is None or c.status not in ("running", "connecting"):
            c = _clients[address] = Client(address, set_as_default=False, timeout="30s")
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
    return fn(table.read_file(path), *args)


def _on_frame(frame, columns: list[str], fn, args):
    import pyarrow as pa

    return fn(pa.Table.from_pandas(frame[columns], preserve_index=False), *args)


def per_partition(table, fn, *args, unit: str | None = None) -> list:
    """One delayed ``fn(pyarrow.Table, *args)`` per partition of ``table`` (a
    ``PartitionedTable``): its files as they are or, with a ``unit`` column, the partitions
    of a shuffle on it (every row of a unit lands in one of them). ``fn`` may be re-run (a
    retry, a lost worker): it must release nothing and write nothing, only return what it
    computed from its partition; and it must be importable on the workers."""
    if not unit:
        return [dask.delayed(_on_file, pure=False)(table, p, fn, args) for p in table.paths]
    import dask.dataframe as dd

    columns = list(table.columns)
    frame = dd.read_parquet(list(table.paths), columns=columns, dtype_backend="pyarrow")
    shuffled = frame.shuffle(on=unit, npartitions=max(frame.npartitions, 1))
    return [dask.delayed(_on_frame, pure=False)(part, columns, fn, args) for part in shuffled.to_delayed()]


def tree_reduce(leaves: list, combine, fan_in: int = 8):
    """A delayed value combining ``leaves`` (delayed values) ``fan_in`` at a time, so no
    single task receives every partition's partial result."""
    level = list(leaves)
    if not level:
        raise ValueError("nothing to reduce")
    while len(level) > 1:
        level = [dask.delayed(combine, pure=True)(level[i:i + fan_in]) for i in range(0, len(level), fan_in)]
    return level[0]


def compute(value, scheduler: str, retries: int, progress=None, phase: str = "aggregating on the cluster"):
    """Compute one delayed value on ``scheduler`` (threads here when ``""``), reporting
    progress while it runs; a ``Cancelled`` raised by ``progress`` cancels the graph."""
    if not scheduler:
        if progress is not None:
            progress({"phase": phase, "fraction": 0.5})
        (out,) = dask.compute(value, scheduler="threads")
        return out
    c = client(scheduler)
    future = c.compute(value, retries=retries)
    submitted(scheduler, [future.key])
    try:
        while True:
            try:
                return future.result(timeout=POLL_SECONDS)
            except TimeoutError:
                # No elapsed time in the report: how long the cluster takes depends on the
                # data, and what the analyst sees of a run changes only on the run clock's
                # ticks (README, "Release-path side channels"). The call lets a
                # cancellation through.
                if progress is not None:
                    progress({"phase": phase, "fraction": 0.5})
    except Cancelled:
        future.cancel()
        raise
    finally:
        future.release()
