"""Distributed datasets: Parquet partitions registered where they are, run on Dask.

A dataset whose ``execution`` is ``distributed`` keeps no copy in DATA_DIR: ``location``
names a directory (or one file) under DATASET_IMPORT_DIRS, or an object-store prefix
under DATASET_IMPORT_URIS; ``partitions`` is its manifest (each file's name relative to
the location, its rows and bytes) and ``arrow_schema`` its Arrow schema, both written at
registration; ``sha256`` is the digest of the manifest.

A run (``open_columns``, called by ``governance.datasets.data.load_columns``) checks the
location (still inside DATASET_IMPORT_DIRS, not replaced by a link) and every partition's
footer against the manifest before any row is read: a missing partition, one with another
schema (or row count), or one now reached through a symbolic link or twice (a hard link)
fails the request *before the read*, so the reservation is refunded (README, charging
rules). Registration refuses such links too (``source.list_partitions``). The engine
then gets an ``engines.distributed.PartitionedTable`` and runs on the Dask cluster
(DASK_SCHEDULER_ADDRESS).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
from django.conf import settings
from django.db import transaction

from engines.distributed import PartitionedTable, PartitionError, cluster, source

from ..core.errors import ClusterUnavailable, InvalidDataset
from ..ledger import trail
from ..models import Budget, Dataset

CLUSTER_RETRY_AFTER = 30  # seconds, on a 503 cluster.unavailable

__all__ = ["PartitionInvalid", "resolve_location", "register", "open_columns", "arrow_schema"]


class PartitionInvalid(InvalidDataset):
    """A partition of a distributed dataset is missing or differs from its manifest."""

    code = "dataset.partition_invalid"


def resolve_location(location: str) -> str:
    """A location the officer may register: a file or directory inside
    DATASET_IMPORT_DIRS, or a URI under a prefix in DATASET_IMPORT_URIS."""
    if not isinstance(location, str) or not location or "\x00" in location:
        raise InvalidDataset("path must be a non-empty server path or URI", field="path")
    if "://" in location:
        for prefix in settings.DATASET_IMPORT_URIS:
            root = prefix.rstrip("/") + "/"
            if not location.startswith(root):
                continue
            rest = location[len(root):]
            # pyarrow decodes %2e%2e to ".." and reads ?endpoint_override=... as options
            if ".." in unquote(rest).split("/") or ".." in rest.split("/") or any(c in rest for c in "?#"):
                raise InvalidDataset(f"{location!r} must name a path under its prefix: no '..' (also "
                                     f"percent-encoded), no '?' or '#'.", field="path")
            return location
        allowed = ", ".join(settings.DATASET_IMPORT_URIS) or "none are configured"
        raise InvalidDataset(f"{location!r} is outside the URI prefixes tables may be registered from "
                             f"(DATASET_IMPORT_URIS: {allowed}).", field="path")
    try:
        real = Path(os.path.realpath(location))
        for root in settings.DATASET_IMPORT_DIRS:
            root_real = Path(os.path.realpath(root))
            if real == root_real or root_real in real.parents:
                if not (real.is_file() or real.is_dir()):
                    raise InvalidDataset(f"{location!r} is neither a file nor a directory.", field="path")
                return str(real)
    except (OSError, ValueError) as e:
        raise InvalidDataset(f"{location!r} cannot be used: {getattr(e, 'strerror', None) or e}.",
                             field="path") from None
    allowed = ", ".join(str(p) for p in settings.DATASET_IMPORT_DIRS)
    raise InvalidDataset(f"{location!r} is outside the directories tables may be registered from ({allowed}).",
                         field="path")


def arrow_schema(ds: Dataset) -> pa.Schema:
    return source.schema_from_json(ds.arrow_schema)


def _table(ds_location: str, manifest: list[dict], columns, rows: int, unit: str | None,
           unit_ranges=..., max_rows_per_unit: int | None = None) -> PartitionedTable:
    return PartitionedTable(paths=tuple(source.join(ds_location, p["path"]) for p in manifest),
                            columns=tuple(columns), num_rows=rows, unit_column=unit,
                            scheduler=settings.DASK_SCHEDULER_ADDRESS, retries=settings.DASK_TASK_RETRIES,
                            unit_ranges=unit_ranges, max_rows_per_unit=max_rows_per_unit,
                            expected=tuple((p["rows"], p.get("bytes"), p.get("footer"), p.get("mtime_ns"))
                                           for p in manifest))


def open_columns(ds: Dataset, columns: list[str]) -> PartitionedTable:
    """The partitions of a distributed dataset, checked against its manifest (footers
    only: no row is read), as the engine's ``data``. Raises ``InvalidDataset``
    (code ``dataset.partition_invalid``) naming the partition and what differs."""
    cols = list(dict.fromkeys(columns + ([ds.unit_column] if ds.unit_column else [])))
    try:  # still inside DATASET_IMPORT_DIRS, and not moved by a link since registration
        here = resolve_location(ds.location)
    except InvalidDataset as e:
        raise PartitionInvalid(f"the dataset's location cannot be used now: {e.detail}", problem="location") from None
    if here != ds.location:
        raise PartitionInvalid("the dataset's location now leads elsewhere (a symbolic link put in its place since "
                               "registration); register the files again where they are", problem="location")
    try:
        rows, unit_ranges = source.check_manifest(ds.location, ds.partitions, arrow_schema(ds),
                                                  range_of=ds.unit_column or None)
    except PartitionError as e:
        raise PartitionInvalid(str(e), partition=e.path, problem=e.problem) from None
    if rows != ds.n_rows:  # pragma: no cover - each file's rows are checked; kept as a guard
        raise PartitionInvalid(f"the partitions hold {rows} rows, registered with {ds.n_rows}")
    return _table(ds.location, ds.partitions, cols, rows, ds.unit_column or None, unit_ranges,
                  ds.max_rows_per_unit if ds.unit_column else None)


def _manifest(location: str) -> tuple[str, list[dict], pa.Schema]:
    try:
        base, names = source.list_partitions(location)
        schema, manifest = None, []
        for name in names:
            found, rows, digest = source.footer(source.join(base, name), name)
            if schema is None:
                schema = found
            else:
                diff = source.differences(schema, found)
                if diff:
                    raise PartitionError(f"partition {name!r} has a different schema from {names[0]!r}: "
                                         + "; ".join(diff[:10]), name, "schema")
            path = source.join(base, name)
            size = os.path.getsize(path) if "://" not in base else None
            manifest.append({"path": name, "rows": rows, "bytes": size, "footer": digest,
                             "mtime_ns": source.mtime_ns(path)})
    except PartitionError as e:
        raise PartitionInvalid(str(e), field="path") from None
    return base, manifest, schema


def _digest(manifest: list[dict], schema_json: str) -> str:
    return hashlib.sha256(json.dumps({"partitions": manifest, "schema": schema_json},
                                     sort_keys=True).encode()).hexdigest()


def _draft_table(schema: pa.Schema, uniques: dict[str, list | None], cap: int) -> pa.Table:
    """A stand-in for ``dataset_schema.infer_schema``, which reads a column's distinct values
    (``pc.unique``, nulls dropped) and types: each text column holds its distinct values
    (or ``cap + 1`` distinct placeholders when there were more, so it is typed text), padded
    with nulls; other columns are nulls. Never stored, never shown."""
    longest = max([len(v) if v is not None else cap + 1 for v in uniques.values()] + [0])
    cols = {}
    for field in schema:
        values = uniques.get(field.name, ...)
        if values is ...:
            cols[field.name] = pa.nulls(longest, field.type)
            continue
        if values is None:
            values = [f"\x01{i}" for i in range(cap + 1)]
        cols[field.name] = pa.array(values + [None] * (longest - len(values)), pa.string())
    return pa.table(cols)


def register(*, name: str, created_by, location: str, title: str = "", description: str = "",
             unit_column: str = "", schema=None, budget_epsilon=None, budget_delta="auto", policy: str = "rdp",
             activate: bool = False) -> Dataset:
    """Register Parquet partitions as a distributed dataset (``registry.register`` has
    already checked the name and policy). Reads footers, then counts units and distinct
    values of text columns on the cluster."""
    from engines.distributed.profile import profile

    from . import budget
    from .files import check_columns
    from .schema import MAX_DOMAIN, check_nulls, infer_schema, validate_schema

    location = resolve_location(location)
    base, manifest, schema_found = _manifest(location)
    check_columns(schema_found)
    n_rows = sum(p["rows"] for p in manifest)
    if len(schema_found) == 0 or n_rows == 0:
        raise InvalidDataset("The table has no columns or no rows.")
    if unit_column and unit_column not in schema_found.names:
        raise InvalidDataset(f"privacy-unit column {unit_column!r} is not in the table", field="unit_column")
    # the columns whose distinct values are proposed as a domain, as the local registration
    # proposes them: text, and a time of day or a duration as the text it is matched as
    text = [f.name for f in schema_found if f.name != unit_column and (
        pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_dictionary(f.type)
        or pa.types.is_time(f.type) or pa.types.is_duration(f.type))]
    table = _table(base, manifest, [f.name for f in schema_found], n_rows, unit_column or None)
    try:
        prof = profile(table, text, MAX_DOMAIN)
    except PartitionError as e:
        raise PartitionInvalid(str(e), field="path") from None
    except Exception as e:
        if cluster.lost(e):  # out of reach, no worker, or lost while it read: the registration's
            # HTTP call waited until the scheduler went away, then was a 500
            raise ClusterUnavailable(f"The Dask cluster is unavailable, nothing was registered ({e}); retry later",
                                     retry_after=CLUSTER_RETRY_AFTER) from None
        if isinstance(e, (OSError, pa.ArrowException)):
            raise InvalidDataset(f"The partitions cannot be read: {str(e)[:300]}", field="path") from None
        raise
    if unit_column and prof["unit_nulls"]:
        raise InvalidDataset(f"privacy-unit column {unit_column!r} has {prof['unit_nulls']} empty values (null or NaN)")
    n_units = prof["n_units"] if unit_column else n_rows
    # the units holding a value in each text column (the rows with one, without a unit column)
    carriers = prof["carriers"] if unit_column else {
        name: n_rows - prof["nulls"].get(name, 0) for name in schema_found.names}
    draft = infer_schema(_draft_table(schema_found, prof["uniques"], MAX_DOMAIN), unit_column, carriers)
    final = validate_schema(schema, schema_found, unit_column, base=draft)
    check_nulls(final, prof["nulls"])
    max_rows = prof["max_rows_per_unit"] if unit_column else 1
    eps, delta, delta_auto = budget.parse_budget(budget_epsilon, budget_delta, n_units)
    schema_json = source.schema_to_json(schema_found)
    with transaction.atomic():
        ds = Dataset.objects.create(
            name=name, title=title or name, description=description, file="", file_format=Dataset.Format.PARQUET,
            sha256=_digest(manifest, schema_json), schema=final, unit_column=unit_column, n_rows=n_rows,
            n_units=n_units, max_rows_per_unit=max_rows, budget_epsilon=eps, budget_delta=delta,
            delta_auto=delta_auto, policy=policy, execution=Dataset.Execution.DISTRIBUTED, location=base,
            partitions=manifest, arrow_schema=schema_json,
            status=Dataset.Status.ACTIVE if activate else Dataset.Status.DRAFT, created_by=created_by)
        Budget.objects.create(dataset=ds)
        trail.record_registration(ds)
    return ds
