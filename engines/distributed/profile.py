"""What registering a partitioned table needs to know of its rows, computed on the cluster:
the number of privacy units and the most rows any unit has (a group-by on the unit column,
so a unit spread over partitions is counted once), null unit ids, and the distinct values
of text columns (proposed as categorical domains, capped: a column with more than
``max_domain`` values is text)."""

from __future__ import annotations

import functools

import dask
import pyarrow as pa
import pyarrow.compute as pc

from . import cluster
from .source import PartitionedTable

__all__ = ["profile"]


def _file_profile(table: PartitionedTable, path: str, text_columns: list[str], unit: str | None,
                  cap: int) -> dict:
    data = table.read_file(path)
    out = {"uniques": {}, "unit_nulls": 0}
    for name in text_columns:
        col = data.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        uniq = pc.unique(col.drop_null())
        out["uniques"][name] = None if len(uniq) > cap else uniq.cast(pa.string()).to_pylist()
    if unit:
        out["unit_nulls"] = data.column(unit).null_count
    return out


def _merge(parts: list[dict], cap: int) -> dict:
    out = {"uniques": {}, "unit_nulls": 0}
    for p in parts:
        out["unit_nulls"] += p["unit_nulls"]
        for name, values in p["uniques"].items():
            have = out["uniques"].get(name, [])
            if have is None or values is None:
                out["uniques"][name] = None
                continue
            merged = sorted(set(have) | set(values))
            out["uniques"][name] = None if len(merged) > cap else merged
    return out


def profile(table: PartitionedTable, text_columns: list[str], max_domain: int) -> dict:
    """``{"uniques": {column: sorted values or None}, "unit_nulls", "n_units",
    "max_rows_per_unit"}`` (the last two only with a unit column)."""
    unit = table.unit_column
    leaves = [dask.delayed(_file_profile, pure=True)(table, p, text_columns, unit, max_domain) for p in table.paths]
    merged = cluster.tree_reduce(leaves, functools.partial(_merge, cap=max_domain))
    todo = {"files": merged}
    if unit:
        import dask.dataframe as dd

        frame = dd.read_parquet(list(table.paths), columns=[unit], dtype_backend="pyarrow")
        sizes = frame[unit].value_counts(split_out=max(frame.npartitions // 4, 1))
        todo["n_units"] = sizes.size.to_delayed()
        todo["max_rows_per_unit"] = sizes.max().to_delayed()
    done = cluster.compute(dask.delayed(dict)(**todo), table.scheduler, table.retries)
    out = dict(done["files"])
    if unit:
        out["n_units"] = int(done["n_units"])
        out["max_rows_per_unit"] = int(done["max_rows_per_unit"]) if out["n_units"] else 0
    return out
