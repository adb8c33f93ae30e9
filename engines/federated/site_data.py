"""A site's table: read, checked against the declared schema, split, encoded (site side).

``check_schema`` refuses a table that lacks a declared column: the site then trains
nothing and says which (the table's structure; the server reports the site as refused);
it never encodes a column it was not told about. Values that do not fit their
declaration are encoded as the central engine encodes them (``engines.dpsgd.features``:
text in a numeric column is null, a value outside a categorical domain all zeros, a row
whose target is either unusable) and named in the site's own log only: what the site says
leaves it and reaches the analyst, and a refusal for them was one exact bit about a
chosen column's rows, free of any epsilon ("the rows do not match the declared types and
domains"; before that, "has 3 value(s) outside its declared domain").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engines.dpsgd import features as enc

log = logging.getLogger(__name__)


class SchemaMismatch(ValueError):
    """``str()``: what the site may say (missing columns); ``detail``: everything, for its log."""

    def __init__(self, public: str, detail: str):
        super().__init__(public)
        self.detail = detail


def read_table(path: str) -> pa.Table:
    if path.endswith(".csv"):
        import pyarrow.csv as pcsv

        # a missing cell is null in text columns too, as a registered CSV is read
        return pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(strings_can_be_null=True))
    import pyarrow.parquet as pq

    return pq.read_table(path)


def schema_fingerprint(columns: list[dict]) -> str:
    return hashlib.sha256(json.dumps(columns, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_schema(table: pa.Table, columns: list[dict]) -> list[str]:
    """Refuses a table without a declared column (``SchemaMismatch``); returns what does
    not fit the declarations (for the site's log only)."""
    problems, missing = [], []
    for c in columns:
        name = c["column"]
        if name not in table.column_names:
            missing.append(f"missing column {name!r}")
            continue
        col = table.column(name)
        if c["type"] == "numeric":
            if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
                problems.append(f"column {name!r} is {col.type}, declared numeric")
        else:
            domain = c["domain"]
            values = set(pc.unique(col.drop_null()).to_pylist()) if len(col) else set()
            extra = values - set(domain)
            if extra:
                problems.append(f"column {name!r} has {len(extra)} value(s) outside its declared domain")
    if missing:
        raise SchemaMismatch("; ".join(missing), "; ".join(missing + problems))
    return problems


def prepare(table: pa.Table, spec: dict, seed: bytes | None = None):
    """(x_train, y_train, x_test, y_test): usable rows, split at random (``test_fraction``)."""
    cols = spec["features"] + [spec["target"]]
    for problem in check_schema(table, cols):
        log.warning("the site's table: %s (encoded as the central engine does: null or zeros)", problem)
    x = enc.encode_features(table, spec["features"]).astype(np.float64)
    y, ok = enc.encode_target(table, spec["task"], spec["target"])
    x, y = x[ok], np.asarray(y)[ok].astype(np.int64)
    rng = np.random.default_rng(int.from_bytes(seed or os.urandom(16), "little"))
    test = rng.random(len(x)) < spec["test_fraction"]
    return x[~test], y[~test], x[test], y[test]
