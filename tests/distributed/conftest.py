"""A real local Dask cluster (2 worker processes, 1 thread each) for the module's tests,
and a partitioned Parquet table with privacy units spread over its partitions."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engines.distributed.source import schema_to_json

DOMAIN = ["north", "south", "east"]
UNIT_COLUMNS = {
    "pid": {"type": "unit"},
    "age": {"type": "numeric", "lower": 18, "upper": 90},
    "income": {"type": "numeric", "lower": 0, "upper": 100_000},
    "site": {"type": "categorical", "domain": DOMAIN},
    "flag": {"type": "categorical", "domain": [False, True]},
}


def make_table(n: int, seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    income = rng.normal(50_000, 30_000, n)  # some below 0 and above 100,000: clamped
    income[rng.random(n) < 0.05] = np.nan
    return pa.table({
        "pid": rng.integers(0, n // 3, n),  # about 3 rows per unit, spread over the partitions
        "age": rng.integers(10, 100, n),  # some outside [18, 90]: clamped
        "income": income,
        "site": rng.choice(DOMAIN + ["secret-site"], n, p=[0.3, 0.3, 0.3, 0.1]),
        "flag": rng.random(n) < 0.3,
    })


def write_partitions(table: pa.Table, directory, parts: int) -> list[dict]:
    """The table cut into ``parts`` Parquet files; returns their manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, parts + 1).astype(int)
    manifest = []
    for i in range(parts):
        path = directory / f"part-{i:04d}.parquet"
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), path)
        manifest.append({"path": str(path), "rows": int(bounds[i + 1] - bounds[i]), "bytes": path.stat().st_size})
    return manifest


def unit_cuts(pid: np.ndarray, parts: int) -> list[int]:
    """Row positions cutting ids sorted by unit into ``parts`` pieces at unit boundaries."""
    starts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])  # where a unit begins
    return [0] + [int(starts[np.searchsorted(starts, len(pid) * i // parts)]) for i in range(1, parts)] + [len(pid)]


def write_pieces(table: pa.Table, cuts: list[int], directory) -> list[dict]:
    """Each piece between cuts as a Parquet file (its rows shuffled); the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        path = directory / f"part-{i:04d}.parquet"
        pq.write_table(table.slice(a, b - a).take(np.random.default_rng(i).permutation(b - a)), path)
        manifest.append({"path": str(path), "rows": b - a, "bytes": path.stat().st_size})
    return manifest


def write_by_unit(table: pa.Table, directory, parts: int) -> list[dict]:
    """The table sorted by unit and cut at unit boundaries into ``parts`` files."""
    table = table.sort_by("pid")
    return write_pieces(table, unit_cuts(table.column("pid").to_numpy(), parts), directory)


# package scope: the clusters end with tests/distributed (kept for the session, their idle
# workers took about 5% of a core each for the rest of a 60-minute pass)
@pytest.fixture(scope="package")
def dask_cluster():
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                           host="127.0.0.1", silence_logs=40)
    try:
        yield cluster.scheduler_address
    finally:
        from engines.distributed import cluster as dc

        c = dc._clients.pop(cluster.scheduler_address, None)
        if c is not None:
            c.close()
        cluster.close()


@pytest.fixture(scope="session")
def partitioned(tmp_path_factory):
    table = make_table(12_000)
    manifest = write_partitions(table, tmp_path_factory.mktemp("parts"), 5)
    return table, manifest, schema_to_json(table.schema)


# --------------------------------------------------------------------------- separate hosts


@pytest.fixture(scope="package")
def hosts(tmp_path_factory):
    """A scheduler and 2 worker processes modelling 2 hosts: each worker (under its own
    Nanny, which restarts it when it is killed) has its own local directory and its own
    TMPDIR, and they share no scratch space. Yields ``(scheduler address, [host dirs])``."""
    from distributed import Nanny, Scheduler, SpecCluster

    base = tmp_path_factory.mktemp("hosts")
    dirs = []
    workers = {}
    for i in range(2):
        d = base / f"host{i}"
        (d / "tmp").mkdir(parents=True)
        dirs.append(d)
        workers[f"host{i}"] = {"cls": Nanny, "options": {
            "nthreads": 1, "local_directory": str(d), "host": "127.0.0.1", "dashboard": False, "silence_logs": 40,
            "env": {"TMPDIR": str(d / "tmp"), "DASK_TEMPORARY_DIRECTORY": str(d)}}}
    cluster = SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1",
                                                                                    "dashboard": False}},
                          silence_logs=40)
    _HOSTS["cluster"] = cluster
    try:
        yield cluster.scheduler_address, dirs
    finally:
        _HOSTS.clear()
        from engines.distributed import cluster as dc

        c = dc._clients.pop(cluster.scheduler_address, None)
        if c is not None:
            c.close()
        cluster.close()


_HOSTS: dict = {}


def heal_hosts(n: int = 2, timeout: float = 120.0) -> None:
    """Wait until the ``hosts`` cluster has ``n`` workers again after a kill (each Nanny
    starts a new worker); a Nanny that gave up (slow start on a loaded machine) is
    replaced from its spec (same host directory)."""
    from engines.distributed import cluster as dc

    cluster = _HOSTS["cluster"]
    c = dc.client(cluster.scheduler_address)
    try:
        c.wait_for_workers(n, timeout=30)
        return
    except TimeoutError:
        pass
    for name, w in list(cluster.workers.items()):
        if getattr(w, "status", None) is not None and w.status.name in ("closed", "closing", "failed"):
            del cluster.workers[name]
    cluster.sync(cluster._correct_state)
    c.wait_for_workers(n, timeout=timeout)


def row_copies(dirs) -> dict:
    """Every file under the hosts' directories that could hold rows: anything but Dask's
    empty lock files (``*.lock``, ``*.dirlock``), with its size."""
    out = {}
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file() and not (p.name.endswith((".lock", ".dirlock")) and p.stat().st_size == 0):
                out[str(p)] = p.stat().st_size
    return out
