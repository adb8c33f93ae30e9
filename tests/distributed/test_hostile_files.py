"""Partition files that lie, change or are not files (a helper's probe, 2026-11-29), on a
real local Dask cluster through the REST API: footer statistics with min above max, unit
ids Arrow reads as durations, a column required in one file and optional in another, a
file rewritten after the manifest check, a FIFO in a partition's place, and a Spark job's
``_temporary/`` attempts beside its output. Each run answers exactly (as the local engine
does on the same rows) or fails without a wrong release; registration never answers 500."""

import os
import struct
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engines import plugins
from engines.aggregates import execute as local
from engines.distributed import PartitionedTable, source
from engines.distributed import aggregates as dist
from engines.types import DatasetMeta, EngineRequest
from governance.models import Dataset, LedgerEntry

from .conftest import UNIT_COLUMNS, make_table, write_by_unit, write_partitions
from .test_distributed_api import BOUNDS, N, ask, on_cluster, register  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db
SALT = 0x5EED_1234_ABCD
QUERIES = [("count", {"max_rows_per_unit": 1}), ("sum", {"column": "age", "max_rows_per_unit": 2}),
           ("mean", {"column": "income", "max_rows_per_unit": 2, "where": [{"column": "age", "op": ">=",
                                                                            "value": 30}]})]


def _lie(path, pairs) -> None:
    """Rewrite 8-byte integers in a Parquet footer (its statistics), the file else unchanged."""
    raw = bytearray(path.read_bytes())
    length = struct.unpack("<i", raw[-8:-4])[0]
    start = len(raw) - 8 - length
    foot = bytes(raw[start:-8])
    for a, b in pairs:
        assert struct.pack("<q", a) in foot
        foot = foot.replace(struct.pack("<q", a), struct.pack("<q", b))
    raw[start:-8] = foot
    path.write_bytes(bytes(raw))


def _invert_unit_statistics(directory) -> None:
    """Every file's pid statistics claim (max + 10^5, min): min above max."""
    for p in sorted(directory.glob("*.parquet")):
        mm = pc.min_max(pq.read_table(p).column("pid"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        _lie(p, [(lo, hi + 100_000), (hi, lo)])


def _exact_equal(table, manifest, scheduler, kind, params) -> None:
    pids = table.column("pid").to_numpy()
    meta = DatasetMeta(name="t", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                       n_units=len(np.unique(pids)), delta=1e-6, distributed=True)
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), meta).details
    n = table.num_rows
    parts = tuple(p["path"] for p in manifest)
    ranges = source.file_ranges(parts, "pid")
    assert ranges is None  # statistics that cannot be true are not used
    data = PartitionedTable(paths=parts, columns=tuple(table.column_names), num_rows=n, unit_column="pid",
                            scheduler=scheduler, unit_ranges=ranges)
    g = local.grid_rows(d)
    want = local.exact_values(d, local.exact_parts(d, table, g, np.random.default_rng(0), salt=SALT), g)
    got = local.exact_values(d, dist.exact_parts(data, d, salt=SALT), g)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(np.asarray(want[name]), np.asarray(got[name]), err_msg=name)


def registered_and_answered(api, officer, analyst, grant, name, directory, capture) -> dict:
    """Register ``directory`` as ``name``, grant it, and ask every query: each succeeds."""
    body = register(api(officer), name, directory, "distributed")
    grant(analyst, Dataset.objects.get(name=name))
    for kind, params in QUERIES:
        got = ask(api(analyst), name, kind, {"epsilon": 1.0, **params}, capture)
        assert got["status"] == "succeeded", got
    return body


@pytest.mark.parametrize("kind,params", QUERIES, ids=[q[0] for q in QUERIES])
def test_footer_statistics_with_min_above_max_are_not_used(dask_cluster, tmp_path, kind, params):
    """Such footers made registration a 500 (an overflow spreading the ids) and every unit
    count fail after the read, charged."""
    table = make_table(N, seed=5)
    table = table.set_column(0, "pid", pa.array(table.column("pid").to_numpy() + 10**12))
    manifest = write_by_unit(table, tmp_path / "inverted", 4)
    _invert_unit_statistics(tmp_path / "inverted")
    _exact_equal(table, manifest, dask_cluster, kind, params)


def test_lying_footers_register_and_answer_through_the_api(api, officer, analyst, grant, on_cluster, import_dir,
                                                            django_capture_on_commit_callbacks):
    table = make_table(N, seed=5)
    table = table.set_column(0, "pid", pa.array(table.column("pid").to_numpy() + 10**12))
    directory = import_dir / "inverted"
    write_by_unit(table, directory, 4)
    _invert_unit_statistics(directory)
    body = registered_and_answered(api, officer, analyst, grant, "inverted", directory,
                                   django_capture_on_commit_callbacks)
    assert body["n_units"] == len(np.unique(table.column("pid").to_numpy()))


def test_unit_ids_read_as_durations_answer(api, officer, analyst, grant, on_cluster, import_dir,
                                           django_capture_on_commit_callbacks):
    """A duration is stored as a plain INT64: the footers gave an integer range, the rows read
    were durations, and every query failed after the read, charged."""
    table = make_table(N, seed=5)
    table = table.set_column(0, "pid", table.column("pid").cast(pa.duration("s")))
    directory = import_dir / "durations"
    write_by_unit(table, directory, 4)
    registered_and_answered(api, officer, analyst, grant, "durations", directory, django_capture_on_commit_callbacks)


def test_a_column_required_in_one_file_and_optional_in_another_is_one_column(
        api, officer, analyst, grant, on_cluster, import_dir, django_capture_on_commit_callbacks):
    """The unit buckets' concatenation refused the two schemas: a sum failed after the read."""
    table = make_table(N, seed=5)
    directory = import_dir / "required"
    directory.mkdir()
    first, second = table.slice(0, N // 2), table.slice(N // 2)
    required = pa.schema([pa.field(f.name, f.type, nullable=f.name not in ("age", "pid")) for f in first.schema])
    pq.write_table(first.cast(required), directory / "part-0000.parquet")
    pq.write_table(second, directory / "part-0001.parquet")
    registered_and_answered(api, officer, analyst, grant, "required", directory, django_capture_on_commit_callbacks)


def test_a_partition_rewritten_after_the_check_is_not_answered_on(
        api, officer, analyst, grant, on_cluster, import_dir, django_capture_on_commit_callbacks, monkeypatch):
    """The run checked the manifest once, then the workers read what was on disk: a sum on a
    file grown sixfold after the check released 359,314,268 where the registered rows sum
    to 289,879,400 and the rows now to 1,860,527,083 (its grid was set by the registered
    count). Each read now checks its file against the manifest."""
    table = make_table(N, seed=5)
    directory = import_dir / "grown"
    write_partitions(table, directory, 2)
    register(api(officer), "grown", directory, "distributed")
    grant(analyst, Dataset.objects.get(name="grown"))
    from governance.datasets import partitions

    checked = partitions.source.check_manifest
    bigger = make_table(6 * N, seed=9)

    def check_then_rewrite(*args, **kwargs):  # an ETL job rewrites a partition just after the check
        out = checked(*args, **kwargs)
        pq.write_table(bigger, directory / "part-0001.parquet")
        return out

    monkeypatch.setattr(partitions.source, "check_manifest", check_then_rewrite)
    registered = os.stat(directory / "part-0001.parquet")
    for kind, params in (("sum", {"column": "income", "max_rows_per_unit": 1000}),
                         ("count", {"max_rows_per_unit": 1000}), ("sum", {"column": "age", "max_rows_per_unit": 2})):
        pq.write_table(table.slice(N // 2), directory / "part-0001.parquet")  # as registered again, ...
        os.utime(directory / "part-0001.parquet", ns=(registered.st_atime_ns, registered.st_mtime_ns))  # ... to the ns
        got = ask(api(analyst), "grown", kind, {"epsilon": 1e4, **params}, django_capture_on_commit_callbacks)
        assert got["status"] == "failed" and got["result"] is None, got
        assert got["error"]["code"] == "request.failed_after_read"  # other files were read: charged, as the rules say


def test_a_fifo_in_a_partitions_place_fails_before_the_read_at_once(
        api, officer, analyst, grant, on_cluster, import_dir, django_capture_on_commit_callbacks):
    """The footer check blocked in open() for ever, and the charge was kept when the worker
    was killed for it: the data counted as read before the check."""
    table = make_table(N, seed=5)
    directory = import_dir / "fifo"
    write_partitions(table, directory, 2)
    register(api(officer), "fifo", directory, "distributed")
    grant(analyst, Dataset.objects.get(name="fifo"))
    (directory / "part-0001.parquet").unlink()
    os.mkfifo(directory / "part-0001.parquet")
    fifo = directory / "part-0001.parquet"
    blocked = threading.Event()

    def unblock():  # should the check block on the FIFO, open its other end so the test can end
        if not finished.wait(60):
            blocked.set()
            with open(fifo, "wb"):
                pass

    finished = threading.Event()
    threading.Thread(target=unblock, daemon=True).start()
    body = ask(api(analyst), "fifo", "count", {"epsilon": 1.0}, django_capture_on_commit_callbacks)
    finished.set()
    assert not blocked.is_set(), "the run was blocked on the FIFO for 60 s"
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read", body
    assert LedgerEntry.objects.get(dataset__name="fifo").status == "released"
    with pytest.raises(source.PartitionError, match="not a regular file"):
        PartitionedTable(paths=(str(directory / "part-0001.parquet"),), columns=("pid",), num_rows=1).read_file(
            str(directory / "part-0001.parquet"))


def test_a_spark_jobs_temporary_attempts_and_dot_files_are_not_partitions(api, officer, on_cluster, import_dir):
    """They were registered: 12,000 rows for 6,000, most rows per unit doubled."""
    table = make_table(N, seed=5)
    directory = import_dir / "spark"
    write_partitions(table, directory, 2)
    attempt = directory / "_temporary" / "0" / "_temporary" / "attempt_1_m_000001_1"
    attempt.mkdir(parents=True)
    pq.write_table(table.slice(N // 2), attempt / "part-0001.parquet")
    pq.write_table(table.slice(0, N // 2), directory / ".part-0000.parquet")
    pq.write_table(table.slice(0, N // 2), directory / "_part-0000.parquet")
    body = register(api(officer), "spark", directory, "distributed")
    assert body["n_rows"] == N
    assert sorted(p["path"] for p in body["partitions"]) == ["part-0000.parquet", "part-0001.parquet"]
