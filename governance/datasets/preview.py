"""Dummy data: rows generated from a dataset's public schema alone, to try queries on.

``dummy_rows(columns, unit_column, rows, seed)`` looks at nothing but the declared schema
(names, types, bounds, ``integer``, ``decimals``, domains), the requested row count and the seed: never
the stored table, its row count or any statistic of it. So a preview costs no budget and
two datasets with the same schema give the same preview for the same seed. The values
follow no real distribution: numeric columns are uniform within their declared bounds,
categorical ones uniform over their domain. No Django here.
"""

from __future__ import annotations

import math

import numpy as np

MAX_PREVIEW_ROWS = 10_000
MAX_PREVIEW_CELLS = 1_000_000  # rows x columns of one answer
MAX_PREVIEW_BYTES = 32 << 20  # rows x the widest value of each column, about, of one answer
DEFAULT_PREVIEW_ROWS = 100


def max_rows(columns: list[dict]) -> int:
    """The most rows of one preview of a table with these columns: MAX_PREVIEW_CELLS cells
    and about MAX_PREVIEW_BYTES (a row's size taken as its columns' widest values: a
    category's label can be 1,000 characters long, and was 50 MB before that limit)."""
    width = sum(max([len(str(v)) for v in c.get("domain") or []] + [24]) + 4 for c in columns)
    return max(1, min(MAX_PREVIEW_CELLS // max(len(columns), 1), MAX_PREVIEW_BYTES // max(width, 1)))


def dummy_rows(columns: list[dict], unit_column: str | None, rows: int, seed: int) -> dict:
    """``{"columns": [names], "data": [[row], ...], "generated": {name: how}}``."""
    rng = np.random.default_rng(seed)
    names, cols, how = [], [], {}
    for spec in columns:
        name = spec["name"]
        values, note = _column(spec, name == unit_column, rows, rng)
        names.append(name)
        cols.append(values)
        how[name] = note
    data = [list(r) for r in zip(*cols)] if cols else []
    return {"columns": names, "data": data, "generated": how}


def _column(spec: dict, is_unit: bool, rows: int, rng: np.random.Generator) -> tuple[list, str]:
    typ = spec.get("type")
    if is_unit or typ == "unit":
        units = max(1, math.ceil(rows / 3))
        return [int(v) for v in rng.integers(1, units + 1, rows)], f"unit ids drawn from 1..{units}"
    if typ == "numeric":
        lo, hi = spec.get("lower"), spec.get("upper")
        integer = bool(spec.get("integer"))
        if lo is None or hi is None:
            vals = rng.standard_normal(rows)
            if integer:
                return [int(v) for v in np.round(vals * 10)], "no declared bounds: integers around 0"
            return [float(v) for v in vals], "no declared bounds: standard normal"
        lo, hi = float(lo), float(hi)
        if integer and (first := math.ceil(lo)) <= (last := math.floor(hi)):
            if -2**63 <= first and last < 2**63 - 1:
                values = [int(v) for v in rng.integers(first, last + 1, rows)]
            else:  # past int64 (a bound of 2^64 or -1e19): whole floats, as exact as floats are there
                values = [min(last, max(first, int(v))) for v in rng.uniform(lo, hi, rows)]
            return values, f"integers uniform in [{lo:g}, {hi:g}]"
        d = spec.get("decimals")
        if not integer and isinstance(d, int) and 0 <= d <= 15:
            scale = 10.0 ** d  # on the declared grid: k / 10^d, as rounded, inside the bounds
            first, last = _grid_end(lo, scale, d, 1), _grid_end(hi, scale, d, -1)
            if first is not None and last is not None and first <= last:
                return ([round(k / scale, d) for k in rng.integers(first, last + 1, rows).tolist()],
                        f"uniform in [{lo:g}, {hi:g}] to {d} decimal(s)")
        return [float(v) for v in rng.uniform(lo, hi, rows)], f"uniform in [{lo:g}, {hi:g}]"
    if typ == "categorical" and isinstance(spec.get("domain"), list) and spec["domain"]:
        dom = spec["domain"]
        return [dom[i] for i in rng.integers(0, len(dom), rows)], f"uniform over the {len(dom)} declared values"
    return [f"text {i}" for i in rng.integers(0, rows or 1, rows)], "placeholder text"


def _grid_end(bound: float, scale: float, d: int, inward: int) -> int | None:
    """The grid index k nearest ``bound`` whose value round(k / scale, d) lies inside it
    (``inward`` 1: the lower bound, the least k at or above it; -1: the upper bound, the
    largest at or below); None past 2^53 (the grid is not exact there)."""
    k = bound * scale
    if not math.isfinite(k) or abs(k) >= 2**53:
        return None
    k = math.ceil(k) if inward == 1 else math.floor(k)
    inside = (lambda j: round(j / scale, d) >= bound) if inward == 1 else (lambda j: round(j / scale, d) <= bound)
    while not inside(k):
        k += inward
    while inside(k - inward):
        k -= inward
    return k
