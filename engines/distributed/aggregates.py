"""The aggregates engine on a Dask cluster: the same plan, the same exact aggregate, the
same noise.

Each partition's exact parts are computed by ``engines.aggregates.execute.exact_parts``
(the local engine's own code: predicates, clamping, group codes, contribution bounding,
grid sums, quantile histograms), added up in a tree on the cluster (``combine``: exact),
and the driver (the Celery worker that runs the request) adds the noise once, through
``execute.finish`` with the plan's OpenDP measurements.

Privacy units: when the dataset has a unit column, a unit's rows may be spread over
partitions, so the rows are first shuffled on the unit column (``DataFrame.shuffle``: every
row of a unit lands in one output partition), and the contribution bound is then applied
per output partition: each unit keeps at most k rows of its whole, exactly as locally.
Without a unit column (every row its own unit) the partitions are read as they are.

Grid sums use the whole table's row count (``n_max``) in every partition, so every
partial sum and their total are integers on one grid: the distributed exact sum equals
the local one bit for bit (tests/distributed).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engines.aggregates import execute as local
from engines.types import DatasetMeta, EngineRequest, Plan, Release

from . import cluster
from .source import PartitionedTable

__all__ = ["execute", "graph", "exact_parts", "partition_parts", "job"]


def _parts(data: pa.Table, d: dict, n_max: int) -> dict:
    return local.exact_parts(d, data, n_max, np.random.default_rng())


def partition_parts(table: PartitionedTable, d: dict) -> list:
    """One delayed ``exact_parts`` per partition (after a shuffle on the unit column, if
    the plan bounds contributions per unit)."""
    return cluster.per_partition(table, _parts, d, table.num_rows, unit=d.get("unit_column"))


def graph(table: PartitionedTable, d: dict):
    """The delayed combined exact parts of the whole partitioned table."""
    return cluster.tree_reduce(partition_parts(table, d), local.combine)


def exact_parts(table: PartitionedTable, d: dict, progress=None) -> dict:
    """The combined exact parts of the whole partitioned table, computed on the cluster."""
    return cluster.compute(graph(table, d), table.scheduler, table.retries, progress)


def job(table: PartitionedTable, total) -> dict:
    """What names the cluster job (in the run's officer report: the graph key is what the
    scheduler's logs and dashboard show)."""
    return {"backend": "dask", "scheduler": cluster.public_address(table.scheduler) or "threads in the worker process",
            "graph_key": str(total.key), "partitions": len(table.paths)}


def execute(request: EngineRequest, dataset: DatasetMeta, data: PartitionedTable, plan: Plan, progress) -> Release:
    d = local.check_version(plan)
    progress({"phase": "aggregating on the cluster", "fraction": 0.05})
    total = graph(data, d)
    parts = cluster.compute(total, data.scheduler, data.retries, progress)
    release = local.finish(d, parts, data.num_rows, np.random.default_rng(), progress)
    release.officer_report = {"cluster": job(data, total)}
    return release
