"""A cluster task that fails is retried by Dask; what it computes is pure (an exact partial
aggregate), so the retry changes neither the answer nor the noise: noise is drawn once, by
the driver, after every partition's part is in."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engines import plugins
from engines.aggregates import execute as local
from engines.aggregates import noise
from engines.distributed import PartitionedTable
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS


@dataclass(frozen=True)
class FlakyTable(PartitionedTable):
    """Each partition's first read fails (a marker file remembers it, across worker processes)."""

    markers: str = ""

    def read_file(self, path):
        marker = Path(self.markers) / (Path(path).name + ".failed")
        if not marker.exists():
            marker.touch()
            raise OSError("transient read error (test)")
        return super().read_file(path)


def _meta(table):
    return DatasetMeta(name="t", columns={k: v for k, v in UNIT_COLUMNS.items() if k != "pid"}, unit_column=None,
                       n_rows=table.num_rows, n_units=table.num_rows, delta=1e-6, distributed=True)


def test_a_retried_task_changes_neither_the_answer_nor_the_noise(dask_cluster, partitioned, tmp_path, monkeypatch):
    table, manifest, _ = partitioned
    meta = _meta(table)
    req = EngineRequest("histogram", {"column": "site", "epsilon": 1.0})
    plan = plugins.plan("aggregates", req, meta)
    data = FlakyTable(paths=tuple(p["path"] for p in manifest), columns=("site",), num_rows=table.num_rows,
                      scheduler=dask_cluster, retries=1, markers=str(tmp_path))
    seen = []
    real = noise.Noise.release

    def counted(self, exact):
        seen.append(np.asarray(exact).tolist())
        return real(self, exact)

    monkeypatch.setattr(noise.Noise, "release", counted)
    release = plugins.run("aggregates", req, meta, data, plan, lambda u: None)
    assert len(list(tmp_path.glob("*.failed"))) == len(manifest)  # every partition's task failed once
    want = local.exact_parts(plan.details, table.select(["site"]), table.num_rows, np.random.default_rng())
    assert seen == [want["count"].tolist()]  # one draw of noise, on the exact histogram
    assert len(release.result["groups"]) == 3


def test_a_task_that_keeps_failing_fails_the_run(dask_cluster, partitioned, tmp_path):
    table, manifest, _ = partitioned
    meta = _meta(table)
    req = EngineRequest("count", {"epsilon": 1.0, "where": [{"column": "age", "op": ">", "value": 30}]})
    plan = plugins.plan("aggregates", req, meta)
    data = FlakyTable(paths=tuple(p["path"] for p in manifest), columns=("age",), num_rows=table.num_rows,
                      scheduler=dask_cluster, retries=0, markers=str(tmp_path))
    with pytest.raises(OSError, match="transient"):
        plugins.run("aggregates", req, meta, data, plan, lambda u: None)


@dataclass(frozen=True)
class SlowTable(PartitionedTable):
    def read_file(self, path):
        import time

        time.sleep(1.0)
        return super().read_file(path)


def test_a_cancellation_stops_the_cluster_job(dask_cluster, partitioned):
    from engines.types import Cancelled

    table, manifest, _ = partitioned
    meta = _meta(table)
    req = EngineRequest("count", {"epsilon": 1.0})
    plan = plugins.plan("aggregates", req, meta)
    data = SlowTable(paths=tuple(p["path"] for p in manifest), columns=(), num_rows=table.num_rows,
                     scheduler=dask_cluster)
    reports = []

    def progress(update):
        reports.append(update)
        if update["phase"] == "aggregating on the cluster" and len(reports) > 1:
            raise Cancelled("cancelled by the analyst")

    with pytest.raises(Cancelled):
        plugins.run("aggregates", req, meta, data, plan, progress)
    assert all(set(r) <= {"phase", "fraction"} for r in reports)  # no elapsed time: it depends on the data


def test_a_graph_whose_cluster_loses_every_worker_fails_charged_not_for_ever(monkeypatch):
    """A probe's cluster without a worker held a run until the scheduler went away (three
    hours, then the workers' time limit). A graph under way on a cluster left without a
    worker fails after NO_WORKER_SECONDS, as charged (its tasks may have read rows): a
    cluster with no worker before anything was sent is a refund (test_distributed_api.py)."""
    import threading
    import time

    import dask
    from distributed import LocalCluster

    from engines.distributed import cluster

    monkeypatch.setattr(cluster, "NO_WORKER_SECONDS", 1.0)
    monkeypatch.setattr(cluster, "WORKER_CHECK_SECONDS", 0.2)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, host="127.0.0.1") as lc:
        slow = dask.delayed(time.sleep, pure=False)(120)
        threading.Timer(2.0, lambda: lc.scale(0)).start()
        started = time.monotonic()
        with pytest.raises(cluster.ClusterUnavailable, match="had no running worker") as e:
            cluster.compute(slow, lc.scheduler_address, retries=0)
        assert e.value.nothing_read is False and time.monotonic() - started < 30


def test_a_graph_whose_workers_are_all_paused_fails_charged_not_for_ever(monkeypatch):
    """A probe's 2,000 small files paused both workers (Dask's memory monitor) for good, and
    the run waited on them with its reservation held until the 3 h time limit: a paused
    worker runs no task, so it counts as none."""
    import threading
    import time

    import dask
    from distributed import Client, LocalCluster
    from distributed.core import Status

    from engines.distributed import cluster

    def pause(dask_worker):
        dask_worker.status = Status.paused

    monkeypatch.setattr(cluster, "NO_WORKER_SECONDS", 1.0)
    monkeypatch.setattr(cluster, "WORKER_CHECK_SECONDS", 0.2)
    # (memory_limit=0: no memory monitor, which would resume a worker paused at 0% memory)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, host="127.0.0.1",
                      memory_limit=0) as lc, Client(lc.scheduler_address) as c:
        slow = [dask.delayed(time.sleep, pure=False)(0.5) for _ in range(240)]
        threading.Timer(1.0, lambda: c.run(pause)).start()
        started = time.monotonic()
        with pytest.raises(cluster.ClusterUnavailable, match="every one paused") as e:
            cluster.compute(dask.delayed(len)(slow), lc.scheduler_address, retries=0)
        assert e.value.nothing_read is False and time.monotonic() - started < 30


def test_a_cluster_whose_workers_are_all_paused_before_the_run_is_a_refund(monkeypatch):
    """A probe's only worker stayed paused after a run (its memory never fell): each later
    run sent its graph, waited NO_WORKER_SECONDS and failed charged, though no task ran. A
    graph is sent once a worker runs tasks; none within WAIT_FOR_WORKER_SECONDS: nothing
    read (refunded)."""
    import time

    import dask
    from distributed import Client, LocalCluster
    from distributed.core import Status

    from engines.distributed import cluster

    def pause(dask_worker):
        dask_worker.status = Status.paused

    monkeypatch.setattr(cluster, "WAIT_FOR_WORKER_SECONDS", 2.0)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, host="127.0.0.1",
                      memory_limit=0) as lc, Client(lc.scheduler_address) as c:
        c.run(pause)
        cluster.take_submitted()  # a new run: nothing of it sent yet (as the host starts each run)
        started = time.monotonic()
        with pytest.raises(cluster.ClusterUnavailable, match="every one paused") as e:
            cluster.compute(dask.delayed(len)([1, 2]), lc.scheduler_address, retries=0)
        assert e.value.nothing_read is True and time.monotonic() - started < 20
        assert "nothing was sent" in str(e.value)


def test_a_graph_with_a_frozen_worker_fails_charged_not_for_ever(monkeypatch):
    """A probe stopped one of two workers (SIGSTOP) 1 s into a unit-level query: the
    stopped worker's status stays "running", its tasks never end, and the run waited more
    than 9 minutes (only the 3 h time limit would have ended it). A worker whose heartbeat
    stands still for FROZEN_WORKER_SECONDS fails the graph, as charged."""
    import os
    import signal
    import time

    import dask
    from distributed import Client, LocalCluster

    from engines.distributed import cluster

    monkeypatch.setattr(cluster, "FROZEN_WORKER_SECONDS", 3.0)
    monkeypatch.setattr(cluster, "WORKER_CHECK_SECONDS", 0.2)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, host="127.0.0.1") as lc, \
            Client(lc.scheduler_address) as c:
        pids = list(c.run(os.getpid).values())
        slow = [dask.delayed(time.sleep, pure=False)(0.5) for _ in range(400)]
        cluster.client(lc.scheduler_address)  # the engine's client (and its worker plugin) before the freeze
        os.kill(pids[0], signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(cluster.ClusterUnavailable, match="sent no heartbeat for 3 s") as e:
                cluster.compute(dask.delayed(len)(slow), lc.scheduler_address, retries=0)
            assert e.value.nothing_read is False and time.monotonic() - started < 30
        finally:
            os.kill(pids[0], signal.SIGCONT)


def test_a_worker_is_frozen_only_when_its_heartbeat_stands_still():
    from engines.distributed.cluster import FROZEN_WORKER_SECONDS, _Heartbeats

    beats, limit = _Heartbeats(), FROZEN_WORKER_SECONDS
    assert beats.frozen({"a": {"last_seen": 1.0}, "b": {"last_seen": 5.0}, "c": {}}, 0.0) is None
    assert beats.frozen(None, limit + 1) is None  # a scheduler that did not answer: nothing to judge by
    assert beats.frozen({"a": {"last_seen": 2.0}, "b": {"last_seen": 5.0}, "c": {}}, limit) is None
    assert beats.frozen({"a": {"last_seen": 3.0}, "b": {"last_seen": 5.0}, "c": {}}, limit + 1) == "b"
    assert beats.frozen({"a": {"last_seen": 3.0}, "b": {"last_seen": 6.0}}, limit + 2) is None  # b beat again
    assert beats.frozen({"a": {"last_seen": 3.0}, "b": {"last_seen": 6.0}}, 2 * limit + 1.5) == "a"


@pytest.mark.parametrize("graph", ["per_partition", "by_unit", "profile"])
def test_a_graph_grows_with_the_files_not_their_square(graph, monkeypatch):
    """Each task carried the whole table (every path and manifest line): 114 KB a task for
    2,000 files, a graph growing with the square of the files, and a probe's 2,000 files of
    5 rows paused both workers out of memory for good. A task now carries its own file."""
    import pickle

    import dask

    from engines.distributed import cluster, profile
    from engines.distributed.source import PartitionedTable

    captured = []
    monkeypatch.setattr(cluster, "compute", lambda value, *a, **k: captured.append(value) or {"files": {}})

    def size(n):
        paths = tuple(f"/data/part-{i:05d}.parquet" for i in range(n))
        table = PartitionedTable(paths=paths, columns=("pid", "x"), num_rows=5 * n, unit_column="pid",
                                 unit_ranges=tuple((5 * i, 5 * i + 4) for i in range(n)),
                                 expected=tuple((5, 1000, "f" * 64, 1) for _ in range(n)))
        if graph == "per_partition":
            tasks = cluster.per_partition(table, len)
        elif graph == "by_unit":
            tasks = cluster.by_unit(table, "pid", len, buckets=4)
        else:
            captured.clear()
            profile.profile(dataclasses_replace(table, unit_column=None), [], 10)
            tasks = captured
        # each task pickled alone, as the scheduler ships it to a worker (one pickle of the
        # whole graph would hold the shared table once)
        return sum(len(pickle.dumps(task)) for task in dict(dask.delayed(tasks).__dask_graph__()).values())

    small, large = size(100), size(1000)
    assert large < 15 * small, (small, large)  # linear: ~10x; with the whole table in each task ~100x


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_a_partitioned_table_read_with_no_column_keeps_its_rows(tmp_path):
    """An engine that runs on one worker and reads no column (a plugin's row count) got 0
    rows: Arrow's concat_tables of tables without columns drops their rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engines.distributed.source import PartitionedTable

    for i, n in enumerate((3, 0, 4)):
        pq.write_table(pa.table({"x": list(range(n))}, schema=pa.schema([("x", pa.int64())])), tmp_path / f"{i}.parquet")
    paths = tuple(str(tmp_path / f"{i}.parquet") for i in range(3))
    assert PartitionedTable(paths=paths, columns=(), num_rows=7).to_arrow().num_rows == 7
    assert PartitionedTable(paths=paths, columns=("x",), num_rows=7).to_arrow().num_rows == 7
