"""Rows to tensors, using only the declared schema (public): never a statistic of the data.

- numeric feature: clamped to its declared [lower, upper] and scaled to [-1, 1]; a null
  becomes 0 (the middle of the range);
- categorical feature: one-hot over its declared domain; a null or a value outside the
  domain becomes all zeros;
- target: binary 0/1 (value > threshold, or value in the positive set), a class index
  over the declared domain, or (regression) the value scaled to [0, 1] by its declared
  bounds. Rows whose target is null or outside the domain are not used.

The same spec is saved with the model (``preprocessing``) so that anyone holding the
model can prepare new rows identically.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from engines.aggregates.compute import category_codes

from .params import input_width


def _values(table: pa.Table, name: str):
    return table.column(name).to_pandas()


def _codes(table: pa.Table, name: str, domain: list) -> np.ndarray:
    """Index of each value in the declared domain; -1 for a null or an undeclared value
    (matched as the aggregates engine matches: ``category_codes``)."""
    return category_codes(table, name, list(domain))


def encode_features(table: pa.Table, features: list[dict]) -> np.ndarray:
    n = table.num_rows
    out = np.zeros((n, input_width(features)), dtype=np.float32)
    j = 0
    for f in features:
        if f["type"] == "numeric":
            lo, hi = f["lower"], f["upper"]
            x = pd.to_numeric(_values(table, f["column"]), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            x = (np.clip(x, lo, hi) - lo) / (hi - lo) * 2.0 - 1.0
            out[:, j] = np.nan_to_num(x, nan=0.0)
            j += 1
        else:
            codes = _codes(table, f["column"], f["domain"])
            ok = codes >= 0
            out[np.nonzero(ok)[0], j + codes[ok]] = 1.0
            j += len(f["domain"])
    return out


def encode_target(table: pa.Table, task: str, target: dict) -> tuple[np.ndarray, np.ndarray]:
    """(labels, usable-row mask)."""
    if target["type"] == "numeric":
        x = pd.to_numeric(_values(table, target["column"]), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        ok = ~np.isnan(x)
        if task == "binary":
            return (np.nan_to_num(x) > target["threshold"]).astype(np.float32), ok
        lo, hi = target["lower"], target["upper"]
        return ((np.clip(np.nan_to_num(x, nan=lo), lo, hi) - lo) / (hi - lo)).astype(np.float32), ok
    codes = _codes(table, target["column"], target["domain"])
    ok = codes >= 0
    if task == "binary":
        return (_codes(table, target["column"], target["positive"]) >= 0).astype(np.float32), ok
    return np.where(ok, codes, 0), ok


def unit_codes(table: pa.Table, unit_column: str | None) -> np.ndarray:
    if not unit_column:
        return np.arange(table.num_rows, dtype=np.int64)
    codes, _ = pd.factorize(_values(table, unit_column), use_na_sentinel=False)
    return codes.astype(np.int64)


def preprocessing(spec) -> dict:
    """What a model user needs to prepare rows (saved with the model)."""
    return {"features": spec.features, "task": spec.task, "target": spec.target,
            "scaling": "numeric: clamp to [lower, upper], then 2 (x - lower) / (upper - lower) - 1, null -> 0; "
                       "categorical: one-hot over domain in order, null or unknown -> zeros",
            "output": {"binary": "one logit; P(positive) = sigmoid(logit)",
                       "multiclass": "one logit per class, in target.classes order",
                       "regression": "prediction in [0, 1] scaled: lower + y (upper - lower)"}[spec.task]}


def random_inputs(features: list[dict], n: int, seed: int = 0) -> np.ndarray:
    """``n`` points drawn from the declared domain alone, encoded as ``encode_features``
    encodes rows (numeric uniform on [-1, 1], one category per categorical column): inputs
    that hold nothing of the data, to see what a released model does with them."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, input_width(features)), dtype=np.float32)  # (np.eye(k) was k x k float64: 800 MB at 10,000)
    j = 0
    for f in features:
        if f["type"] == "numeric":
            out[:, j] = rng.uniform(-1.0, 1.0, n)
            j += 1
        else:
            k = len(f["domain"])
            out[np.arange(n), j + rng.integers(0, k, n)] = 1.0
            j += k
    return out
