"""Rows per privacy unit, counted on the cluster without dealing any row to a unit bucket.

A unit-level count needs no choice of rows: the local engine's ``units.bounded_count`` is
the sum over units of min(rows, k), and COUNT(DISTINCT unit) the number of units with a
row. So when the unit ids are integers in a compact range (from the files' footers:
``cluster.id_span``), each file's task counts its rows (those passing the ``where``) per
id in one ``bincount`` over the whole range, capped at k (a bitmap when k is 1), and the
files' vectors are added up in a tree (capped again: min(a + b, k) = min(min(a, k) +
min(b, k), k)). What moves between workers is one vector per file (range / 8 bytes at
k = 1, a byte or two per id otherwise), not the rows: ``cluster.by_unit`` sorts, gathers
and sends every row.

Exact whatever the footers say: ids outside the footers' range travel as a list (with
their rows counted by id at the end) and null ids as one unit, as ``units.unit_codes``
counts them. Every task is a pure function of its file or of its inputs, so a retry or
a lost worker recomputes the same vectors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from . import cluster

__all__ = ["MAX_SPAN", "applies", "id_span", "bounded_count", "file_counts", "add", "at_most"]

MAX_SPAN = 1 << 26  # ids per range: a file counted in a bincount of 512 MB at most (a k = 1 bitmap: 64 MB, sent as 8)


def _dtype(cap: int):
    """The narrowest unsigned type holding a + b for two counts capped at ``cap``."""
    for t in (np.uint8, np.uint16, np.uint32):
        if 2 * cap <= np.iinfo(t).max:
            return t
    return np.int64


@dataclasses.dataclass(frozen=True)
class _Counts:
    """One file's (or several files') capped counts: ``vector`` over the range (packed bits
    when the cap is 1), the ids outside it, the rows whose id is null."""
    vector: np.ndarray
    outside: np.ndarray
    null_rows: int


def file_counts(data: pa.Table, unit: str, where: list, lo: int, span: int, cap: int) -> _Counts:
    """The rows of ``data`` passing ``where`` counted per unit id, capped at ``cap``: over
    the ids ``lo`` to ``lo + span - 1`` in a vector (packed bits when ``cap`` is 1), the
    others listed, null ids counted apart."""
    from engines.aggregates.compute import predicate_mask

    col = data.column(unit)
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not pa.types.is_integer(col.type):  # the footers said integers: fail the run rather than miscount
        raise TypeError(f"unit ids of type {col.type} are not integers")
    mask = predicate_mask(data, where) if where else None
    null_rows = 0
    if col.null_count:
        valid = ~col.is_null().to_numpy(zero_copy_only=False)
        null_rows = int(np.count_nonzero(~valid if mask is None else ~valid & mask))
        mask = valid if mask is None else mask & valid
        col = col.fill_null(lo)
    ids = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if mask is not None and not mask.all():
        ids = ids[mask]
    with np.errstate(over="ignore"):
        codes = (ids - np.int64(lo)).view(np.uint64)  # below lo: past 2**63, outside
    inside = codes < np.uint64(span)
    outside = np.empty(0, dtype=np.int64)
    if not inside.all():
        outside, codes = ids[~inside], codes[inside]
    codes = codes.view(np.int64)
    if cap == 1:
        seen = np.zeros(span, dtype=bool)
        seen[codes] = True
        return _Counts(np.packbits(seen), outside, null_rows)
    counts = np.bincount(codes, minlength=span)
    np.minimum(counts, cap, out=counts)
    return _Counts(counts.astype(_dtype(cap)), outside, null_rows)


def add(parts: list[_Counts], cap: int) -> _Counts:
    vector = parts[0].vector.copy()
    for p in parts[1:]:
        if cap == 1:
            vector |= p.vector
        else:
            vector += p.vector  # fits: both are capped at cap and the type holds 2 * cap
            np.minimum(vector, cap, out=vector)
    return _Counts(vector, np.concatenate([p.outside for p in parts]), sum(p.null_rows for p in parts))


def at_most(c: _Counts, k: int) -> bool:
    """Whether no unit has more than ``k`` rows in counts capped above ``k``."""
    if c.null_rows > k or (c.vector.size and int(c.vector.max()) > k):
        return False
    _, per_id = np.unique(c.outside, return_counts=True)
    return not per_id.size or int(per_id.max()) <= k


def _total(c: _Counts, cap: int) -> int:
    if cap == 1:
        inside = int(np.bitwise_count(c.vector).sum(dtype=np.int64))
    else:
        inside = int(c.vector.sum(dtype=np.int64))
    _, per_id = np.unique(c.outside, return_counts=True)
    return inside + int(np.minimum(per_id, cap).sum()) + min(c.null_rows, cap)


def applies(d: dict) -> bool:
    """Whether ``d`` is a count this module computes: one count, not grouped, per unit (k
    rows each, or one per unit for COUNT(DISTINCT unit))."""
    return bool(d.get("unit_column")) and d["kind"] == "count" and not d.get("group_by") and not d.get("group_keys")


def id_span(table, unit: str) -> tuple[int, int] | None:
    """The unit ids' range (``cluster.id_span``) when this module can count over it: compact
    and at most ``MAX_SPAN`` ids; else None."""
    span = cluster.id_span(table, unit)
    return span if span is not None and span[1] - span[0] < MAX_SPAN else None


def bounded_count(table, d: dict, span: tuple[int, int]):
    """A delayed ``{"count": n}``, the local engine's exact parts of the count ``d`` (for
    which ``applies`` holds), over unit ids in ``span`` (``id_span``; ids outside it are
    counted too): sum over units of min(rows passing the where, k)."""
    lo, hi = span
    cap = 1 if d.get("distinct_units") else int(d["max_rows_per_unit"])
    leaves = cluster.per_partition(table, file_counts, d["unit_column"], d.get("where") or [], lo, hi - lo + 1, cap)
    return cluster.tree_reduce(leaves, _Adder(cap), finish=_Total(cap))


@dataclasses.dataclass(frozen=True)
class _Adder:
    """``add`` with its cap, as a picklable callable with a stable token (a task key)."""
    cap: int

    def __call__(self, parts: list[_Counts]) -> _Counts:
        return add(parts, self.cap)


@dataclasses.dataclass(frozen=True)
class _Total:
    """The exact parts of the count from the last vectors: ``{"count": n}``."""
    cap: int

    def __call__(self, parts: list[_Counts]) -> dict:
        return {"count": _total(add(parts, self.cap), self.cap)}
