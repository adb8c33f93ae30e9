"""Unit-level work on Dask without dealing rows: counts per unit id
(engines/distributed/unit_counts.py) and the row-level try of a bound no unit exceeds
(aggregates._within_bound) give the local engine's exact parts on a real cluster,
whatever the footers say and with null ids; the capped counts' arithmetic against a
plain count per id, and every path on random partitioned tables (hypothesis)."""

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines import plugins
from engines.aggregates import execute as local
from engines.aggregates import units
from engines.distributed import PartitionedTable
from engines.distributed import aggregates as dist
from engines.distributed import cluster, unit_counts
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS, write_partitions
from .test_aggregates_equal import K_ALL, SALT, _equal, _meta, _source

WHERE = [{"column": "age", "op": ">=", "value": 40}]
PLANS = [
    ("count", {"max_rows_per_unit": 1}),
    ("count", {"max_rows_per_unit": 2, "where": WHERE}),
    ("count", {"max_rows_per_unit": K_ALL}),
    ("count", {"max_rows_per_unit": 200, "where": WHERE}),  # a cap past 127: two-byte counts
    ("query", {"select": [{"name": "n", "agg": "count"}, {"name": "u", "agg": "count_distinct", "column": "pid"}],
               "where": WHERE, "max_rows_per_unit": 3}),
]


@pytest.fixture
def no_dealing(monkeypatch):
    """Fail if the graph deals rows into unit buckets."""
    def refuse(*a, **k):
        raise AssertionError("rows were dealt into unit buckets")

    monkeypatch.setattr(cluster, "by_unit", refuse)


def _want(table, d):
    n = local.grid_rows(d)  # the plan's grid, as the distributed engine sums on it
    return local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0)), n)


@pytest.mark.parametrize("kind,params", PLANS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(PLANS)])
def test_it_counts_the_local_engines_units_without_dealing_rows(dask_cluster, partitioned, no_dealing, kind, params):
    table, manifest, _ = partitioned
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details
    source = _source(manifest, dask_cluster, table)
    got = local.exact_values(d, dist.exact_parts(source, d), local.grid_rows(d))
    _equal(_want(table, d), got)


def test_ids_outside_the_footers_range_and_null_ids_are_counted(dask_cluster, partitioned, tmp_path, no_dealing):
    """A writer's wrong statistics (modelled by a narrower range than the ids have) drop
    no unit; null ids are one unit, as the local engine codes them."""
    base, _, _ = partitioned
    pid = base.column("pid").to_numpy()
    nulls = np.zeros(len(pid), dtype=bool)
    nulls[::97] = True
    table = base.set_column(0, "pid", pa.array(pid, mask=nulls))
    manifest = write_partitions(table, tmp_path / "nulls", 4)
    lo, hi = int(pid.min()), int(pid.max())
    narrow = dataclasses.replace(_source(manifest, dask_cluster, table), unit_ranges=((lo + 100, hi - 100),) * 4)
    assert unit_counts.id_span(narrow, "pid") == (lo + 100, hi - 100)
    for k in (1, 2, K_ALL):
        d = plugins.plan("aggregates", EngineRequest("count", {"epsilon": 1.0, "max_rows_per_unit": k,
                                                               "where": WHERE}), _meta(base)).details
        _equal(_want(table, d), local.exact_values(d, dist.exact_parts(narrow, d), local.grid_rows(d)))


def test_other_plans_and_wide_ids_are_dealt_as_before(partitioned):
    table, manifest, _ = partitioned
    source = _source(manifest, "", table)
    grouped = plugins.plan("aggregates", EngineRequest("count", {"epsilon": 1.0, "group_by": "site",
                                                                 "max_rows_per_unit": 1}), _meta(table)).details
    count = plugins.plan("aggregates", EngineRequest("count", {"epsilon": 1.0, "max_rows_per_unit": 1}),
                         _meta(table)).details
    assert not unit_counts.applies(grouped) and unit_counts.applies(count)
    assert unit_counts.id_span(source, "pid") is not None
    wide = ((0, 2**40),) * len(source.paths)
    assert unit_counts.id_span(dataclasses.replace(source, unit_ranges=wide), "pid") is None  # not compact
    assert unit_counts.id_span(dataclasses.replace(source, unit_ranges=None), "pid") is None  # no statistics


@settings(max_examples=200, deadline=None)
@given(files=st.lists(st.lists(st.one_of(st.none(), st.integers(-3, 40)), max_size=60), min_size=1, max_size=5),
       lo=st.integers(0, 10), width=st.integers(1, 400), cap=st.sampled_from([1, 2, 3, 127, 128, 200, 40_000]),
       threshold=st.integers(-1, 3))
def test_capped_vectors_add_up_to_the_count_per_id(files, lo, width, cap, threshold):
    """sum over ids of min(rows passing the where, cap), null ids one id, ids in or out of
    the range [lo, lo + width), however the rows are split into files."""
    where = [{"column": "x", "op": ">=", "value": threshold, "type": "numeric"}]  # as the planner writes it
    parts = []
    for rows in files:
        ids = pa.array(rows, type=pa.int64())
        x = np.arange(len(rows)) % 5
        parts.append(unit_counts.file_counts(pa.table({"pid": ids, "x": x}), "pid", where, lo, width, cap))
    got = unit_counts._total(unit_counts.add(parts, cap), cap)

    every = [(r, i % 5) for rows in files for i, r in enumerate(rows)]
    kept = [r for r, x in every if x >= threshold]
    _, per_id = np.unique(np.array([-99 if r is None else r for r in kept]), return_counts=True)
    assert got == int(np.minimum(per_id, cap).sum())


@pytest.mark.parametrize("cap", [2, 3, 200])
def test_sparse_and_dense_counts_add_up_alike(cap):
    """Files of few rows beside the range are counted sparse (sorted ids and counts), a
    full one dense; added in any order and grouping, the same capped totals."""
    rng = np.random.default_rng(cap)
    files = [rng.integers(0, 1000, 12) for _ in range(6)] + [rng.integers(0, 1000, 900)]
    parts = [unit_counts.file_counts(pa.table({"pid": f}), "pid", [], 0, 1000, cap) for f in files]
    assert [p.vector is None for p in parts] == [True] * 6 + [False]
    _, per_id = np.unique(np.concatenate(files), return_counts=True)
    want = int(np.minimum(per_id, cap).sum())
    assert unit_counts._total(unit_counts.add(parts, cap), cap) == want
    sparse = unit_counts.add(parts[:6], cap)  # 72 ids present of 1,000: stays sparse
    assert sparse.vector is None
    assert unit_counts._total(unit_counts.add([sparse, parts[6]], cap), cap) == want
    _, some = np.unique(np.concatenate([files[6], *files[:3]]), return_counts=True)
    assert unit_counts._total(unit_counts.add([parts[6], *parts[:3]], cap), cap) == int(np.minimum(some, cap).sum())


def test_the_local_engine_counts_the_same_way():
    """The rule the vectors follow is the local engine's (``units.bounded_count``)."""
    ids = np.array([5, 5, 5, 7, 9, 9])
    for cap in (1, 2, 3):
        c = unit_counts.file_counts(pa.table({"pid": ids}), "pid", [], 0, 16, cap)
        codes, n = units.unit_codes(pa.table({"pid": ids}), "pid")
        assert unit_counts._total(c, cap) == units.bounded_count(np.ones(6, dtype=bool), codes, n, cap)


# --------------------------------------------------------------------------- the row-level try

WITHIN = [
    ("sum", {"column": "income", "max_rows_per_unit": K_ALL}),
    ("count", {"group_by": "site", "max_rows_per_unit": K_ALL}),
    ("mean", {"column": "income", "group_by": "site", "max_rows_per_unit": K_ALL, "where": WHERE}),
    ("variance", {"column": "age", "max_rows_per_unit": K_ALL}),
    ("histogram", {"column": "age", "bins": [18, 30, 45, 60, 75, 90], "max_rows_per_unit": K_ALL}),
    ("quantile", {"column": "income", "q": 0.5, "group_by": "site", "max_rows_per_unit": K_ALL}),
]


def _most_rows(table):
    return int(np.unique(table.column("pid").to_numpy(), return_counts=True)[1].max())


@pytest.mark.parametrize("kind,params", WITHIN, ids=[k for k, _ in WITHIN])
def test_a_bound_no_unit_exceeds_is_computed_row_level(dask_cluster, partitioned, no_dealing, kind, params):
    """k at least the registered most rows of one unit: each file read once, row-level,
    its rows counted per unit beside; the local engine's exact parts, no row dealt."""
    table, manifest, _ = partitioned
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details
    assert _most_rows(table) <= K_ALL
    source = dataclasses.replace(_source(manifest, dask_cluster, table), max_rows_per_unit=_most_rows(table))
    _equal(_want(table, d), local.exact_values(d, dist.exact_parts(source, d), local.grid_rows(d)))


@pytest.mark.parametrize("k", [1, 2])
def test_a_hint_the_rows_contradict_falls_back_to_bounding(dask_cluster, partitioned, monkeypatch, k):
    """A registered most rows of 1 (the files changed since, or the hint is wrong) while
    units have more than k: the row-level try is thrown away and the rows are dealt and
    bounded; the answer is the local engine's with the same salt."""
    table, manifest, _ = partitioned
    dealt = []
    real = cluster.by_unit
    monkeypatch.setattr(cluster, "by_unit", lambda *a, **kw: dealt.append(1) or real(*a, **kw))
    d = plugins.plan("aggregates", EngineRequest("sum", {"epsilon": 1.0, "column": "income", "group_by": "flag",
                                                         "max_rows_per_unit": k}), _meta(table)).details
    source = dataclasses.replace(_source(manifest, dask_cluster, table), max_rows_per_unit=1)
    assert dist._within_bound(source, d) is not None and _most_rows(table) > k
    n = local.grid_rows(d)
    want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
    _equal(want, local.exact_values(d, dist.exact_parts(source, d, salt=SALT), n))
    assert dealt == [1]


def test_the_row_level_try_is_not_made_when_it_cannot_hold(partitioned):
    table, manifest, _ = partitioned
    source = dataclasses.replace(_source(manifest, "", table), max_rows_per_unit=_most_rows(table))

    def plan(kind, **params):
        return plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details

    assert dist._within_bound(source, plan("sum", column="income", max_rows_per_unit=K_ALL)) is not None
    assert dist._within_bound(source, plan("count", max_rows_per_unit=K_ALL)) is None  # counted per unit id instead
    assert dist._within_bound(source, plan("sum", column="income", max_rows_per_unit=1)) is None  # k below the hint
    assert dist._within_bound(dataclasses.replace(source, max_rows_per_unit=None),
                              plan("sum", column="income", max_rows_per_unit=K_ALL)) is None  # no hint
    query = plan("query", select=[{"name": "u", "agg": "count_distinct", "column": "pid"}], group_by=[{"column": "site"}],
                 max_rows_per_unit=K_ALL)
    assert dist._within_bound(source, query) is None  # distinct units: one row per (unit, group) needs all its rows


# --------------------------------------------------------------------------- any table, any k

@settings(max_examples=int(os.environ.get("ANY_TABLE_EXAMPLES", 100)), deadline=None)
@given(data=st.data())
def test_counts_and_the_row_level_try_equal_the_local_engine_on_any_table(tmp_path_factory, data):
    """Random small tables cut into files (some empty), negative, null, wide or text ids,
    k and the registered hint anywhere (too low, exact, too high): the count per unit id,
    the row-level try and the dealt path give the local engine's exact parts, on
    threads. (It found two dealt-path faults: a file with a null id dealt its units by
    another hash than a file without, and a unit's bounding keys changed with whether a
    null was taken beside it.)"""
    rows = data.draw(st.integers(0, 60))
    lo = data.draw(st.integers(-50, 50))
    pid = data.draw(st.lists(st.one_of(st.integers(lo, lo + 12), st.none()), min_size=rows, max_size=rows))
    age = data.draw(st.lists(st.integers(10, 99), min_size=rows, max_size=rows))
    income = data.draw(st.lists(st.floats(-1e5, 2e5), min_size=rows, max_size=rows))
    ids = data.draw(st.sampled_from(["compact", "wide", "text"]))  # range buckets and counts, or hashed buckets
    if ids == "wide":
        pid = [None if p is None else p * 2**40 for p in pid]
    elif ids == "text":
        pid = [None if p is None else f"p{p}" for p in pid]
    table = pa.table({"pid": pa.array(pid, pa.string() if ids == "text" else pa.int64()), "age": pa.array(age, pa.int64()),
                      "income": pa.array(income, pa.float64()),
                      "site": pa.array([["north", "south", "east"][a % 3] for a in age]),
                      "flag": pa.array([a % 2 == 0 for a in age])})
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), min_size=1, max_size=4)))
    bounds = [0, *cuts, rows]
    directory = tmp_path_factory.mktemp("any")
    paths = []
    for i in range(len(bounds) - 1):
        path = directory / f"part-{i}.parquet"
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), path)
        paths.append(str(path))
    k = data.draw(st.integers(1, 6))
    hint = data.draw(st.one_of(st.none(), st.integers(1, 8)))
    meta = DatasetMeta(name="t", columns=UNIT_COLUMNS, unit_column="pid", n_rows=max(rows, 1), n_units=max(rows, 1),
                       delta=1e-6, distributed=True)
    source = PartitionedTable(paths=tuple(paths), columns=tuple(table.column_names), num_rows=rows, unit_column="pid",
                              scheduler="", max_rows_per_unit=hint)
    kind, params = data.draw(st.sampled_from([
        ("count", {}), ("count", {"where": WHERE}), ("count", {"group_by": "site"}),
        ("sum", {"column": "income"}), ("mean", {"column": "age", "group_by": "flag", "where": WHERE}),
        ("histogram", {"column": "site"}), ("quantile", {"column": "age", "q": 0.5}),
        ("query", {"select": [{"name": "n", "agg": "count"}, {"name": "u", "agg": "count_distinct", "column": "pid"}],
                   "where": WHERE})]))
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, "max_rows_per_unit": k, **params}),
                     meta).details
    n = local.grid_rows(d)  # rows + k: a table of 16 rows summed on 16's grid gave twice the sum
    want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
    _equal(want, local.exact_values(d, dist.exact_parts(source, d, salt=SALT), n))


@pytest.mark.parametrize("wide", [False, True])
def test_registration_counts_a_unit_once_whether_or_not_its_files_hold_null_ids(tmp_path, wide):
    """A unit in a file with a null id and in one without is one unit (the files once
    dealt it by two different hashes: counted twice)."""
    from engines.distributed.profile import profile

    scale = 2**40 if wide else 1
    parts = [[14], [2, None, 14, 2, 2], [None], [7, 14]]
    paths = []
    for i, ids in enumerate(parts):
        path = tmp_path / f"p{i}.parquet"
        pq.write_table(pa.table({"pid": pa.array([None if x is None else x * scale for x in ids], pa.int64())}), path)
        paths.append(str(path))
    table = PartitionedTable(paths=tuple(paths), columns=("pid",), num_rows=sum(map(len, parts)), unit_column="pid")
    got = profile(table, [], 10)
    assert (got["n_units"], got["max_rows_per_unit"], got["unit_nulls"]) == (3, 3, 2)
