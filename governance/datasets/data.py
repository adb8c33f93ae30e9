"""Reading a stored dataset: its columns for a worker (Arrow, vectorised, cached per process), its schema."""

from __future__ import annotations

import functools
import hashlib
import os

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import InvalidDataset
from ..models import Dataset
from .files import dataset_path, read_table


class StoredTableChanged(InvalidDataset):
    """A local dataset's stored file is no longer the one registered (its digest differs)."""

    code = "dataset.file_changed"


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
    check_digest(path, ds.sha256)
    if not cols and ds.file_format == "csv":
        # Only the row count: a CSV has no footer to read it from, so read its first column
        # (named in the schema, which lists the file's columns in order) and drop it.
        first = ds.schema["columns"][0]["name"]
        return _load(path, ds.sha256, ds.file_format, (first,), ds.unit_column).select([])
    return _load(path, ds.sha256, ds.file_format, tuple(cols), ds.unit_column)


@functools.lru_cache(maxsize=16)
def _load(path: str, sha256: str, fmt: str, columns: tuple[str, ...], unit_column: str) -> pa.Table:
    # Keyed by the file's digest: a re-registered table never serves stale rows. A Parquet
    # read of no columns takes the row count from the footer.
    return read_table(path, fmt, columns=list(columns), unit_column=unit_column)


def check_digest(path: str, sha256: str) -> None:
    """Raise ``StoredTableChanged`` unless the stored file is the one registered: rows
    appended, edited or truncated since (an operator, a restored backup) are never
    answered on as if registered. Hashed once per process per file version (its inode, size,
    modification time and change time): a stat per request after that. The change time
    moves with any write and no one can set it back (a probe's same-size edit with the
    modification time put back was answered on by a running worker)."""
    st = os.stat(path)
    _digest_matches(path, sha256, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=64)
def _digest_matches(path: str, sha256: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != sha256:  # raised, so not cached: a file put back is read again
        raise StoredTableChanged(f"the stored table {path} is not the one registered: its SHA-256 is "
                                 f"{digest.hexdigest()}, registered {sha256}: put the registered copy back (from a backup), or "
                                 "register the changed table as a new dataset (its own name and budget)")


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
    return read_table(dataset_path(ds), ds.file_format, unit_column=ds.unit_column).schema
