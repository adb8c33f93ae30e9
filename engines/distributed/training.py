"""DP-SGD on the Dask cluster: data-parallel training, one rank per Dask worker.

The Celery worker that drives the request (the driver) picks ``ranks`` Dask workers
(the request's ``ranks``, at most the cluster's workers) and submits one long task to
each, pinned to it (``workers=[...]``, no retries: a rank re-run alone could not rejoin
its group). The ranks rendezvous by themselves: rank 0 serves a ``torch.distributed``
``TCPStore`` on its worker's host, on a port the OS picks, and hands ``host:port`` to the
others through a Dask ``Variable`` named after the job; they form a gloo group (NCCL on
CUDA) and train with ``engines.dpsgd.parallel``: every rank Poisson-samples its own units
at the plan's rate, rank 0 alone adds the noise, the sums are all-reduced and divided by
the global expected batch. The plan does not know the number of ranks: its event is that
of one process at the same global sample rate.

Which rows a rank holds: with a privacy-unit column, every rank reads the planned columns
of every partition and keeps the units whose id hashes to it (``pandas.util.hash_array``,
the same on every process), so a unit's rows, wherever they are stored, meet on one rank
and its contribution is clipped whole; this reads the table ``ranks`` times (a shuffle on
the cluster would read it once but leave the pieces on other workers). Without a unit
column each row is its own unit and rank r reads the files r, r + ranks, ...

Progress and cancellation: rank 0 puts the trainer's progress into a Dask ``Variable``
the driver polls (and reports through the host's ``progress``); a cancellation sets a Dask
``Event`` that rank 0 reads at the same steps the ranks agree on (an all-reduce of the
flag), so all ranks stop after the same step and the steps taken are charged.

Rank 0 sends back the trained replicas (models, histories, the steps and evaluations
spent), never rows; the driver writes the files and builds the release as a
single-process run does (``engines.dpsgd.execute.finish``).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa

from engines.types import Cancelled, DatasetMeta, EngineError, EngineRequest, Plan, Release

from . import cluster
from .source import PartitionedTable

__all__ = ["execute", "rank_rows", "ranks_for"]

RENDEZVOUS_SECONDS = 120.0  # a rank waits this long for rank 0's address
COLLECTIVE_SECONDS = 600.0  # a collective waits this long for a rank (a dead rank fails the others)
CANCEL_GRACE_SECONDS = 120.0


def rank_rows(table: PartitionedTable, rank: int, size: int) -> pa.Table:
    """The rows rank ``rank`` of ``size`` trains on: whole units (see the module's docstring)."""
    import pandas as pd

    if not table.unit_column:
        parts = [table.read_file(p) for p in table.paths[rank::size]]
    else:
        parts = []
        for path in table.paths:
            t = table.read_file(path)
            units = t.column(table.unit_column).to_numpy(zero_copy_only=False)
            mine = pd.util.hash_array(np.asarray(units)) % np.uint64(size) == np.uint64(rank)
            parts.append(t.filter(pa.array(mine)))
    if not parts:
        return table.read_file(table.paths[0]).slice(0, 0)
    return pa.concat_tables(parts)


def _rank_main(table: PartitionedTable, rank: int, size: int, job: str, d: dict) -> dict:
    """One rank's training (a Dask task on its pinned worker)."""
    import torch
    from distributed import Event, Variable, get_worker

    from engines.dpsgd import parallel
    from engines.dpsgd.execute import train_runs
    from engines.dpsgd.params import Spec
    from engines.dpsgd.train import device, prepare, secure_generator

    spec = Spec.from_dict(d["spec"])
    dev = device()
    worker = get_worker()
    torch.set_num_threads(max(1, worker.state.nthreads))  # the worker's share of cores, not every core
    address = Variable(f"{job}-rendezvous")
    if rank == 0:
        host = urlparse(worker.address).hostname
        group = parallel.connect(0, size, host, None, dev, publish=lambda port: address.set(f"{host}:{port}"),
                                 timeout_s=COLLECTIVE_SECONDS)
    else:
        host, port = address.get(timeout=RENDEZVOUS_SECONDS).rsplit(":", 1)
        group = parallel.connect(rank, size, host, int(port), dev, timeout_s=COLLECTIVE_SECONDS)
    prep = prepare(rank_rows(table, rank, size), spec, secure_generator(torch.device("cpu")), dev,
                   canaries=None if rank == 0 else 0)
    stop, report = Event(f"{job}-stop"), Variable(f"{job}-progress")

    def progress(info: dict) -> None:  # called at the same steps on every rank
        if rank == 0:
            report.set(info)
        if group.any(rank == 0 and stop.is_set()):
            raise Cancelled("the request was cancelled")

    try:
        trainers, outcomes = train_runs(spec, d, prep, secure_generator(dev), progress, group)
    except Cancelled as c:
        return {"rank": rank, "cancelled": c.actual_event}
    if rank:
        return {"rank": rank, "steps": [t.steps for t in trainers]}
    return {"rank": 0, "trainers": [t.detached() for t in trainers], "outcomes": outcomes, "device": dev.type}


def ranks_for(requested: int, scheduler: str) -> list[str]:
    """The Dask workers the ranks run on: ``requested`` of them at most, in a stable order."""
    if requested <= 1 or not scheduler:
        return []
    workers = sorted(cluster.client(scheduler).scheduler_info(n_workers=-1)["workers"])
    return workers[:requested] if len(workers) > 1 else []


def _gather(futures: list, progress, stop, report) -> list[dict]:
    """The ranks' results, reporting rank 0's progress meanwhile; a cancellation sets
    ``stop``, waits for the ranks to agree on it and raises with the steps they took."""
    while True:
        if all(f.done() for f in futures):
            return [f.result() for f in futures]  # a rank that raised raises here
        failed = [f for f in futures if f.status == "error"]
        if failed:
            failed[0].result()
        time.sleep(cluster.POLL_SECONDS)
        try:
            progress(report.get(timeout=10))
        except Cancelled:
            stop.set()
            deadline = time.monotonic() + CANCEL_GRACE_SECONDS
            while not all(f.done() for f in futures) and time.monotonic() < deadline:
                time.sleep(cluster.POLL_SECONDS)
            out = [f.result() for f in futures if f.done() and f.status == "finished"]
            spent = next((o["cancelled"] for o in out if o.get("cancelled")), None)
            c = Cancelled("the request was cancelled")
            c.actual_event = spent
            raise c from None


def execute(request: EngineRequest, dataset: DatasetMeta, data: PartitionedTable, plan: Plan, progress,
            workdir) -> Release:
    """Train on the cluster's workers (more than one asked for and available), else in
    this process on the partitions read into one table, as for a local dataset."""
    from distributed import Event, Variable

    from engines.dpsgd import execute as local
    from engines.dpsgd.params import Spec

    d = local.check_version(plan)
    spec = Spec.from_dict(d["spec"])
    workers = ranks_for(spec.ranks, data.scheduler)
    if not data.unit_column:  # rank r reads files r, r + N, ...: no more ranks than files
        workers = workers[:len(data.paths)] if len(data.paths) > 1 else []
    if not workers:
        release = local.execute(request, dataset, data.to_arrow(), plan, progress, workdir)
        release.result["ranks"] = 1
        return release
    size, job = len(workers), f"dpsgd-{uuid.uuid4().hex}"
    c = cluster.client(data.scheduler)
    stop, report = Event(f"{job}-stop", client=c), Variable(f"{job}-progress", client=c)
    starting = {"phase": f"starting {size} ranks on the cluster", "fraction": 0.0}
    report.set(starting)  # before the ranks: the driver's polls always find a value
    progress(starting)
    futures = [c.submit(_rank_main, data, r, size, job, d, key=f"{job}-rank{r}", workers=[w],
                        allow_other_workers=False, pure=False, retries=0) for r, w in enumerate(workers)]
    cluster.submitted(data.scheduler, [f.key for f in futures], job)
    try:
        out = _gather(futures, progress, stop, report)
    except Cancelled:
        raise
    except Exception as e:
        for f in futures:
            f.cancel()
        raise EngineError(f"a training rank failed on the cluster: {type(e).__name__}") from e
    finally:  # nothing of the job stays on the scheduler
        for name in ("rendezvous", "progress"):
            Variable(f"{job}-{name}", client=c).delete()
        stop.clear()
        for f in futures:
            f.release()
    first = next(o for o in out if o["rank"] == 0)
    if "cancelled" in first:  # pragma: no cover - a cancellation is raised by _gather
        raise Cancelled("the request was cancelled")
    release = local.finish(spec, d, first["trainers"], first["outcomes"], Path(workdir), first["device"])
    release.result["ranks"] = size
    release.officer_report = {"cluster": {"backend": "dask", "scheduler": cluster.public_address(data.scheduler), "job": job,
                                          "keys": [str(f.key) for f in futures], "workers": workers,
                                          "partitions": len(data.paths)}}
    return release
