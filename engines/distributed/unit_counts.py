"""Rows per privacy unit, counted on the cluster without dealing any row to a unit bucket.

A unit-level count needs no choice of rows: the local engine's ``units.bounded_count`` is
the sum over units of min(rows, k), and COUNT(DISTINCT unit) the number of units with a
row. So when the unit ids are integers in a compact range (from the files' footers:
``cluster.id_span``), each file's task counts its rows (those passing the ``where``) per
id, capped at k: a bitmap over the range when k is 1, else one ``bincount`` over the
range or, when the range is over ``SPARSE`` times the file's rows (many files), its
sorted ids with their counts. The files' counts are added up in a tree (capped again:
min(a + b, k) = min(min(a, k) + min(b, k), k)). What moves between workers is one
vector per file (range / 8 bytes at k = 1; a byte or two per id, or 5-6 bytes per id
present, otherwise), not the rows: ``cluster.by_unit`` sorts, gathers and sends every
row.

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

MAX_SPAN = 1 << 26  # ids per range: a k = 1 bitmap of 64 MB while a file is counted (sent as 8)
SPARSE = 4  # a file's counts are sparse when the range is over SPARSE times its rows


def _dtype(cap: int):
    """The narrowest unsigned type holding a + b for two counts capped at ``cap``."""
    for t in (np.uint8, np.uint16, np.uint32):
        if 2 * cap <= np.iinfo(t).max:
            return t
    return np.int64


@dataclasses.dataclass(frozen=True)
class _Counts:
    """One file's (or several files') counts per unit id over the range of ``span`` ids,
    capped: ``vector`` (dense; packed bits when the cap is 1) or, when the ids present are
    few beside the range, ``codes`` (sorted, distinct) with their ``counts``; the ids
    outside the range; the rows whose id is null."""
    span: int
    vector: np.ndarray | None
    codes: np.ndarray | None
    counts: np.ndarray | None
    outside: np.ndarray
    null_rows: int

    def capped(self) -> np.ndarray:
        """The capped counts of the ids present (and zeros): what is summed or checked."""
        return self.vector if self.vector is not None else self.counts


def file_counts(data: pa.Table, unit: str, where: list, lo: int, span: int, cap: int) -> _Counts:
    """The rows of ``data`` passing ``where`` counted per unit id, capped at ``cap``: over
    the ids ``lo`` to ``lo + span - 1`` in a vector (packed bits when ``cap`` is 1) or, if
    the range is over ``SPARSE`` times the rows, as the sorted ids present with their
    counts; the others listed, null ids counted apart."""
    from engines.aggregates.compute import predicate_mask
    from engines.aggregates.units import integer_ids

    col = data.column(unit)
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    ids = integer_ids(col, null=lo)
    if ids is None:  # the footers said integers: fail the run rather than miscount
        raise TypeError(f"unit ids of type {col.type} are not integers")
    mask = predicate_mask(data, where) if where else None
    null_rows = 0
    if col.null_count:
        valid = ~col.is_null().to_numpy(zero_copy_only=False)
        null_rows = int(np.count_nonzero(~valid if mask is None else ~valid & mask))
        mask = valid if mask is None else mask & valid
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
        return _Counts(span, np.packbits(seen), None, None, outside, null_rows)
    if span > SPARSE * len(codes):  # a sort of the rows costs less than a pass over the range
        s = np.sort(codes)
        starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1]))) if s.size else np.zeros(0, np.int64)
        n = np.diff(np.append(starts, s.size))
        np.minimum(n, cap, out=n)
        return _Counts(span, None, s[starts].astype(np.uint32), n.astype(_dtype(cap)), outside, null_rows)
    counts = np.bincount(codes, minlength=span)
    np.minimum(counts, cap, out=counts)
    return _Counts(span, counts.astype(_dtype(cap)), None, None, outside, null_rows)


def add(parts: list[_Counts], cap: int) -> _Counts:
    """The counts of ``parts`` (the same range) together, capped at ``cap``: dense if any
    part is, or if the ids present fill over 1 / ``SPARSE`` of the range; else sparse."""
    span = parts[0].span
    outside, nulls = np.concatenate([p.outside for p in parts]), sum(p.null_rows for p in parts)
    dense = [p.vector for p in parts if p.vector is not None]
    sparse = [p for p in parts if p.vector is None]
    if cap == 1:  # bitmaps only
        vector = dense[0].copy()
        for v in dense[1:]:
            vector |= v
        return _Counts(span, vector, None, None, outside, nulls)
    if dense or SPARSE * sum(len(p.codes) for p in sparse) > span:
        vector = dense[0].copy() if dense else np.zeros(span, dtype=_dtype(cap))
        for v in dense[1:]:
            vector += v  # fits: both are capped at cap and the type holds 2 * cap
            np.minimum(vector, cap, out=vector)
        for p in sparse:  # its codes are distinct: one += per id
            vector[p.codes] = np.minimum(vector[p.codes] + p.counts, cap)
        return _Counts(span, vector, None, None, outside, nulls)
    codes, inverse = np.unique(np.concatenate([p.codes for p in sparse]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([p.counts for p in sparse]), minlength=len(codes))
    return _Counts(span, None, codes, np.minimum(counts, cap).astype(_dtype(cap)), outside, nulls)


def _per_outside_id(c: _Counts) -> np.ndarray:
    """The rows of each id outside the range."""
    return np.unique(c.outside, return_counts=True)[1]


def at_most(c: _Counts, k: int) -> bool:
    """Whether no unit has more than ``k`` rows in counts capped above ``k``."""
    values, outside = c.capped(), _per_outside_id(c)
    return (c.null_rows <= k and (not values.size or int(values.max()) <= k)
            and (not outside.size or int(outside.max()) <= k))


def _total(c: _Counts, cap: int) -> int:
    if cap == 1:
        inside = int(np.bitwise_count(c.vector).sum(dtype=np.int64))
    else:
        inside = int(c.capped().sum(dtype=np.int64))
    return inside + int(np.minimum(_per_outside_id(c), cap).sum()) + min(c.null_rows, cap)


def applies(d: dict) -> bool:
    """Whether ``d`` is a count this module computes: one count, not grouped, per unit (k
    rows each, or one per unit for COUNT(DISTINCT unit))."""
    return (bool(d.get("unit_column")) and d["kind"] == "count" and not d.get("group_by") and not d.get("group_keys")
            and d.get("distinct_of") is None)


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
