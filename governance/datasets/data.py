"""Reading a stored dataset: its columns for a worker (Arrow, vectorised, cached per process), its schema."""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.parquet as pq

from ..models import Dataset
from .files import dataset_path, read_table


def load_columns(ds: Dataset, columns: list[str]) -> pa.Table:
    """The named columns of a dataset's table (the unit column is added when it has one).
    A distributed dataset's partitions are checked (footers only) and handed over unread,
    as an ``engines.distributed.PartitionedTable`` (governance.datasets.partitions). A
    federated dataset's rows stay at its sites: an ``engines.federated.Federation`` instead
    (governance.datasets.federated)."""
    if ds.execution == Dataset.Execution.DISTRIBUTED:
        from .partitions import open_columns

        return open_columns(ds, columns)
    if ds.execution == Dataset.Execution.FEDERATED:  # no rows here: how a run reaches the sites
        from .federated import federation

        return federation(ds)
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


def table_schema(ds: Dataset) -> pa.Schema:
    """The stored table's Arrow schema (Parquet: from the footer, without reading rows)."""
    if ds.execution == Dataset.Execution.DISTRIBUTED:  # recorded from the partitions' footers
        from .partitions import arrow_schema

        return arrow_schema(ds)
    if ds.execution == Dataset.Execution.FEDERATED:  # the declared schema: the sites' tables are never seen
        from .federated import arrow_schema as declared

        return declared(ds.schema.get("columns", []))
    if ds.file_format == "parquet":
        return pq.read_schema(dataset_path(ds))
    return read_table(dataset_path(ds), ds.file_format).schema
