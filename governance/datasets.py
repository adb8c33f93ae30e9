"""Registering tables: storing the file, inferring and validating the schema.

Raw rows never leave this module through the API: only the schema, counts and budget.

The inferred schema is a draft. Numeric bounds are never inferred (the min and max of the
private data are themselves private); categorical domains are proposed from the data
and must be reviewed by the privacy officer before the dataset is activated, because a
domain read from the data can reveal a rare value.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from django.conf import settings
from django.db import transaction

from accounting import POLICIES
from .errors import InvalidDataset
from .models import Budget, Dataset

COLUMN_TYPES = ("numeric", "categorical", "text", "unit")
MAX_DOMAIN = 1000
MAX_DECLARED_DOMAIN = 10_000
MAX_COLUMNS = 2_000
# A Parquet file is compressed: a few hundred kilobytes can decode to gigabytes (a column of
# one repeated value). At registration the decoded table may take at most this many times
# MAX_UPLOAD_BYTES in memory: about what a CSV of MAX_UPLOAD_BYTES decodes to at worst.
MAX_DECODED_RATIO = 4
PARQUET_BATCH_ROWS = 65_536


# --------------------------------------------------------------------------- files


def _detect_format(name: str, head: bytes, declared: str | None) -> str:
    if declared:
        if declared not in ("csv", "parquet"):
            raise InvalidDataset(f"format must be 'csv' or 'parquet', got {declared!r}")
        return declared
    if head[:4] == b"PAR1":
        return "parquet"
    lower = name.lower()
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    return "csv"


def resolve_server_path(path: str) -> Path:
    """A server-side path the officer may register: inside DATASET_IMPORT_DIRS, a regular file."""
    try:
        real = Path(os.path.realpath(path))
        for root in settings.DATASET_IMPORT_DIRS:
            root_real = Path(os.path.realpath(root))
            if real == root_real or root_real in real.parents:
                if not real.is_file():
                    raise InvalidDataset(f"{path!r} is not a file.")
                return real
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a permission
        raise InvalidDataset(f"{path!r} cannot be used: {getattr(e, 'strerror', None) or e}.") from None
    allowed = ", ".join(str(p) for p in settings.DATASET_IMPORT_DIRS)
    raise InvalidDataset(f"{path!r} is outside the directories tables may be registered from ({allowed}).")


def store_file(source, name: str, declared_format: str | None = None) -> tuple[str, str, str]:
    """Copy an uploaded file object or a server path into DATA_DIR.

    Returns (path relative to DATA_DIR, format, sha256). Refuses files over MAX_UPLOAD_BYTES.
    """
    target_dir = settings.DATA_DIR / "datasets"
    target_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=target_dir, suffix=".part")
    head = b""
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                src = open(source, "rb") if isinstance(source, (str, Path)) else source
            except OSError as e:  # a server path that exists but cannot be read
                raise InvalidDataset(f"{str(source)!r} cannot be read: {e.strerror}.") from None
            try:
                if hasattr(src, "seek"):
                    src.seek(0)
                while chunk := src.read(1 << 20):
                    if not head:
                        head = chunk[:8]
                    size += len(chunk)
                    if size > settings.MAX_UPLOAD_BYTES:
                        raise InvalidDataset(f"The table is larger than MAX_UPLOAD_BYTES ({settings.MAX_UPLOAD_BYTES} bytes).")
                    digest.update(chunk)
                    out.write(chunk)
            finally:
                if isinstance(source, (str, Path)):
                    src.close()
        if size == 0:
            raise InvalidDataset("The file is empty.")
        fmt = _detect_format(str(getattr(source, "name", source)), head, declared_format)
        sha = digest.hexdigest()
        rel = f"datasets/{name}-{sha[:12]}.{fmt}"
        os.replace(tmp, settings.DATA_DIR / rel)
        return rel, fmt, sha
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_table(path: Path | str, fmt: str, columns: list[str] | None = None, *,
               max_bytes: int | None = None) -> pa.Table:
    """Read a stored table with Arrow (vectorised; no Python object per row). With
    ``max_bytes``, a Parquet file is read batch by batch and refused once its decoded size
    passes it (registration: a compression bomb must not exhaust the memory)."""
    try:
        if fmt == "parquet" and max_bytes is not None:
            table = _read_parquet_bounded(path, max_bytes)
        elif fmt == "parquet":
            table = pq.read_table(path, columns=columns)
        else:
            opts = pacsv.ConvertOptions(include_columns=columns) if columns else None
            table = pacsv.read_csv(path, convert_options=opts)
        names = table.schema.names  # Arrow decodes names lazily: a binary file fails here
    except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as e:
        raise InvalidDataset(f"The file is not a readable {fmt.upper()} table: {str(e)[:300]}") from e
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise InvalidDataset(f"The table has duplicate column names: {', '.join(dupes)[:300]}")
    if fmt == "csv":
        # Arrow reads cells that are not UTF-8 as a binary column: the file is not CSV text.
        binary = [f.name for f in table.schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
        if binary:
            raise InvalidDataset(f"The file is not UTF-8 CSV text (column(s) {', '.join(binary)[:300]} "
                                 "hold binary data).")
    return table


def _read_parquet_bounded(path, max_bytes: int) -> pa.Table:
    """The whole table, refused as soon as its decoded size could pass ``max_bytes``:
    first by the footer's uncompressed sizes, then batch by batch, with text columns read
    dictionary-encoded so that a dictionary bomb (one long value repeated a million times,
    a few bytes on disk) is measured, not materialised."""
    pf = pq.ParquetFile(path)
    md = pf.metadata
    if md.num_columns > MAX_COLUMNS:  # before decoding anything
        raise InvalidDataset(f"The table has {md.num_columns} columns; at most {MAX_COLUMNS} can be registered.")
    schema = pf.schema_arrow
    check_columns(schema)  # nested columns (a list of long strings could be a bomb too) before any row

    def refuse(size: str):
        return InvalidDataset(
            f"The Parquet file ({os.path.getsize(path)} bytes on disk) decodes to {size} bytes, over the limit of "
            f"{max_bytes} ({MAX_DECODED_RATIO} x MAX_UPLOAD_BYTES): a table too large, or a compression bomb.")

    stored = sum(md.row_group(i).column(j).total_uncompressed_size
                 for i in range(md.num_row_groups) for j in range(md.num_columns))
    if stored > max_bytes:
        raise refuse(f"at least {stored}")
    text = [f.name for f in schema if _is_text(f.type)]
    if text:
        pf = pq.ParquetFile(path, read_dictionary=text)
    batches, total = [], 0
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        total += batch.nbytes + sum(_expanded_bytes(col) for col in batch.columns
                                    if pa.types.is_dictionary(col.type))
        if total > max_bytes:
            raise refuse(f"over {total}")
        batches.append(batch)
    table = pa.Table.from_batches(batches) if batches else schema.empty_table()
    return table.cast(schema) if text else table


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or \
        pa.types.is_large_binary(t)


def _expanded_bytes(col: pa.DictionaryArray) -> int:
    """Bytes the dictionary-encoded ``col`` takes once each row holds its value."""
    if not _is_text(col.type.value_type):
        return 0
    lengths = pc.binary_length(col.dictionary)
    return int(pc.sum(pc.take(lengths, col.indices)).as_py() or 0) + 4 * len(col)


def check_columns(schema: pa.Schema) -> None:
    """Columns the service can hold: at most MAX_COLUMNS, each named (the empty name means
    "no unit column"), no NUL in a name (PostgreSQL cannot store it), no nested types."""
    if len(schema) > MAX_COLUMNS:
        raise InvalidDataset(f"The table has {len(schema)} columns; at most {MAX_COLUMNS} can be registered.")
    problems = {}
    for i, field in enumerate(schema):
        if field.name == "":
            problems[f"column {i + 1}"] = "has no name"
        elif "\x00" in field.name:
            problems[f"column {i + 1}"] = "its name holds a NUL character (\\u0000)"
        elif pa.types.is_nested(field.type) or (pa.types.is_dictionary(field.type)
                                                and pa.types.is_nested(field.type.value_type)):
            problems[field.name] = (f"nested type {str(field.type)[:100]}: only flat columns (numbers, text, "
                                    "booleans, dates) can be registered; flatten it first")
    if problems:
        raise InvalidDataset("The table has columns the service cannot hold: "
                             + "; ".join(f"{k}: {v}" for k, v in list(problems.items())[:10]), errors=problems)


def dataset_path(ds: Dataset) -> Path:
    return settings.DATA_DIR / ds.file


def table_schema(ds: Dataset) -> pa.Schema:
    """The stored table's Arrow schema (Parquet: from the footer, without reading rows)."""
    if ds.execution == Dataset.Execution.DISTRIBUTED:  # recorded from the partitions' footers
        from .partitions import arrow_schema

        return arrow_schema(ds)
    if ds.file_format == "parquet":
        return pq.read_schema(dataset_path(ds))
    return read_table(dataset_path(ds), ds.file_format).schema


# --------------------------------------------------------------------------- schema


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def infer_schema(table: pa.Table, unit_column: str = "") -> dict:
    """A draft schema: types from Arrow; categorical domains proposed from the data."""
    cols = []
    for field in table.schema:
        name, t = field.name, field.type
        if name == unit_column:
            cols.append({"name": name, "type": "unit"})
        elif _is_numeric(t):
            cols.append({"name": name, "type": "numeric", "lower": None, "upper": None,
                         "integer": pa.types.is_integer(t)})
        elif pa.types.is_boolean(t):
            cols.append({"name": name, "type": "categorical", "domain": [False, True]})
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
            col = table.column(name)
            if pa.types.is_dictionary(t):
                col = col.cast(pa.string())
            uniq = pc.unique(col.drop_null())
            if len(uniq) <= MAX_DOMAIN:
                try:
                    values = [str(v) for v in uniq.to_pylist()]
                except UnicodeDecodeError:  # a Parquet string column that is not UTF-8
                    raise InvalidDataset(f"column {name!r} holds text that is not valid UTF-8") from None
                if any("\x00" in v for v in values):
                    raise InvalidDataset(f"column {name!r} holds NUL characters (\\u0000): the file is not text "
                                         "the service can store")
                cols.append({"name": name, "type": "categorical", "domain": sorted(values),
                             "domain_from_data": True})
            else:
                cols.append({"name": name, "type": "text"})
        else:
            cols.append({"name": name, "type": "text"})
    return {"columns": cols}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_schema(schema, table_schema: pa.Schema, unit_column: str, base: dict | None = None) -> dict:
    """Merge officer edits onto ``base`` and check every column; raise with all problems."""
    errors: dict[str, str] = {}
    names = table_schema.names
    types = {f.name: f.type for f in table_schema}
    merged = {c["name"]: dict(c) for c in (base or {"columns": []})["columns"]}
    if schema is not None:
        if isinstance(schema, dict) and "columns" in schema:
            schema = schema["columns"]
        if isinstance(schema, dict):
            schema = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in schema.items()]
        if not isinstance(schema, list):
            raise InvalidDataset("schema must be a list of column specs or {\"columns\": [...]}")
        if len(schema) > MAX_COLUMNS:
            raise InvalidDataset(f"schema has more than {MAX_COLUMNS} columns")
        for spec in schema:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise InvalidDataset("each column spec must be an object with a 'name'")
            name = spec["name"]
            if name not in types:
                errors[name] = "unknown column: the table has no such column"
                continue
            updated = {**merged.get(name, {"name": name}), **spec}
            if spec.get("type") and spec["type"] != merged.get(name, {}).get("type"):
                # A changed type starts from a clean spec of that type.
                updated = {"name": name, **spec}
            if "domain" in spec:
                updated.pop("domain_from_data", None)
            merged[name] = updated
    out = []
    for name in names:
        c = merged.get(name)
        if c is None:
            errors[name] = "column missing from the schema"
            continue
        typ = c.get("type")
        if name == unit_column:
            c = {"name": name, "type": "unit"}
        elif typ not in COLUMN_TYPES:
            errors[name] = f"type must be one of {', '.join(COLUMN_TYPES)}, got {typ!r}"
        elif typ == "unit":
            errors[name] = "only the privacy-unit column can have type 'unit'"
        elif typ == "numeric":
            if not _is_numeric(types[name]) and not pa.types.is_boolean(types[name]):
                errors[name] = f"column holds {types[name]}, not numbers"
            lo, hi = c.get("lower"), c.get("upper")
            if (lo is None) != (hi is None):
                errors[name] = "declare both lower and upper bounds, or neither"
            elif lo is not None:
                if not (_finite(lo) and _finite(hi)):
                    errors[name] = "bounds must be finite numbers"
                elif lo >= hi:
                    errors[name] = f"lower bound {lo} must be below upper bound {hi}"
        elif typ == "categorical":
            dom = c.get("domain")
            if not isinstance(dom, list) or not dom:
                errors[name] = "a categorical column needs a non-empty 'domain' list"
            elif len(dom) > MAX_DECLARED_DOMAIN:
                errors[name] = f"domain longer than {MAX_DECLARED_DOMAIN}"
            elif not all(isinstance(v, (str, int, float, bool)) and not (isinstance(v, float) and not math.isfinite(v))
                         for v in dom):
                errors[name] = "domain values must be strings, numbers or booleans"
            elif len({(type(v).__name__, v) for v in dom}) != len(dom):
                errors[name] = "domain values must be distinct"
        if typ != "numeric" and name not in errors and (c.get("lower") is not None or c.get("upper") is not None):
            errors[name] = f"bounds apply only to numeric columns; this column is {typ}"
        if "sensitive" in c and not isinstance(c["sensitive"], bool):
            errors[name] = "sensitive must be true or false"
        allowed_keys = {"name", "type", "lower", "upper", "integer", "domain", "domain_from_data", "description",
                        "sensitive"}
        extra = set(c) - allowed_keys
        if extra and name not in errors:
            errors[name] = f"unknown key(s): {', '.join(sorted(extra))}"
        out.append(c)
    if errors:
        raise InvalidDataset("The schema has problems.", errors=errors)
    return {"columns": out}


# --------------------------------------------------------------------------- budget


def parse_budget(epsilon, delta, n_units: int) -> tuple[float, float, bool]:
    if isinstance(epsilon, bool) or not _finite(epsilon) or epsilon <= 0:
        raise InvalidDataset(f"budget epsilon must be a finite number > 0, got {epsilon!r}")
    if delta in (None, "auto"):
        return float(epsilon), auto_delta(n_units), True
    if isinstance(delta, str):
        try:
            delta = float(delta)
        except ValueError:
            raise InvalidDataset(f"budget delta must be a number in [0, 1) or \"auto\", got {delta!r}") from None
    if isinstance(delta, bool) or not _finite(delta) or not 0 <= delta < 1:
        raise InvalidDataset(f"budget delta must be a number in [0, 1) or \"auto\", got {delta!r}")
    return float(epsilon), float(delta), False


def auto_delta(n_units: int) -> float:
    """1 / n^1.2: well below 1/n, the level at which one record could be released whole."""
    return 1.0 / max(n_units, 1) ** 1.2


def count_units(table: pa.Table, unit_column: str) -> tuple[int, int, int]:
    n_rows = table.num_rows
    if not unit_column:
        return n_rows, n_rows, 1
    col = table.column(unit_column)
    if col.null_count:
        raise InvalidDataset(f"privacy-unit column {unit_column!r} has {col.null_count} empty values")
    counts = pc.value_counts(col)
    n_units = len(counts)
    max_rows = int(pc.max(counts.field("counts")).as_py()) if n_units else 0
    return n_rows, n_units, max_rows


NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")


def register(*, name: str, created_by, upload=None, path: str | None = None, file_format: str | None = None,
             title: str = "", description: str = "", unit_column: str = "", schema=None,
             budget_epsilon=None, budget_delta="auto", policy: str = "rdp", activate: bool = False,
             execution: str = "local") -> Dataset:
    """Register a table (an uploaded file or a server path) as a dataset. All-or-nothing.
    ``execution="distributed"``: ``path`` names Parquet partitions, registered where they
    are (governance.partitions)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidDataset("name must be 1-100 lowercase letters, digits, '-' or '_'", field="name")
    if Dataset.objects.filter(name=name).exists():
        raise InvalidDataset(f"a dataset named {name!r} already exists", field="name")
    if policy not in POLICIES:
        raise InvalidDataset(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}", field="policy")
    if (upload is None) == (path is None):
        raise InvalidDataset("give exactly one of an uploaded 'file' or a server 'path'")
    if execution not in Dataset.Execution.values:
        raise InvalidDataset(f"execution must be one of {', '.join(Dataset.Execution.values)}", field="execution")
    if execution == Dataset.Execution.DISTRIBUTED:
        if path is None:
            raise InvalidDataset("a distributed dataset is registered from a server 'path' (Parquet partitions: "
                                 "a directory, a file or a URI), not an upload", field="path")
        from . import partitions

        return partitions.register(name=name, created_by=created_by, location=path, title=title,
                                   description=description, unit_column=unit_column, schema=schema,
                                   budget_epsilon=budget_epsilon, budget_delta=budget_delta, policy=policy,
                                   activate=activate)
    source = resolve_server_path(path) if path is not None else upload
    rel, fmt, sha = store_file(source, name, file_format)
    stored = settings.DATA_DIR / rel
    try:
        table = read_table(stored, fmt, max_bytes=MAX_DECODED_RATIO * settings.MAX_UPLOAD_BYTES)
        check_columns(table.schema)
        if table.num_columns == 0 or table.num_rows == 0:
            raise InvalidDataset("The table has no columns or no rows.")
        if unit_column and unit_column not in table.schema.names:
            raise InvalidDataset(f"privacy-unit column {unit_column!r} is not in the table", field="unit_column")
        draft = infer_schema(table, unit_column)
        final = validate_schema(schema, table.schema, unit_column, base=draft)
        n_rows, n_units, max_rows = count_units(table, unit_column)
        eps, delta, delta_auto = parse_budget(budget_epsilon, budget_delta, n_units)
        with transaction.atomic():
            ds = Dataset.objects.create(
                name=name, title=title or name, description=description, file=rel, file_format=fmt, sha256=sha,
                schema=final, unit_column=unit_column, n_rows=n_rows, n_units=n_units, max_rows_per_unit=max_rows,
                budget_epsilon=eps, budget_delta=delta, delta_auto=delta_auto, policy=policy,
                status=Dataset.Status.ACTIVE if activate else Dataset.Status.DRAFT, created_by=created_by)
            Budget.objects.create(dataset=ds)
        return ds
    except BaseException:
        if stored.exists() and not Dataset.objects.filter(file=rel).exists():
            stored.unlink()
        raise


def update(ds: Dataset, *, schema=None, **fields) -> Dataset:
    """Officer edits: schema, budget, policy, texts, allow_non_private. Budget changes lock the budget row."""
    from accounting.costs import Cost

    from .limits import Limit

    with transaction.atomic():
        budget = Budget.objects.select_for_update().get(pk=ds.pk)
        ds = Dataset.objects.get(pk=ds.pk)
        has_entries = ds.ledger.exists()
        if schema is not None:
            ds.schema = validate_schema(schema, table_schema(ds), ds.unit_column, base=ds.schema)
        if "policy" in fields and fields["policy"] != ds.policy:
            if fields["policy"] not in POLICIES:
                raise InvalidDataset(f"policy must be one of {', '.join(POLICIES)}", field="policy")
            if has_entries:
                raise InvalidDataset("the accounting policy cannot change once the ledger has entries: "
                                     "a privacy filter's rule is fixed for its whole life", field="policy")
            ds.policy = fields["policy"]
        if "budget_epsilon" in fields or "budget_delta" in fields:
            eps, delta, auto = parse_budget(fields.get("budget_epsilon", ds.budget_epsilon),
                                            fields.get("budget_delta", "auto" if ds.delta_auto else ds.budget_delta),
                                            ds.n_units)
            old = (ds.budget_epsilon, ds.budget_delta)
            ds.budget_epsilon, ds.budget_delta, ds.delta_auto = eps, delta, auto
            state = Cost.from_json(budget.state)
            if (eps, delta) != old and not Limit.of_dataset(ds).admits(state):
                raise InvalidDataset("the new budget is below what the ledger has already spent", field="budget_epsilon",
                                     spent_epsilon=Limit.of_dataset(ds).spent(state))
        if "approx_delta_share" in fields and fields["approx_delta_share"] != ds.approx_delta_share:
            share = fields["approx_delta_share"]
            if not (isinstance(share, (int, float)) and 0.0 <= share <= 0.9):
                raise InvalidDataset("approx_delta_share must be a number in [0, 0.9]", field="approx_delta_share")
            if has_entries:
                raise InvalidDataset("the delta share for (epsilon, delta) events cannot change once the ledger has "
                                     "entries: a privacy filter's rule is fixed for its whole life",
                                     field="approx_delta_share")
            ds.approx_delta_share = float(share)
        if "release_quantum_ms" in fields and fields["release_quantum_ms"] != ds.release_quantum_ms:
            import logging  # an officer's change of a privacy measure, logged beside the admin's own history

            logging.getLogger(__name__).warning(
                "dataset %s: release clock changed from %s to %s ms (None = the server default)", ds.name,
                ds.release_quantum_ms, fields["release_quantum_ms"])
        for key in ("title", "description", "allow_non_private", "release_quantum_ms", "pld_certification"):
            if key in fields:
                setattr(ds, key, fields[key])
        ds.save()
        return ds
