"""The aggregates engine on a Dask cluster: the same plan, the same exact aggregate, the
same noise.

Each partition's exact parts are computed by ``engines.aggregates.execute.exact_parts``
(the local engine's own code: predicates, clamping, group codes, contribution bounding,
grid sums, quantile histograms), added up in a tree on the cluster (``combine``: exact),
and the driver (the Celery worker that runs the request) adds the noise once, through
``execute.finish`` with the plan's OpenDP measurements.

Privacy units: when the dataset has a unit column, a unit's rows may be spread over
partitions. No shuffle: each file's task keeps the rows that pass the ``where``
predicates (and only the columns the aggregate reads after them) and deals them into
unit buckets by the unit id (``cluster.by_unit``: ranges of integer ids, else a hash);
each bucket's task gets its piece of every file (in memory, as task results) and runs
``exact_parts`` on the rows of its units, all of them. The bound keeps the k rows of
smallest salted hash per unit (``units.bound_by_content``) with one salt drawn by the
driver for the run: a function of the unit's own rows, so the rows kept are those the
local engine keeps with the same salt, whatever the partitioning, the number of
workers, retries or lost workers (every task is pure: a re-run computes the same
output). Without a unit column (every row its own unit) the partitions are read as
they are.

A count per unit (without groups: sum over units of min(rows, k), whichever rows are
kept) on integer unit ids in a compact range is counted per unit id instead, without
dealing any row (``unit_counts``). When no unit can exceed k (the registered most rows of
one unit), the plan runs row-level with the rows counted per unit beside (``_within_bound``).
When the files' footers say each file holds its own range of unit ids (a table written
sorted or partitioned by unit), each file is bounded and aggregated alone, as a unit
bucket is, and the ids each file really holds decide whether that answer stands
(``_within_files``). A try that does not hold is thrown away and the rows are dealt.

Grid sums use the plan's bound on the summed values (``local.grid_rows``) in every partition, so every
partial sum and their total are integers on one grid: the distributed exact sum equals
the local one bit for bit (tests/distributed).
"""

from __future__ import annotations

import dataclasses

import dask
import numpy as np
import pyarrow as pa

from engines.aggregates import execute as local
from engines.types import DatasetMeta, EngineRequest, Plan, Release

from . import cluster, unit_counts
from .source import PartitionedTable

__all__ = ["execute", "graph", "exact_parts", "partition_parts", "job", "new_salt"]


def _parts(data: pa.Table, d: dict, n_max: int, salt: int | None) -> dict:
    return local.exact_parts(d, data, n_max, np.random.default_rng(), salt=salt)


def _where(data: pa.Table, where: list, keep: list | None = None) -> tuple[pa.Table, np.ndarray | None]:
    """The rows that pass the predicates (the only ones bounding may keep; ``by_unit``
    deals no other row into the unit buckets), as a mask (None: every row), and of the
    columns only the ``keep`` ones, when given (the columns only the predicates read are
    not dealt either)."""
    from engines.aggregates.compute import predicate_mask

    mask = predicate_mask(data, where)
    return (data.select(keep) if keep else data), (None if mask.all() else mask)


def _after_where(d: dict, unit: str) -> tuple[dict, list | None]:
    """The plan the unit buckets run on rows their files' tasks filtered already, and the
    columns it reads: the where dropped (every row passes it), the unit, aggregate and
    group columns kept. Plans whose columns are not those (several aggregates, composite
    groups) keep theirs and their where (re-applied: a no-op on filtered rows)."""
    if d["kind"] == "query" or d.get("group_keys"):
        return d, None
    return {**d, "where": []}, [c for c in dict.fromkeys((unit, d.get("column"), d.get("group_by"))) if c]


def new_salt() -> int:
    """The run's bounding salt (drawn once, by the driver)."""
    return int(np.random.default_rng().integers(0, 2**63))


def partition_parts(table: PartitionedTable, d: dict, salt: int | None = None) -> list:
    """One delayed ``exact_parts`` per file, or, if the plan bounds contributions per unit,
    per unit bucket (``cluster.by_unit``; ``salt``: the bounding salt, drawn if None)."""
    unit = d.get("unit_column")
    if not unit:
        return cluster.per_partition(table, _parts, d, local.grid_rows(d), None)
    counts = _unit_counts(table, d)
    if counts is not None:
        return [counts]
    salt = new_salt() if salt is None else salt
    if not d.get("where"):
        return cluster.by_unit(table, unit, _parts, d, local.grid_rows(d), salt)
    bucket_plan, keep = _after_where(d, unit)
    return cluster.by_unit(table, unit, _parts, bucket_plan, local.grid_rows(d), salt, pre=_where,
                           pre_args=(d["where"], keep))


def _unit_counts(table: PartitionedTable, d: dict):
    """The delayed exact parts of a count per unit, or of a query of nothing but such counts
    (``COUNT(*), COUNT(DISTINCT unit)`` without GROUP BY), counted per unit id without
    dealing rows (``unit_counts``); None for any other plan or unit ids."""
    if not _counted(d):
        return None
    span = unit_counts.id_span(table, d["unit_column"])
    if span is None:
        return None
    if d["kind"] != "query":
        return unit_counts.bounded_count(table, d, span)
    return dask.delayed(_named, pure=True)([unit_counts.bounded_count(table, s, span) for s in d["aggregates"]])


def _counted(d: dict) -> bool:
    """Whether ``d`` is a count per unit, or a query of nothing but such counts."""
    subs = (d.get("aggregates") or []) if d["kind"] == "query" else [d]
    return bool(subs) and all(unit_counts.applies(s) for s in subs)


def _named(parts: list[dict]) -> dict:
    """The parts of a query's aggregates under their indexes (``local.exact_parts``' names)."""
    return {f"{i}:{name}": v for i, p in enumerate(parts) for name, v in p.items()}


def _within_bound(table: PartitionedTable, d: dict):
    """A delayed ``(exact parts, held)``: ``d`` computed row-level, each file read once and
    its rows (those passing the where) counted per unit id beside (``unit_counts``, capped
    at k + 1), and whether every unit has at most k rows. If it has, bounding keeps every
    row, so the row-level parts are the local engine's exact parts, bit for bit; if not,
    they are thrown away. None (no such try) unless the dataset's registered most rows of
    one unit (``table.max_rows_per_unit``: only a hint, the counts decide) is at most k,
    the unit ids are integers in a compact range, and the plan is one aggregate that
    bounds rows only (not a query, not distinct units) and not a count per unit (which
    ``unit_counts`` answers without the row-level parts)."""
    unit, hint = d.get("unit_column"), table.max_rows_per_unit
    if not unit or hint is None or d["kind"] == "query" or d.get("distinct_units") or unit_counts.applies(d):
        return None  # (a count per unit: counted per unit id, no try needed)
    k = int(d["max_rows_per_unit"])
    span = unit_counts.id_span(table, unit) if hint <= k else None
    if span is None:
        return None
    lo, hi = span
    leaves = cluster.per_partition(table, _file_within, {**d, "unit_column": None}, local.grid_rows(d), unit, lo,
                                   hi - lo + 1, k)
    return cluster.tree_reduce(leaves, _AddWithin(k), finish=_CheckWithin(k))


def _file_within(data: pa.Table, row_plan: dict, n_max: int, unit: str, lo: int, span: int, k: int) -> tuple:
    parts = local.exact_parts(row_plan, data, n_max, np.random.default_rng())
    return parts, unit_counts.file_counts(data, unit, row_plan["where"], lo, span, k + 1)


@dataclasses.dataclass(frozen=True)
class _AddWithin:
    """Adds files' ``(parts, counts)`` (a picklable callable with a stable token: a task's
    function)."""
    k: int

    def __call__(self, pieces: list[tuple]) -> tuple:
        return (local.combine([p for p, _ in pieces]),
                unit_counts.add([c for _, c in pieces], self.k + 1))


@dataclasses.dataclass(frozen=True)
class _CheckWithin(_AddWithin):
    """The last sum: ``(parts, whether no unit has more than k rows)``."""

    def __call__(self, pieces: list[tuple]) -> tuple:
        parts, counts = super().__call__(pieces)
        return parts, unit_counts.at_most(counts, self.k)


def _within_files(table: PartitionedTable, d: dict, salt: int):
    """A delayed ``(exact parts, held)``: ``d`` bounded and aggregated in each file alone
    (``exact_parts`` with the run's salt, as a unit bucket runs it), each file's smallest
    and largest unit id read from its rows beside. Held when those ranges do not overlap
    and at most one file has null ids: then no unit has rows in two files, each file holds
    its units whole, and the parts are the local engine's with that salt, bit for bit. The
    footers' statistics only decide whether to try (``PartitionedTable.ranges_of``: integer
    ids, each file's range apart from the others'); the ids read decide whether it holds, so a writer's wrong
    statistics cannot let a unit count twice. None: no try."""
    unit = d["unit_column"]
    ranges = table.ranges_of(unit)
    if ranges is None or not _apart([r for r in ranges if r]):
        return None
    leaves = cluster.per_partition(table, _file_units, d, local.grid_rows(d), salt, unit)
    return cluster.tree_reduce(leaves, _add_files, finish=_check_files)


def _apart(ranges: list) -> bool:
    """Whether no two (min, max) ranges overlap."""
    ranges = sorted(ranges)
    return all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def _file_units(data: pa.Table, d: dict, n_max: int, salt: int, unit: str) -> tuple:
    """One file's exact parts, bounded within the file; ``[(min, max)]`` of its unit ids
    (``[]`` without any); 1 if it has a null id, else 0."""
    import pyarrow.compute as pc

    col = data.column(unit)
    if not pa.types.is_integer(col.type):  # the footers said integers: fail rather than guess
        raise TypeError(f"unit ids of type {col.type} are not integers")
    parts = local.exact_parts(d, data, n_max, np.random.default_rng(), salt=salt)
    lo_hi = pc.min_max(col)
    ids = [] if lo_hi["min"].as_py() is None else [(lo_hi["min"].as_py(), lo_hi["max"].as_py())]
    return parts, ids, int(col.null_count > 0)


def _add_files(pieces: list[tuple]) -> tuple:
    """Files' ``_file_units`` together: parts added, ranges listed, null files counted."""
    return (local.combine([p for p, _, _ in pieces]), [r for _, ranges, _ in pieces for r in ranges],
            sum(n for _, _, n in pieces))


def _check_files(pieces: list[tuple]) -> tuple:
    """The last sum: ``(parts, whether every unit's rows are in one file)``."""
    parts, ranges, null_files = _add_files(pieces)
    return parts, _apart(ranges) and null_files <= 1


def graph(table: PartitionedTable, d: dict, salt: int | None = None):
    """The delayed combined exact parts of the whole partitioned table (every plan: the
    rows dealt into unit buckets when bounding may drop some)."""
    return cluster.tree_reduce(partition_parts(table, d, salt), local.combine)


def _tries(table: PartitionedTable, d: dict, salt: int):
    """The tries before dealing rows, cheapest first: each a delayed ``(parts, held)`` or
    None (not tried). A count per unit has none past the first: ``unit_counts`` answers it."""
    yield _within_bound(table, d)
    if d.get("unit_column") and not _counted(d):
        yield _within_files(table, d, salt)


def _run(table: PartitionedTable, d: dict, salt: int | None, progress) -> tuple[dict, object]:
    """The exact parts on the cluster, and the delayed value whose key names the job: the
    row-level try first when it may hold (``_within_bound``), then the per-file try
    (``_within_files``), else (or if neither held) ``graph``. Nothing of a try that did not
    hold is kept: it released nothing."""
    if d.get("unit_column") and salt is None:
        salt = new_salt()
    for within in _tries(table, d, salt):
        if within is not None:
            parts, held = cluster.compute(within, table.scheduler, table.retries, progress)
            if held:
                return parts, within
    total = graph(table, d, salt)
    return cluster.compute(total, table.scheduler, table.retries, progress), total


def exact_parts(table: PartitionedTable, d: dict, progress=None, salt: int | None = None) -> dict:
    """The combined exact parts of the whole partitioned table, computed on the cluster
    (with ``salt`` the rows a unit over k keeps are the local engine's with that salt)."""
    return _run(table, d, salt, progress)[0]


def job(table: PartitionedTable, total) -> dict:
    """What names the cluster job (in the run's officer report: the graph key is what the
    scheduler's logs and dashboard show)."""
    return {"backend": "dask", "scheduler": cluster.public_address(table.scheduler) or "threads in the worker process",
            "graph_key": str(total.key), "partitions": len(table.paths)}


def execute(request: EngineRequest, dataset: DatasetMeta, data: PartitionedTable, plan: Plan, progress) -> Release:
    d = local.check_version(plan)
    progress({"phase": "aggregating on the cluster", "fraction": 0.05})
    parts, total = _run(data, d, None, progress)
    release = local.finish(d, parts, local.grid_rows(d), np.random.default_rng(), progress)
    release.officer_report = {"cluster": job(data, total)}
    return release
