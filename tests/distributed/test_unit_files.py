"""A table written by unit (each file holds its own range of unit ids): each file is bounded
and aggregated alone, without dealing rows, and the answer equals the local engine's; when
the ids read show a unit in two files (statistics that lie, null ids in two files) the
try is thrown away and the rows are dealt, still exact."""

import numpy as np
import pyarrow as pa
import pytest

from engines import plugins
from engines.aggregates import execute as local
from engines.distributed import aggregates as dist
from engines.distributed import cluster, source
from engines.types import EngineRequest

from .conftest import make_table, unit_cuts, write_by_unit, write_pieces
from .test_aggregates_equal import QUERIES, SALT, _equal, _meta, _source


@pytest.fixture(scope="module")
def by_unit(tmp_path_factory):
    table = make_table(12_000, seed=5)
    return table, write_by_unit(table, tmp_path_factory.mktemp("by-unit"), 5)


@pytest.fixture
def no_deal(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("rows were dealt")

    monkeypatch.setattr(cluster, "by_unit", refuse)


def _check(table, manifest, scheduler, kind, params):
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details
    n = local.grid_rows(d)
    want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
    _equal(want, local.exact_values(d, dist.exact_parts(_source(manifest, scheduler, table), d, salt=SALT), n))


@pytest.mark.parametrize("kind,params", QUERIES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(QUERIES)])
def test_a_table_written_by_unit_is_bounded_file_by_file(dask_cluster, by_unit, no_deal, kind, params):
    table, manifest = by_unit
    ranges = source.file_ranges([p["path"] for p in manifest], "pid")
    assert dist._apart(ranges) and len(ranges) == 5
    _check(table, manifest, dask_cluster, kind, params)


def test_without_a_cluster_too(by_unit, no_deal):
    table, manifest = by_unit
    _check(table, manifest, "", "sum", {"column": "income", "group_by": "flag", "max_rows_per_unit": 1})


@pytest.fixture
def tried(monkeypatch):
    """Records whether the per-file try was made (``_within_files`` returned a graph)."""
    seen = []
    real = dist._within_files

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(dist, "_within_files", spy)
    return seen


KINDS = [("sum", {"column": "income", "group_by": "flag", "max_rows_per_unit": 1}),
         ("histogram", {"column": "age", "bins": [18, 30, 45, 60, 75, 90], "max_rows_per_unit": 2}),
         ("quantile", {"column": "income", "q": 0.5, "max_rows_per_unit": 1})]


@pytest.mark.parametrize("kind,params", KINDS, ids=[k for k, _ in KINDS])
def test_statistics_that_lie_cannot_count_a_unit_twice(dask_cluster, partitioned, monkeypatch, tried, kind, params):
    """The footers of a table whose units span every file made to say each file holds its
    own range: the try runs, the ids read show the overlap, the rows are dealt."""
    table, manifest, _ = partitioned
    monkeypatch.setattr(source, "file_ranges", lambda paths, column: [(10 * i, 10 * i + 9) for i in range(len(paths))])
    _check(table, manifest, dask_cluster, kind, params)
    assert tried == [True]


def test_null_ids_in_two_files_are_one_unit(dask_cluster, tmp_path, tried):
    """Null ids are one unit (as the local engine counts them): in two files they are a
    unit in two files, so the try does not hold, though the other ids' ranges are apart."""
    table = make_table(3_000, seed=7).sort_by("pid")
    cuts = unit_cuts(table.column("pid").to_numpy(), 3)
    nulls = np.zeros(table.num_rows, dtype=bool)
    nulls[[cuts[0], cuts[0] + 1, cuts[2], cuts[2] + 1]] = True  # in the first and the last file
    table = table.set_column(0, "pid", pa.array(table.column("pid").to_numpy(), mask=nulls))
    manifest = write_pieces(table, cuts, tmp_path)
    assert dist._apart(source.file_ranges([p["path"] for p in manifest], "pid"))
    _check(table, manifest, dask_cluster, "sum", {"column": "income", "max_rows_per_unit": 1})
    assert tried == [True]


def test_ranges_apart():
    assert dist._apart([(5, 9), (0, 4), (10, 10)])
    assert not dist._apart([(0, 4), (4, 9)])
    assert not dist._apart([(0, 10), (3, 4)])
    assert dist._apart([])


def test_a_table_of_many_small_files_is_dealt_into_few_buckets():
    """Every file sends a piece to every bucket: 100 files of 200 rows made 10,000 pieces and
    a 17 s query (0.07 s on the local engine); at most one bucket per MIN_BUCKET_ROWS rows
    (2.1 s, bench/README.md). Large tables keep a bucket per file, up to MAX_BUCKETS."""
    from engines.distributed import PartitionedTable

    def table(files, rows):
        return PartitionedTable(paths=tuple(f"p{i}.parquet" for i in range(files)), columns=("pid",),
                                num_rows=rows, unit_column="pid", scheduler="")

    assert cluster.buckets_for(table(100, 20_000)) == 10
    assert cluster.buckets_for(table(100, 150)) == 1
    assert cluster.buckets_for(table(8, 10_000_000)) == 8
    assert cluster.buckets_for(table(400, 1_000_000_000)) == cluster.MAX_BUCKETS
