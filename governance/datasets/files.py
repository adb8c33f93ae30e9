"""A dataset's file: stored on upload or found under the import directory, read back as
an Arrow table with bounded memory (a compressed Parquet file can decode to gigabytes),
and its columns checked. Raw rows leave this module only to the worker that runs a
request; the API sees schemas and counts.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from django.conf import settings


from ..core.errors import InvalidDataset, UploadTooLarge
from ..core.processes import files_now
from ..models import Dataset

MAX_COLUMNS = 2_000
# A Parquet file is compressed: a few hundred kilobytes can decode to gigabytes (a column of
# one repeated value). At registration the decoded table may take at most this many times
# MAX_UPLOAD_BYTES in memory: about what a CSV of MAX_UPLOAD_BYTES decodes to at worst.
MAX_DECODED_RATIO = 4
PARQUET_BATCH_ROWS = 65_536
CSV_BLOCK_BYTES = 64 << 20  # Arrow reads a CSV in blocks; a cell must fit in one


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
    """Copy an uploaded file object or a server path into DATA_DIR, a file of its own.

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
                        error = InvalidDataset if isinstance(source, (str, Path)) else UploadTooLarge
                        raise error(f"The table is larger than MAX_UPLOAD_BYTES ({settings.MAX_UPLOAD_BYTES} bytes).")
                    digest.update(chunk)
                    out.write(chunk)
            finally:
                if isinstance(source, (str, Path)):
                    src.close()
        if size == 0:
            raise InvalidDataset("The file is empty.")
        fmt = _detect_format(str(getattr(source, "name", source)), head, declared_format)
        sha = digest.hexdigest()
        # a name of this copy's own: two registrations of one table under one name at once
        # each clean up their own copy only (one failing unlinked the other's, which then
        # registered a dataset without its file)
        rel = f"datasets/{name}-{sha[:12]}-{secrets.token_hex(4)}.{fmt}"
        os.replace(tmp, settings.DATA_DIR / rel)
        return rel, fmt, sha
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _without_cells(message: str) -> str:
    """A parser's message without the row or cell it quotes (Arrow's CSV reader ends "Expected
    2 columns, got 1: <the row>" and names "invalid value '<the cell>'"): the message is
    kept as the registration's error, which the API shows, and no endpoint shows raw rows."""
    message = re.sub(r"(Expected \d+ columns, got \d+): .*", r"\1", message, flags=re.S)
    return re.sub(r"invalid value '.*?'(?=$|\s)", "an invalid value", message, flags=re.S)


def read_table(path: Path | str, fmt: str, columns: list[str] | None = None, *,
               max_bytes: int | None = None, unit_column: str = "") -> pa.Table:
    """Read a stored table with Arrow (vectorised; no Python object per row). With
    ``max_bytes``, a Parquet file is read batch by batch and refused once its decoded size
    passes it (registration: a compression bomb must not exhaust the memory). A CSV's
    ``unit_column`` is read as text: its ids compare as written. Typed from the values, one
    person's rows decided whether "7", "007" and "7.0" were one unit (numbers) or three
    (text, once any id anywhere was not a number)."""
    try:
        if fmt == "parquet" and max_bytes is not None:
            table = _read_parquet_bounded(path, max_bytes)
        elif fmt == "parquet":
            table = pq.read_table(path, columns=columns)
        else:
            # A missing cell is null in text columns too ("", NA, NULL, NaN, N/A...: Arrow's
            # list, what pandas' to_csv and R's write.csv write), as it is in numeric ones
            if max_bytes is not None:  # a registration's read (a stored table's width was checked then)
                _check_csv_width(path)
            opts = pacsv.ConvertOptions(include_columns=columns or [], strings_can_be_null=True,
                                        column_types={unit_column: pa.string()} if unit_column else None)
            # blocks of 64 MB (Arrow's default, 1 MB, refused a cell over about 2 MB as "straddling
            # object straddles two block boundaries")
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                   convert_options=opts)
        table.schema.names  # noqa: B018 - Arrow decodes names lazily: a binary file fails here
    except MemoryError as e:  # Arrow's too ("realloc of size 1048576 failed"): said as what it is
        if max_bytes is None:
            raise  # a run's read: the request's own out-of-memory handling replaces the process
        raise InvalidDataset(f"The {fmt.upper()} table could not be read within this process's memory: it decodes "
                             "to more than the memory available (a table too large, or a compression bomb).") from e
    except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as e:
        raise InvalidDataset(f"The file is not a readable {fmt.upper()} table: {_without_cells(str(e))[:300]}") from e
    if fmt == "csv":
        # Arrow reads cells that are not UTF-8 as a binary column: the file is not CSV text.
        binary = [f.name for f in table.schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
        if binary:
            raise InvalidDataset(f"The file is not UTF-8 CSV text (column(s) {', '.join(binary)[:300]} "
                                 "hold binary data).")
    return table


class DecodedTooLarge(InvalidDataset):
    """A Parquet file that decodes past the bound it was read with."""


def _check_csv_width(path) -> None:
    """Refuse a CSV of more than MAX_COLUMNS columns by its header, before Arrow parses it:
    Arrow takes about 10 KB per column, so a 3.5 MB file of 300,000 columns aborted the web
    process (``std::bad_alloc``, every call it served lost with it) before the width was
    checked on the parsed table (a probe's). A header Python's csv module cannot read (a name
    past its field limit) is left to Arrow."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        try:
            header = next(csv.reader(f), [])
        except csv.Error:
            return
    if len(header) > MAX_COLUMNS:
        raise InvalidDataset(f"The table has {len(header)} columns; at most {MAX_COLUMNS} can be registered.")


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
        return DecodedTooLarge(
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
    "no unit column") and named once, no NUL in a name (PostgreSQL cannot store it), no
    nested types, none of the types Arrow's compute kernels do not take (``_UNREAD``:
    registered, their queries failed after the read, charged)."""
    if len(schema) > MAX_COLUMNS:
        raise InvalidDataset(f"The table has {len(schema)} columns; at most {MAX_COLUMNS} can be registered.")
    names = schema.names
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise InvalidDataset(f"The table has duplicate column names: {', '.join(map(repr, dupes))[:300]}")
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
        elif (hint := _unread(field.type)) is not None:
            problems[field.name] = hint
    if problems:
        raise InvalidDataset("The table has columns the service cannot hold: "
                             + "; ".join(f"{k}: {v}" for k, v in list(problems.items())[:10]), errors=problems)


def _unread(t: pa.DataType) -> str | None:
    """Why a column of type ``t`` cannot be registered (the engines' Arrow kernels have none
    for it: grouping, filtering and a unit's rows failed after the read), or None."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    views = {"string_view": "string (large_string)", "binary_view": "binary (large_binary)"}
    if str(t) in views:
        return (f"type {t}, which the engines cannot group, filter or bound by (a Polars table's text is "
                f"string_view): write it as {views[str(t)]}")
    if pa.types.is_float16(t):
        return "type halffloat (float16), which the engines cannot read: write it as float32"
    return None


ORPHAN_AFTER_SECONDS = 6 * 3600  # far past the slowest registration between its copy and its row


def drop_orphan_files(older_than: float = ORPHAN_AFTER_SECONDS) -> list[str]:
    """Copies in DATA_DIR/datasets that no dataset names, and upload spools in
    DATA_DIR/uploads (``FILE_UPLOAD_TEMP_DIR``), older than ``older_than`` seconds: a
    registration killed between the copy and its row, or a web process killed while it read
    an upload (SIGKILL skips their clean-up), left a copy of the rows nothing would ever
    remove. Run by the recovery sweep; returns them (relative to DATA_DIR).

    Age is judged on the clock that stamps the copies, not this process's (``files_now``)."""
    from ..models import Dataset

    roots = [p for p in (settings.DATA_DIR / "datasets", Path(settings.FILE_UPLOAD_TEMP_DIR)) if p.is_dir()]
    if not roots:
        return []
    known = set(Dataset.objects.exclude(file="").values_list("file", flat=True))
    now = files_now(roots[0])
    if now is None:  # nothing can be written here: nothing is judged
        return []
    cutoff = now - older_than
    removed = []
    for root in roots:
        for path in sorted(root.iterdir()):
            try:
                rel = path.relative_to(settings.DATA_DIR).as_posix()
            except ValueError:  # an upload directory outside DATA_DIR
                rel = str(path)
            try:
                if rel in known or not path.is_file() or path.stat().st_mtime > cutoff:
                    continue
                path.unlink()
            except OSError:
                continue
            removed.append(rel)
    return removed


def dataset_path(ds: Dataset) -> Path:
    return settings.DATA_DIR / ds.file
