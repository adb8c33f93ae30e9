"""Reading a dataset's columns for a worker: Arrow, vectorised, cached per process."""

from __future__ import annotations

import functools

import pyarrow as pa

from .dataset_files import dataset_path, read_table
from .models import Dataset


def load_columns(ds: Dataset, columns: list[str]) -> pa.Table:
    """The named columns of a dataset's table (the unit column is added when it has one).
    A distributed dataset's partitions are checked (footers only) and handed over unread,
    as an ``engines.distributed.PartitionedTable`` (governance.partitions)."""
    if ds.execution == Dataset.Execution.DISTRIBUTED:
        from .partitions import open_columns

        return open_columns(ds, columns)
    cols = list(dict.fromkeys(columns + ([ds.unit_column] if ds.unit_column else [])))
    path = str(dataset_path(ds))
    if not cols and ds.file_format == "csv":
        # Only the row count: a CSV has no footer to read it from, so read its first column
        # (named in the schema, which lists the file's columns in order) and drop it.
        first = ds.schema["columns"][0]["name"]
        return _load(path, ds.sha256, ds.file_format, (first,)).select([])
    return _load(path, ds.sha256, ds.file_format, tuple(cols))


@functools.lru_cache(maxsize=16)
def _load(path: str, sha256: str, fmt: str, columns: tuple[str, ...]) -> pa.Table:
    # Keyed by the file's digest: a re-registered table never serves stale rows. A Parquet
    # read of no columns takes the row count from the footer.
    return read_table(path, fmt, columns=list(columns))
