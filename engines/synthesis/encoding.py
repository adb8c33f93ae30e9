"""Columns to small integer codes and back, from the declared schema only.

A numeric column becomes ``bins`` equal-width bins of its declared [lower, upper]
(values clamped) plus one code for null; a categorical column its index in the declared
domain plus one code for null or a value outside the domain. Decoding draws a numeric
value uniformly *inside* its bin (never the bin's midpoint, which would make synthetic
rows recognisable and every value repeat), rounded down for integer columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def size(col: dict) -> int:
    return (col["bins"] if col["type"] == "numeric" else len(col["domain"])) + 1


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


def decode(codes: dict[str, np.ndarray], columns: list[dict], rng: np.random.Generator) -> pd.DataFrame:
    out = {}
    for col in columns:
        c = np.asarray(codes[col["column"]], dtype=np.int64)
        if col["type"] == "numeric":
            lo, hi, b = col["lower"], col["upper"], col["bins"]
            width = (hi - lo) / b
            x = lo + (np.minimum(c, b - 1) + rng.random(len(c))) * width
            if col.get("integer"):
                x = np.floor(x)
            x = np.clip(x, lo, hi)
            out[col["column"]] = pd.Series(np.where(c == b, np.nan, x), dtype="float64")
        else:
            domain = np.array(col["domain"] + [None], dtype=object)
            out[col["column"]] = pd.Series(domain[np.minimum(c, len(col["domain"]))], dtype=object)
    return pd.DataFrame(out)
