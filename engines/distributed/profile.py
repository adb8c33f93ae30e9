"""What registering a partitioned table needs to know of its rows, computed on the cluster:
the number of privacy units and the most rows any unit has (counted per unit bucket,
``cluster.by_unit``: every row of a unit in one bucket, so a unit spread over partitions
is counted once; no shuffle, nothing on disk), nulls (and NaN) per column (a ``nullable:
false`` declaration is checked against them), null unit ids, the distinct values of
text columns (proposed as categorical domains, capped: a column with more than
``max_domain`` values is text), and the units holding a value in each text column (a
column whose values are held by few units each names them: proposed as text)."""

from __future__ import annotations

import dataclasses
import functools

import dask
import pyarrow as pa
import pyarrow.compute as pc

from ..columns import null_count, unit_ids
from . import cluster
from .source import PartitionedTable

__all__ = ["profile"]


def _file_profile(table: PartitionedTable, path: str, text_columns: list[str], unit: str | None,
                  cap: int) -> dict:
    data = table.read_file(path)
    out = {"uniques": {}, "unit_nulls": 0, "nulls": {name: null_count(data.column(name)) for name in data.schema.names}}
    for name in text_columns:
        col = data.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        uniq = pc.unique(col.drop_null())
        out["uniques"][name] = None if len(uniq) > cap else uniq.cast(pa.string()).to_pylist()
    if unit:
        out["unit_nulls"] = null_count(data.column(unit))  # NaN is no id either
    return out


def _merge(parts: list[dict], cap: int) -> dict:
    out = {"uniques": {}, "unit_nulls": 0, "nulls": {}}
    for p in parts:
        out["unit_nulls"] += p["unit_nulls"]
        for name, n in p["nulls"].items():
            out["nulls"][name] = out["nulls"].get(name, 0) + n
        for name, values in p["uniques"].items():
            have = out["uniques"].get(name, [])
            if have is None or values is None:
                out["uniques"][name] = None
                continue
            merged = sorted(set(have) | set(values))
            out["uniques"][name] = None if len(merged) > cap else merged
    return out


def _held(data: pa.Table, unit: str, text_columns: list[str]) -> tuple[pa.Table, None]:
    """What a file deals for ``_unit_sizes``: the unit ids and, per text column, whether
    the row holds a value (not the value)."""
    return pa.table({unit: data.column(unit), **{name: pc.is_valid(data.column(name)) for name in text_columns}}), None


def _unit_sizes(data: pa.Table, unit: str, text_columns: list[str]) -> dict:
    col = unit_ids(data.column(unit))
    ids = col.drop_null()
    if len(ids) == 0:
        return {"n_units": 0, "max_rows_per_unit": 0, "carriers": dict.fromkeys(text_columns, 0)}
    counts = pc.value_counts(ids).field("counts")
    valid = pc.is_valid(col)
    carriers = {name: pc.count_distinct(pc.filter(col, pc.and_(valid, data.column(name)))).as_py()
                for name in text_columns}
    return {"n_units": len(counts), "max_rows_per_unit": int(pc.max(counts).as_py()), "carriers": carriers}


def _add_sizes(parts: list[dict]) -> dict:
    return {"n_units": sum(p["n_units"] for p in parts),
            "max_rows_per_unit": max(p["max_rows_per_unit"] for p in parts),
            "carriers": {name: sum(p["carriers"][name] for p in parts) for name in parts[0]["carriers"]}}


def profile(table: PartitionedTable, text_columns: list[str], max_domain: int) -> dict:
    """``{"uniques": {column: sorted values or None}, "nulls": {column: nulls and NaN},
    "unit_nulls", "n_units", "max_rows_per_unit", "carriers": {text column: units holding
    a value}}`` (the last three only with a unit column: every row of a unit is in one
    bucket, so the buckets' counts add up exactly)."""
    unit = table.unit_column
    leaves = [dask.delayed(_file_profile, pure=True)(table.one(i), p, text_columns, unit, max_domain)
              for i, p in enumerate(table.paths)]
    merged = cluster.tree_reduce(leaves, functools.partial(_merge, cap=max_domain))
    todo = {"files": merged}
    if unit:
        units = dataclasses.replace(table, columns=(unit, *text_columns))
        todo["units"] = cluster.tree_reduce(cluster.by_unit(units, unit, _unit_sizes, unit, text_columns, pre=_held,
                                                            pre_args=(unit, text_columns)), _add_sizes)
    done = cluster.compute(dask.delayed(dict)(**todo), table.scheduler, table.retries)
    out = dict(done["files"])
    if unit:
        sizes = done["units"]
        out.update(n_units=int(sizes["n_units"]), max_rows_per_unit=int(sizes["max_rows_per_unit"]),
                   carriers={name: int(n) for name, n in sizes["carriers"].items()})
    return out
