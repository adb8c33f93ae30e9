"""Columns to small integer codes and back, from the declared schema only.

A numeric column becomes ``bins`` equal-width bins of its declared [lower, upper]
(values clamped) plus one code for null; a categorical column its index in the declared
domain plus one code for null or a value outside the domain.

Decoding draws a numeric value *inside* its bin, never at the bin's midpoint (which
would make synthetic rows recognisable and every value repeat): first a cell of the
column's **fine grid** (one cell per integer for an integer column with at most
``MAX_INTEGER_CELLS`` values, else ``FINE`` cells per bin), with probability from the
column's noisy fine histogram (a measurement of its own, planned and charged), then a
value uniformly within that cell. So a skewed column (incomes in a wide declared range)
keeps its shape inside each bin.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

FINE = 10  # fine cells per bin (non-integer or wide integer columns)
MAX_INTEGER_CELLS = 1000


def size(col: dict) -> int:
    return (col["bins"] if col["type"] == "numeric" else len(col["domain"])) + 1


def _integer_grid(col: dict) -> tuple[int, int] | None:
    """(first integer, number of integers) when the fine grid is one cell per integer."""
    if not col.get("integer"):
        return None
    first, last = math.ceil(col["lower"]), math.floor(col["upper"])
    n = last - first + 1
    return (first, n) if 1 <= n <= MAX_INTEGER_CELLS else None


def fine_size(col: dict) -> int:
    grid = _integer_grid(col)
    return grid[1] if grid else col["bins"] * FINE


def _coarse(x: np.ndarray, col: dict) -> np.ndarray:
    lo, hi, b = col["lower"], col["upper"], col["bins"]
    return np.clip(np.floor((np.clip(x, lo, hi) - lo) / (hi - lo) * b), 0, b - 1).astype(np.int64)


def fine_encode(df: pd.DataFrame, col: dict) -> np.ndarray:
    """Fine-grid cell of each non-null value of a numeric column."""
    x = pd.to_numeric(df[col["column"]], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    x = np.clip(x[~np.isnan(x)], col["lower"], col["upper"])
    grid = _integer_grid(col)
    if grid:
        return np.clip(np.round(x) - grid[0], 0, grid[1] - 1).astype(np.int64)
    n = fine_size(col)
    return np.clip(np.floor((x - col["lower"]) / (col["upper"] - col["lower"]) * n), 0, n - 1).astype(np.int64)


def _fine_cells(col: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per fine cell: its bin, and the [start, end) of its values."""
    grid = _integer_grid(col)
    if grid:
        values = grid[0] + np.arange(grid[1], dtype=np.float64)
        return _coarse(values, col), values, values
    n, lo, hi = fine_size(col), col["lower"], col["upper"]
    start = lo + np.arange(n) * (hi - lo) / n
    return np.arange(n) // FINE, start, start + (hi - lo) / n


def encode(df: pd.DataFrame, columns: list[dict]) -> dict[str, np.ndarray]:
    out = {}
    for col in columns:
        values = df[col["column"]]
        if col["type"] == "numeric":
            lo, hi, b = col["lower"], col["upper"], col["bins"]
            x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            code = np.floor((np.clip(x, lo, hi) - lo) / (hi - lo) * b)
            code = np.where(np.isnan(x), b, np.clip(code, 0, b - 1))
        else:
            domain = col["domain"]
            code = pd.Categorical(values.where(values.isin(domain)), categories=domain).codes.astype(np.int64)
            code = np.where(code < 0, len(domain), code)
        out[col["column"]] = code.astype(np.int64)
    return out


def decode(codes: dict[str, np.ndarray], columns: list[dict], rng: np.random.Generator,
           fine: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """Values from codes; ``fine`` holds each numeric column's noisy fine histogram."""
    out = {}
    for col in columns:
        c = np.asarray(codes[col["column"]], dtype=np.int64)
        if col["type"] == "numeric":
            out[col["column"]] = pd.Series(_numeric_values(c, col, rng, (fine or {}).get(col["column"])),
                                           dtype="float64")
        else:
            domain = np.array(col["domain"] + [None], dtype=object)
            out[col["column"]] = pd.Series(domain[np.minimum(c, len(col["domain"]))], dtype=object)
    return pd.DataFrame(out)


def _numeric_values(c: np.ndarray, col: dict, rng: np.random.Generator, hist) -> np.ndarray:
    b = col["bins"]
    bin_of, start, end = _fine_cells(col)
    weights = np.ones(len(bin_of)) if hist is None else np.clip(np.asarray(hist, dtype=float), 0, None)
    x = np.full(len(c), np.nan)
    for code in np.unique(c[c < b]):
        rows = np.flatnonzero(c == code)
        cells = np.flatnonzero(bin_of == code)
        if len(cells) == 0:  # a bin narrower than one integer: the nearest integer cell
            mid = col["lower"] + (code + 0.5) * (col["upper"] - col["lower"]) / b
            cells = np.array([int(np.argmin(np.abs(start - mid)))])
        w = weights[cells]
        p = w / w.sum() if w.sum() > 0 else np.full(len(cells), 1.0 / len(cells))
        pick = cells[rng.choice(len(cells), size=len(rows), p=p)]
        x[rows] = start[pick] + rng.random(len(rows)) * (end[pick] - start[pick])
    return np.clip(x, col["lower"], col["upper"])
