"""The aggregates engine on a real local Dask cluster: the exact aggregate (before noise)
equals the local engine's on the same rows, for every kind, with where / group_by, clamping
and per-unit contribution bounds (a unit's rows spread over partitions); the plan is the
local engine's; the release goes through the same noise."""

import dataclasses
import decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engines import plugins
from engines.aggregates import execute as local
from engines.distributed import PartitionedTable
from engines.distributed import aggregates as dist
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS, write_partitions

# Above any unit's row count in the test table: bounding keeps every row. Below it, which
# rows a unit keeps is the salted-hash rule (units.bound_by_content): the same rows on
# the cluster as locally with the same salt.
K_ALL = 40
SALT = 0x5EED_1234_ABCD

QUERIES = [
    ("count", {}),
    ("count", {"where": [{"column": "age", "op": ">=", "value": 40}], "max_rows_per_unit": 1}),
    ("count", {"group_by": "site", "max_rows_per_unit": K_ALL}),
    ("sum", {"column": "income", "max_rows_per_unit": K_ALL}),
    ("sum", {"column": "age", "group_by": "flag", "max_rows_per_unit": K_ALL}),
    ("mean", {"column": "income", "group_by": "site", "max_rows_per_unit": K_ALL}),
    ("variance", {"column": "age", "where": [{"column": "site", "op": "in", "value": ["north", "east"]}],
                  "max_rows_per_unit": K_ALL}),
    ("histogram", {"column": "site", "max_rows_per_unit": K_ALL}),
    ("histogram", {"column": "age", "bins": [18, 30, 45, 60, 75, 90], "max_rows_per_unit": K_ALL}),
    ("quantile", {"column": "income", "q": 0.5, "group_by": "site", "max_rows_per_unit": K_ALL}),
    # k below the units' row counts: which rows are kept matters
    ("count", {"group_by": "site", "max_rows_per_unit": 1}),
    ("sum", {"column": "income", "group_by": "flag", "max_rows_per_unit": 2}),
    ("mean", {"column": "age", "where": [{"column": "age", "op": ">=", "value": 30}], "max_rows_per_unit": 1}),
    ("variance", {"column": "income", "max_rows_per_unit": 2}),
    ("histogram", {"column": "age", "bins": [18, 30, 45, 60, 75, 90], "max_rows_per_unit": 1}),
    ("quantile", {"column": "income", "q": 0.25, "max_rows_per_unit": 1}),
    # a where on columns the aggregate does not read (the files' tasks deal only the others)
    ("histogram", {"column": "age", "bins": [18, 30, 45, 60, 75, 90], "max_rows_per_unit": 1,
                   "where": [{"column": "site", "op": "in", "value": ["north", "east"]}]}),
    ("count", {"group_by": "site", "where": [{"column": "income", "op": ">=", "value": 30000}],
               "max_rows_per_unit": 2}),
    # several aggregates over composite and binned groups, OR / NOT, distinct units (a SQL query)
    ("query", {"select": [{"name": "n", "agg": "count"}, {"name": "m", "agg": "mean", "column": "income"},
                          {"name": "p", "agg": "quantile", "column": "age", "q": 0.5},
                          {"name": "u", "agg": "count_distinct", "column": "pid"}],
               "group_by": [{"column": "site"}, {"column": "age", "width": 10, "multiplier": 10}],
               "where": [{"or": [[{"column": "age", "op": "<", "value": 40}],
                                 [{"not": [{"column": "site", "op": "==", "value": "north"}]}]]}],
               "max_rows_per_unit": 2}),
    # COUNT(column): its own rows (not null) beside the others' (the query's where is shared)
    ("count", {"column": "income", "max_rows_per_unit": 1}),
    ("count", {"column": "income", "group_by": "site", "max_rows_per_unit": 2}),
    ("query", {"select": [{"name": "paid", "agg": "count", "column": "income"}, {"name": "n", "agg": "count"},
                          {"name": "a", "agg": "mean", "column": "age"}],
               "where": [{"column": "age", "op": ">=", "value": 30}], "max_rows_per_unit": 2}),
    ("query", {"select": [{"name": "paid", "agg": "count", "column": "income"}, {"name": "n", "agg": "count"}],
               "max_rows_per_unit": 1}),  # counts only: counted per unit id, each on its own rows
    # two columns compared row by row (the other column is read too), a where the aggregate does not read
    ("count", {"where": [{"column": "income", "op": ">", "value": {"column": "age"}}], "max_rows_per_unit": 2}),
    ("histogram", {"column": "site", "max_rows_per_unit": 1,
                   "where": [{"not": [{"column": "age", "op": ">=", "value": {"column": "income"}}]}]}),
]


def _meta(table):
    pids = table.column("pid").to_numpy()
    return DatasetMeta(name="t", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                       n_units=len(np.unique(pids)), delta=1e-6, distributed=True)


def _source(manifest, scheduler, table):
    return PartitionedTable(paths=tuple(p["path"] for p in manifest), columns=tuple(table.column_names),
                            num_rows=table.num_rows, unit_column="pid", scheduler=scheduler)


def _equal(a, b):
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


@pytest.mark.parametrize("kind,params", QUERIES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(QUERIES)])
def test_it_computes_the_local_engines_exact_aggregate(dask_cluster, partitioned, kind, params):
    table, manifest, _ = partitioned
    plan = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table))
    d = plan.details
    n = local.grid_rows(d)
    want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
    got = local.exact_values(d, dist.exact_parts(_source(manifest, dask_cluster, table), d, salt=SALT), n)
    _equal(want, got)


@pytest.mark.parametrize("kind,params", [
    ("count", {"group_by": "age", "max_rows_per_unit": 1}),
    ("query", {"select": [{"name": "n", "agg": "count"}, {"name": "m", "agg": "mean", "column": "income"}],
               "group_by": [{"column": "site"}, {"column": "age"}], "max_rows_per_unit": 2}),
    # COUNT(DISTINCT age), COUNT(DISTINCT site): the values seen, summed over the buckets per value
    ("query", {"select": [{"name": "ages", "agg": "count_distinct", "column": "age"},
                          {"name": "sites", "agg": "count_distinct", "column": "site"}], "max_rows_per_unit": 1}),
    ("query", {"select": [{"name": "s", "group": 0}, {"name": "ages", "agg": "count_distinct", "column": "age"}],
               "group_by": [{"column": "site"}], "where": [{"column": "income", "op": "<", "value": 20_000}],
               "max_rows_per_unit": 2}),
])
def test_an_integer_key_groups_the_same_on_the_cluster(dask_cluster, partitioned, kind, params):
    """GROUP BY an integer column (every integer in its bounds a group; ages outside them in none)."""
    table, manifest, _ = partitioned
    columns = {**UNIT_COLUMNS, "age": {**UNIT_COLUMNS["age"], "integer": True}}
    meta = dataclasses.replace(_meta(table), columns=columns)
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), meta).details
    n = local.grid_rows(d)
    want_parts = local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT)
    got_parts = dist.exact_parts(_source(manifest, dask_cluster, table), d, salt=SALT)
    _equal(want_parts, got_parts)  # (a distinct count's: its rows per value, not only the values seen)
    want, got = local.exact_values(d, want_parts, n), local.exact_values(d, got_parts, n)
    _equal(want, got)
    if kind == "count":  # k = 1: each unit counted once, in the group of its kept row, if its age is in [18, 90]
        ages = table.column("age").to_numpy()
        assert want["count"].shape == (73,) and 0 < want["count"].sum() < len(np.unique(table.column("pid")))
        assert want["count"].sum() <= int(((ages >= 18) & (ages <= 90)).sum())


def test_it_bounds_a_units_rows_across_partitions(dask_cluster, partitioned):
    """k = 1: the count is the number of units, though each unit's rows sit in several
    partitions (bounding per partition without the shuffle would count them again)."""
    table, manifest, _ = partitioned
    plan = plugins.plan("aggregates", EngineRequest("count", {"epsilon": 1.0, "max_rows_per_unit": 1}), _meta(table))
    units = len(np.unique(table.column("pid").to_numpy()))
    per_file = sum(len(np.unique(pq.read_table(p["path"], columns=["pid"]).column("pid").to_numpy()))
                   for p in manifest)
    assert per_file > units  # units do span partitions in this table
    parts = dist.exact_parts(_source(manifest, dask_cluster, table), plan.details)
    assert parts["count"] == units


def test_it_runs_without_a_cluster_on_threads(partitioned):
    table, manifest, _ = partitioned
    plan = plugins.plan("aggregates", EngineRequest("sum", {"epsilon": 1.0, "column": "income",
                                                            "max_rows_per_unit": K_ALL}), _meta(table))
    d = plan.details
    n = local.grid_rows(d)
    want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
    _equal(want, local.exact_values(d, dist.exact_parts(_source(manifest, "", table), d, salt=SALT), n))


def test_it_releases_through_the_same_noise_and_report(dask_cluster, partitioned):
    table, manifest, _ = partitioned
    meta = _meta(table)
    req = EngineRequest("mean", {"epsilon": 1e6, "column": "age", "group_by": "site", "max_rows_per_unit": K_ALL})
    plan = plugins.plan("aggregates", req, meta)
    seen = []
    got = plugins.run("aggregates", req, meta, _source(manifest, dask_cluster, table), plan, seen.append)
    want = plugins.run("aggregates", req, meta, table, plan, lambda u: None)
    assert seen[-1] == {"phase": "done", "fraction": 1.0}
    assert got.result.keys() == want.result.keys()
    for g, w in zip(got.result["groups"], want.result["groups"]):
        assert g["key"] == w["key"]
        assert g["value"] == pytest.approx(w["value"], abs=1e-3)


def _kept(units, codes, values, k, salt, order):
    """The multiset of (unit, code, value) that bound_by_content keeps on the rows in ``order``."""
    import pyarrow as pa

    from engines.aggregates import units as unit_rules

    ids = pa.array(units[order])
    dense, n_units = unit_rules.unit_codes(pa.table({"u": ids}), "u")
    mask = np.ones(len(order), dtype=bool)
    kept, dropped = unit_rules.bound_by_content(mask, dense, n_units, k, salt, ids, codes[order], values[order])
    assert np.bincount(dense[kept], minlength=n_units).max() <= k
    rows = sorted(zip(units[order][kept].tolist(), codes[order][kept].tolist(), values[order][kept].tolist()))
    return rows, dropped


@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_rows_a_unit_keeps_depend_on_its_rows_only(k):
    """Any order of the rows (any partitioning) keeps the same multiset per unit; another
    salt keeps other rows; duplicated rows are interchangeable."""
    rng = np.random.default_rng(k)
    n = 20_000
    units = np.array([f"u{i}" for i in rng.integers(0, 3_000, n)], dtype=object)
    codes = rng.integers(0, 4, n)
    values = np.round(rng.random(n) * 10, 1)  # many equal values: ties on content
    first, dropped = _kept(units, codes, values, k, 99, np.arange(n))
    assert dropped > 0
    for seed in range(3):
        assert _kept(units, codes, values, k, 99, np.random.default_rng(seed).permutation(n)) == (first, dropped)
    assert _kept(units, codes, values, k, 100, np.arange(n))[0] != first


def test_a_tie_at_the_threshold_is_broken_by_the_full_key_then_content():
    from engines.aggregates.units import _smallest_k

    hu = np.array([0, 0, 0, 1, 1, 1], dtype=np.int32)
    # unit 0: rows 0 and 1 share the key and differ in value; unit 1: rows 3 and 4 share
    # the key's high bits only (one bit holds the unit codes, so 4 >> 1 == 5 >> 1)
    key = np.array([5, 5, 3, 5, 4, 9], dtype=np.uint64)
    values = np.array([2.0, 1.0, 7.0, 0.0, 8.0, 1.0])
    codes = np.zeros(6, dtype=np.int64)
    assert _smallest_k(hu, key, codes, values, 2).tolist() == [False, True, True, True, True, False]
    assert _smallest_k(hu, key, codes, values, 1).tolist() == [False, False, True, False, True, False]


ID_KINDS = {
    "compact": lambda pid: pid,  # range buckets (cluster._id_ranges)
    "wide": lambda pid: pid * 7_919 * 2**30 - 2**62,  # integers spread wide: hashed buckets
    "text": lambda pid: np.char.add("p-", pid.astype(str)),  # strings: hashed buckets
    # stored as Parquet integers, not integers (their footers' statistics are dates and
    # decimals): hashed buckets, never a range read from the statistics
    "dates": lambda pid: pa.array(pid.astype("datetime64[D]")),
    "decimals": lambda pid: pa.array([decimal.Decimal(int(p)) / 100 for p in pid], pa.decimal128(12, 2)),
}


@pytest.mark.parametrize("ids", list(ID_KINDS))
def test_every_way_of_dealing_units_keeps_the_local_engines_rows(dask_cluster, partitioned, tmp_path, ids):
    """Units dealt by range (compact integer ids) or by hash (wide integers, strings): the
    same exact aggregate as the local engine, k below the units' row counts."""
    from engines.distributed import cluster

    base, _, _ = partitioned
    table = base.set_column(0, "pid", pa.array(ID_KINDS[ids](base.column("pid").to_numpy())))
    manifest = write_partitions(table, tmp_path / ids, 5)
    source = _source(manifest, dask_cluster, table)
    assert (cluster._id_ranges(source, "pid", 5) is not None) == (ids == "compact")
    for kind, params in [("count", {"max_rows_per_unit": 1}),
                         ("sum", {"column": "income", "group_by": "flag", "max_rows_per_unit": 2}),
                         ("quantile", {"column": "income", "q": 0.25, "max_rows_per_unit": 1})]:
        d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), _meta(table)).details
        n = local.grid_rows(d)
        want = local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0), salt=SALT), n)
        _equal(want, local.exact_values(d, dist.exact_parts(source, d, salt=SALT), n))


def test_range_buckets_give_every_id_one_bucket_whatever_the_footers_said():
    """An id outside the footers' range (statistics a writer got wrong) or a null still
    lands in one bucket, the same in every file; ids in range spread over every bucket."""
    from engines.distributed import cluster

    ids = pa.array([-(2**63), -5, 0, 9, 10, 99, 100, 2**63 - 1, None], type=pa.int64())
    got = cluster._bucket_of(ids, 10, (0, 10))
    assert got.tolist() == [9, 9, 0, 0, 1, 9, 9, 9, 0]
    spread = cluster._bucket_of(pa.array(np.arange(1000)), 10, (0, 100))
    assert np.bincount(spread).tolist() == [100] * 10
