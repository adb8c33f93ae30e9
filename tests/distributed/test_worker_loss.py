"""Unit-level work on a cluster that models separate hosts (``hosts``: 2 worker processes,
each with its own local directory and TMPDIR, no shared scratch), with a worker killed
(SIGKILL; its Nanny starts a new one) while the rows are being dealt into unit buckets or
while the buckets run: the exact aggregate before noise equals the local engine's with
the same bounding salt every time, the unit count of a registration is exact, and no file
that could hold rows is left on either host's disk after any case."""

import os
import random
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from engines import plugins
from engines.aggregates import execute as local
from engines.distributed import PartitionedTable, cluster
from engines.distributed import aggregates as dist
from engines.distributed.profile import profile
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS, heal_hosts, make_table, row_copies, write_partitions

SALT = 0x0DD_5A17
N = 30_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    table = make_table(N, seed=23)
    manifest = write_partitions(table, tmp_path_factory.mktemp("loss-parts"), 6)
    return table, manifest


@dataclass(frozen=True)
class SlowTable(PartitionedTable):
    """Each file's read takes ``delay`` seconds more (so a kill lands inside the run)."""

    delay: float = 0.0

    def read_file(self, path):
        time.sleep(self.delay)
        return super().read_file(path)


def slow_parts(data, d, n_max, salt, delay):
    """A bucket's exact parts (the engine's own), ``delay`` seconds late."""
    time.sleep(delay)
    return dist._parts(data, d, n_max, salt)


def _meta(table):
    return DatasetMeta(name="t", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                       n_units=len(np.unique(table.column("pid").to_numpy())), delta=1e-6, distributed=True)


def _states(dask_scheduler=None):
    out: dict = {}
    for ts in dask_scheduler.tasks.values():
        key = ts.key if isinstance(ts.key, str) else str(ts.key[0])
        out.setdefault(key.split("-")[0], []).append(ts.state)
    return out


def _kill_when(scheduler: str, phase: str, rng: random.Random, timeout: float = 60.0) -> threading.Thread:
    """A thread that SIGKILLs one worker (chosen by ``rng``) as soon as ``phase`` is under
    way: ``split`` (a file's rows being dealt into buckets, or counted per unit id) or
    ``bucket`` (every file's pieces in workers' memory, the buckets, or the sums of the
    files' count vectors, running)."""
    c = cluster.client(scheduler)
    pids = c.run(os.getpid)
    victim = pids[rng.choice(sorted(pids))]
    seen = {}

    def of(states, names):
        return [st for key, sts in states.items() if key.startswith(names) for st in sts]

    def ready(states):
        # the files' tasks: dealing rows (by_unit) or counting them per id (unit_counts);
        # then the buckets, or the sums of the count vectors
        files = of(states, ("_split", "_on_file"))
        if phase == "split":
            return "processing" in files
        return files and all(s in ("memory", "released", "forgotten") for s in files) and \
            "processing" in of(states, ("_bucket", "_Adder", "_Total", "_AddWithin", "_CheckWithin"))

    def run():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready(c.run_on_scheduler(_states)):
                os.kill(victim, signal.SIGKILL)
                seen["killed"] = victim
                return
            time.sleep(0.01)

    t = threading.Thread(target=run, daemon=True)
    t.seen = seen
    t.start()
    return t


def _wait_for_workers(scheduler: str) -> None:
    heal_hosts(2)


def _exact_local(table, d):
    n = table.num_rows
    return local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)


def _equal(a, b):
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


QUERIES = [
    ("sum", {"column": "income", "group_by": "site", "max_rows_per_unit": 2}),
    ("count", {"where": [{"column": "age", "op": ">=", "value": 40}], "max_rows_per_unit": 1}),
    ("quantile", {"column": "age", "q": 0.5, "max_rows_per_unit": 1}),
]


@pytest.mark.parametrize("phase", ["split", "bucket"])
@pytest.mark.parametrize("q", range(len(QUERIES)), ids=[k for k, _ in QUERIES])
def test_a_worker_killed_mid_run_changes_nothing(hosts, data, phase, q):
    scheduler, dirs = hosts
    table, manifest = data
    kind, params = QUERIES[q]
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details
    source = SlowTable(paths=tuple(p["path"] for p in manifest), columns=tuple(table.column_names),
                       num_rows=table.num_rows, unit_column="pid", scheduler=scheduler, delay=0.3)
    _wait_for_workers(scheduler)
    killer = _kill_when(scheduler, phase, random.Random(f"{phase}-{q}"))
    leaves = cluster.by_unit(source, "pid", slow_parts, d, table.num_rows, SALT, 0.3)
    got = cluster.compute(cluster.tree_reduce(leaves, local.combine), scheduler, retries=0)
    killer.join(5)
    assert killer.seen.get("killed"), "the worker was not killed during the run"
    _equal(_exact_local(table, d), local.exact_values(d, got, table.num_rows))
    _wait_for_workers(scheduler)
    assert row_copies(dirs) == {}


def test_workers_that_share_no_disk_count_every_unit(hosts, data):
    """A registration's unit count and most rows per unit, with a worker killed while it
    deals its files' unit ids into buckets."""
    scheduler, dirs = hosts
    table, manifest = data
    _wait_for_workers(scheduler)
    source = SlowTable(paths=tuple(p["path"] for p in manifest), columns=tuple(table.column_names),
                       num_rows=table.num_rows, unit_column="pid", scheduler=scheduler, delay=0.3)
    killer = _kill_when(scheduler, "split", random.Random(7))
    got = profile(source, ["site"], 100)
    killer.join(5)
    assert killer.seen.get("killed")
    _, per_unit = np.unique(table.column("pid").to_numpy(), return_counts=True)
    assert got["n_units"] == len(per_unit) and got["max_rows_per_unit"] == int(per_unit.max())
    assert got["uniques"]["site"] == ["east", "north", "secret-site", "south"]
    _wait_for_workers(scheduler)
    assert row_copies(dirs) == {}


def test_a_failed_or_cancelled_run_leaves_no_rows_behind(hosts, data):
    from engines.types import Cancelled

    scheduler, dirs = hosts
    table, manifest = data
    _wait_for_workers(scheduler)
    meta = _meta(table)
    req = EngineRequest("sum", {"epsilon": 1.0, "column": "income", "max_rows_per_unit": 2})
    plan = plugins.plan("aggregates", req, meta)
    source = SlowTable(paths=tuple(p["path"] for p in manifest), columns=("pid", "income"), num_rows=table.num_rows,
                       unit_column="pid", scheduler=scheduler, delay=0.5)

    def progress(update):
        if update["phase"] == "aggregating on the cluster" and update["fraction"] == 0.5:
            raise Cancelled("cancelled by the analyst")

    with pytest.raises(Cancelled):
        plugins.run("aggregates", req, meta, source, plan, progress)
    missing = PartitionedTable(paths=source.paths + ("/nonexistent/part.parquet",), columns=("pid", "income"),
                               num_rows=table.num_rows, unit_column="pid", scheduler=scheduler, retries=0)
    with pytest.raises(OSError):
        plugins.run("aggregates", req, meta, missing, plan, lambda u: None)
    time.sleep(1.0)  # the cancelled graph's tasks still running finish and are forgotten
    assert row_copies(dirs) == {}


def _slow_reads(delay: float) -> None:
    """Run on each worker process (``Client.run``): its partition reads, its unit buckets'
    aggregates and its sums of count vectors take ``delay`` seconds more (so a kill lands
    in either phase), until the process ends (a worker the Nanny restarts runs at full
    speed)."""
    from engines.distributed import aggregates, unit_counts
    from engines.distributed.source import PartitionedTable as T

    if not hasattr(T, "_fast_read_file"):
        T._fast_read_file = T.read_file
        aggregates._fast_parts = aggregates._parts
        unit_counts._fast_add = unit_counts.add

    def read_file(self, path):
        time.sleep(delay)
        return T._fast_read_file(self, path)

    def parts(*args):  # a bucket's task finds it by name when its function is unpickled
        time.sleep(delay)
        return aggregates._fast_parts(*args)

    def add(*args):  # found by name when the sum's task runs
        time.sleep(delay)
        return unit_counts._fast_add(*args)

    T.read_file = read_file
    aggregates._parts = parts
    unit_counts.add = add


@pytest.mark.django_db
@pytest.mark.parametrize("phase", ["split", "bucket"])
def test_through_the_api_a_killed_worker_gives_the_exact_answer_charged_once(
        hosts, phase, settings, api, officer, analyst, grant, import_dir, django_capture_on_commit_callbacks):
    """A registration and two unit-level requests through the REST API, a worker killed in
    each request's run: every answer is the exact one (noise negligible at epsilon 1e5),
    each request charged once, and no rows left on the hosts' disks."""
    from governance.models import Dataset, LedgerEntry

    from .test_distributed_api import ask, register

    scheduler, dirs = hosts
    settings.DASK_SCHEDULER_ADDRESS = scheduler
    table = make_table(12_000, seed=31)
    write_partitions(table, import_dir / "events", 4)
    _wait_for_workers(scheduler)
    events = register(api(officer), "events", import_dir / "events", "distributed")
    pids = table.column("pid").to_numpy()
    assert events["n_units"] == len(np.unique(pids))
    grant(analyst, Dataset.objects.get(name="events"))
    client = api(analyst)
    age, site = table.column("age").to_numpy(), table.column("site").to_numpy(zero_copy_only=False)
    rng = random.Random(phase)
    answers = []
    for kind, params in [("count", {"where": [{"column": "age", "op": ">=", "value": 40}], "max_rows_per_unit": 1}),
                         ("histogram", {"column": "site", "max_rows_per_unit": 40})]:
        _wait_for_workers(scheduler)
        cluster.client(scheduler).run(_slow_reads, 0.3)
        killer = _kill_when(scheduler, phase, rng)
        answers.append(ask(client, "events", kind, {"epsilon": 1e5, **params}, django_capture_on_commit_callbacks))
        killer.join(5)
        assert killer.seen.get("killed"), "the worker was not killed during the run"
    count, hist = answers
    assert count["status"] == hist["status"] == "succeeded", (count, hist)
    assert round(count["result"]["value"]) == len(np.unique(pids[age >= 40]))
    want = {s: int((site == s).sum()) for s in ("north", "south", "east", "secret-site")}
    assert {g["key"]: round(g["value"]) for g in hist["result"]["groups"]} == want
    entries = LedgerEntry.objects.filter(dataset__name="events")
    assert entries.count() == 2 and {e.status for e in entries} == {"committed"}
    _wait_for_workers(scheduler)
    assert row_copies(dirs) == {}
