"""Reading a dataset's columns for a worker: Arrow, vectorised, cached per process."""

from __future__ import annotations

import functools

import pyarrow as pa

from .datasets import dataset_path, read_table
from .models import Dataset


def load_columns(ds: Dataset, columns: list[str]) -> pa.Table:
    """The named columns of a dataset's table (the unit column is added when it has one)."""
    cols = list(dict.fromkeys(columns + ([ds.unit_column] if ds.unit_column else [])))
    return _load(str(dataset_path(ds)), ds.sha256, ds.file_format, tuple(cols))


@functools.lru_cache(maxsize=16)
def _load(path: str, sha256: str, fmt: str, columns: tuple[str, ...]) -> pa.Table:
    # Keyed by the file's digest: a re-registered table never serves stale rows.
    if not columns:  # no columns, but the row count
        if fmt == "parquet":  # from the footer: reads no column data
            return read_table(path, fmt, columns=[])
        # CSV: read the narrowest thing and drop it
        first = read_table(path, fmt).column_names[0]
        return read_table(path, fmt, columns=[first]).select([])
    return read_table(path, fmt, columns=list(columns))
