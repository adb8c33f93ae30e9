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

A lost rank: each rank reads its rows before it joins the group, so from the first
collective on the ranks are in lockstep and a collective waits at most
``COLLECTIVE_SECONDS`` (45 s) for a rank. The driver watches the ranks' tasks and their
workers (a task pinned to a worker that died would wait for it for ever); when a rank is
lost, or a survivor's collective fails (at once if the peer's connection closed, else
at the timeout), the run fails with ``RankLost``, within a minute (a rank frozen, not
dead, within about 100 s: ``COLLECTIVE_SECONDS``, then ``LOST_GRACE_SECONDS``), and is charged the
steps and evaluations the survivors report taken, the one under way counted as taken
(rank 0 may have drawn its noise); the whole plan if no rank could say, as for a rank
lost while it read its rows, before the group formed: it may have died of those rows (an
out-of-memory kill), and a failure that depends on the data is charged, as a Celery
worker lost after the read is (a free failure would be an oracle). A rank still waiting
for the group then (``_rendezvous``) stops within a second of the driver's ``stop``.

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

from engines.types import Cancelled, DatasetMeta, EngineError, EngineRequest, Plan, Release, before_the_first_step

from . import cluster
from .source import PartitionedTable

__all__ = ["execute", "rank_rows", "ranks_for", "RankLost"]

RENDEZVOUS_SECONDS = 600.0  # a rank waits this long for rank 0's address (rank 0 reads its rows first)
RENDEZVOUS_POLL_SECONDS = 1.0  # ... looking at the driver's stop between waits
NOTHING = {"kind": "composed", "events": []}  # the event of a run that took no step
COLLECTIVE_SECONDS = 45.0  # a collective waits this long for a rank: the ranks are in lockstep (rows read before)
CANCEL_GRACE_SECONDS = 120.0
LOST_GRACE_SECONDS = COLLECTIVE_SECONDS + 10.0  # after a rank is lost, how long the survivors may take to stop
WORKERS_POLL_SECONDS = 1.0


class RankLost(EngineError):
    """A rank of a data-parallel run died or failed: the run fails, charged the steps (and
    evaluations) taken, the one under way included (``actual_event``; None if unknown:
    the whole plan)."""

    code = "dpsgd.rank_lost"

    def __init__(self, message: str, actual_event: dict | None = None):
        super().__init__(message)
        self.actual_event = actual_event


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
    # Rows first, then the group: from the first collective on the ranks are in lockstep, so
    # a collective's timeout can be short (a rank that died fails the others within it).
    prep = prepare(rank_rows(table, rank, size), spec, secure_generator(torch.device("cpu")), dev,
                   canaries=None if rank == 0 else 0)
    address = Variable(f"{job}-rendezvous")
    stop, report = Event(f"{job}-stop"), Variable(f"{job}-progress")
    if rank == 0:
        if stop.is_set():  # cancelled, or a rank lost, while this one read its rows: the group never forms
            return {"rank": rank, "cancelled": NOTHING}
        host = urlparse(worker.address).hostname
        group = parallel.connect(0, size, host, None, dev, publish=lambda port: address.set(f"{host}:{port}"),
                                 timeout_s=COLLECTIVE_SECONDS)
    else:
        rendezvous = _rendezvous(address, stop)
        if rendezvous is None:  # the run was cancelled or lost a rank before the group formed: no step taken
            return {"rank": rank, "cancelled": NOTHING}
        host, port = rendezvous.rsplit(":", 1)
        group = parallel.connect(rank, size, host, int(port), dev, timeout_s=COLLECTIVE_SECONDS)

    def progress(info: dict) -> None:  # called at the same steps on every rank
        if rank == 0:
            report.set(info)
        if group.any(rank == 0 and stop.is_set()):
            raise Cancelled("the request was cancelled")

    try:
        trainers, outcomes = train_runs(spec, d, prep, secure_generator(dev), progress, group)
    except Cancelled as c:
        return {"rank": rank, "cancelled": c.actual_event}
    except Exception as e:  # noqa: BLE001 - a collective failed: another rank died or stopped answering
        return {"rank": rank, "failed": type(e).__name__, "spent": getattr(e, "actual_event", None)}
    if rank:
        return {"rank": rank, "steps": [t.steps for t in trainers]}
    return {"rank": 0, "trainers": [t.detached() for t in trainers], "outcomes": outcomes, "device": dev.type}


def _rendezvous(address, stop) -> str | None:
    """Rank 0's ``host:port`` (within ``RENDEZVOUS_SECONDS``: rank 0 reads its rows first),
    or None once the driver sets ``stop`` (a cancellation, or a rank lost while reading its
    rows): a rank that waited out the whole wait kept its Dask worker's thread for 10
    minutes after the run had failed (a helper's probe)."""
    deadline = time.monotonic() + RENDEZVOUS_SECONDS
    while True:
        try:
            return address.get(timeout=RENDEZVOUS_POLL_SECONDS)
        except TimeoutError:
            if stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise


def ranks_for(requested: int, scheduler: str) -> list[str]:
    """The Dask workers the ranks run on: ``requested`` of them at most, in a stable order."""
    if requested <= 1 or not scheduler:
        return []
    workers = sorted(cluster.scheduler_info(cluster.client(scheduler))["workers"])
    return workers[:requested] if len(workers) > 1 else []


def _lost(futures: list, workers: list[str], c) -> str | None:
    """Why a rank is lost, or None: its task failed, or its worker left the cluster (a
    task pinned to a dead worker would wait for it for ever)."""
    for f in futures:
        if f.status in ("error", "cancelled", "lost"):
            return f"rank {futures.index(f)}'s task {f.status}"
    try:
        alive = set(cluster.scheduler_info(c)["workers"])
    except TimeoutError:  # a scheduler slow to answer: no news (the collectives' timeout still holds)
        return None
    gone = [r for r, w in enumerate(workers) if w not in alive]
    return f"rank {gone[0]}'s worker left the cluster" if gone else None


def _spent(results: list[dict]) -> dict | None:
    """What the ranks that stopped on a failure say was spent (rank 0's if it answered:
    every rank is within the step under way of the others, which each counts)."""
    spent = [o for o in results if o.get("spent")]
    return min(spent, key=lambda o: o["rank"])["spent"] if spent else None


def _gather(futures: list, workers: list[str], c, progress, stop, report) -> list[dict]:
    """The ranks' results, reporting rank 0's progress meanwhile; a cancellation sets
    ``stop``, waits for the ranks to agree on it and raises with the steps they took. A
    rank lost (its task failed, its worker died) or failed fails the run (``RankLost``)
    once the survivors have stopped (at most ``LOST_GRACE_SECONDS``), charged with the
    steps they report taken."""
    checked = 0.0
    while True:
        done = [f.result() for f in futures if f.status == "finished"]
        failed = [o for o in done if "failed" in o]
        why = f"rank {failed[0]['rank']} failed: {failed[0]['failed']}" if failed else None
        if why is None and len(done) == len(futures):
            return done
        if why is None and time.monotonic() - checked > WORKERS_POLL_SECONDS:
            checked = time.monotonic()
            why = _lost(futures, workers, c)
        if why is not None:
            stop.set()  # a rank still waiting for the group to form stops waiting
            deadline = time.monotonic() + LOST_GRACE_SECONDS
            while time.monotonic() < deadline:
                try:
                    alive = set(cluster.scheduler_info(c)["workers"])
                except TimeoutError:
                    alive = set(workers)  # no answer: wait on, within the grace period
                if all(f.done() or w not in alive for f, w in zip(futures, workers)):
                    break
                time.sleep(cluster.POLL_SECONDS)
            done = [f.result() for f in futures if f.status == "finished"]
            raise RankLost(f"a training rank was lost on the cluster ({why})", _spent(done))
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
            if spent is None:
                # no rank heard the cancel at a step: a rank stopped answering (frozen, a
                # paused host), and the others' collectives failed first; what those report
                # taken is the charge, as for a lost rank (the whole plan was charged: a
                # probe's 31 steps taken of 6,000 planned)
                spent = _spent(out)
            err = Cancelled("the request was cancelled")
            err.actual_event = spent
            raise err from None


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
    with before_the_first_step():
        progress(starting)
    futures = [c.submit(_rank_main, data, r, size, job, d, key=f"{job}-rank{r}", workers=[w],
                        allow_other_workers=False, pure=False, retries=0) for r, w in enumerate(workers)]
    cluster.submitted(data.scheduler, [f.key for f in futures], job)
    try:
        out = _gather(futures, workers, c, progress, stop, report)
    except (Cancelled, RankLost):
        for f in futures:
            f.cancel()
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
