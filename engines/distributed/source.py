"""A partitioned Parquet table: where its parts are, what they must look like, and the
check, from the Parquet footers only (schema and row count, no rows), that they still do.

The manifest is written when the dataset is registered: one entry per file,
``{"path" (relative to the location), "rows", "bytes"}``, and the table's Arrow schema
(``schema_to_json``). A run
checks it before the data is read, so a partition that went missing or was rewritten with
another schema fails the request *before the read* (its reservation is refunded).
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from engines.types import EngineError

__all__ = ["PartitionError", "PartitionedTable", "open_file", "join", "list_partitions", "schema_to_json",
           "schema_from_json", "footer", "differences", "check_manifest", "integer_range", "file_ranges",
           "span"]


FOOTER_THREADS = 16


class PartitionError(EngineError):
    """A partition is missing, unreadable, or differs from the registered manifest."""

    code = "dataset.partition_invalid"

    def __init__(self, message: str, path: str = "", problem: str = ""):
        super().__init__(message)
        self.path = path
        self.problem = problem


def _fs(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


def open_file(path: str):
    """A readable file object for a local path or a URI."""
    fs, p = _fs(path)
    return fs.open_input_file(p)


def join(base: str, rel: str) -> str:
    """A partition's full path or URI from the location and its manifest name."""
    return base.rstrip("/") + "/" + rel if "://" in base else os.path.join(base, rel)


def _own_files(base: str, names) -> None:
    """On a local disk, each partition is a file of its own inside ``base``: no symbolic
    link on the way from ``base`` to it (a link could reach a file outside the directories
    tables may be registered from, or, with a link to a parent, the same file under many
    names) and no two names for one file (hard links): a row read twice would count twice.
    Raises ``PartitionError`` naming the partition."""
    if "://" in base:
        return
    real_base, seen = os.path.realpath(base), {}
    for name in names:
        path = join(base, name)
        if os.path.realpath(path) != os.path.join(real_base, os.path.normpath(name)):
            raise PartitionError(f"partition {name!r} is reached through a symbolic link: partitions must be "
                                 "files inside the registered location itself", name, "link")
        try:
            st = os.stat(path)
        except OSError:
            continue  # a missing file is reported by the footer read, which names it
        if not stat.S_ISREG(st.st_mode):  # a FIFO would hold the read (and its worker) forever
            raise PartitionError(f"partition {name!r} is not a regular file", name, "not_a_file")
        other = seen.setdefault((st.st_dev, st.st_ino), name)
        if other != name:
            raise PartitionError(f"partitions {other!r} and {name!r} are the same file (a hard link): each file "
                                 "must be listed once", name, "duplicate")


def hidden(name: str) -> bool:
    """A file or directory name a table's readers skip, as pyarrow.dataset, Spark and Hive
    do: ``_temporary/`` (a Spark job's attempts, rows written twice), ``_SUCCESS``, ``.crc``
    and other dot-files."""
    return name.startswith(("_", "."))


def _local_parquet_files(root: str) -> list[str]:
    """Every ``*.parquet`` / ``*.pq`` under a local directory, relative to it, links not
    followed: a link to a directory or to a Parquet file is refused (``_own_files``);
    ``hidden`` names (and everything under a hidden directory) are skipped."""
    files = []
    for d, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = [x for x in dirs if not hidden(x)]
        names = [x for x in names if not hidden(x)]
        rel = os.path.relpath(d, root)
        for name in sorted(dirs) + sorted(names):
            full = os.path.join(d, name)
            is_data = name.endswith((".parquet", ".pq"))
            label = os.path.normpath(os.path.join(rel, name))
            if os.path.islink(full) and (is_data or os.path.isdir(full)):
                raise PartitionError(f"{label!r} is a symbolic link: partitions must be files inside the "
                                     "registered location itself", label, "link")
            if is_data and name in names and os.path.isfile(full):
                files.append(label)
    return sorted(files)


def list_partitions(location: str) -> tuple[str, list[str]]:
    """The Parquet files of a location: ``(base, names)`` with each file's path relative to
    ``base``: one file (base its directory), or every ``*.parquet`` / ``*.pq`` file under
    a directory, recursively, sorted, ``hidden`` names skipped. Raises ``PartitionError`` if there are none, or (on
    a local disk) if one is a symbolic link or reached through one, or two are one file."""
    fs, p = _fs(location)
    scheme = location.split("://", 1)[0] + "://" if "://" in location else ""
    try:
        info = fs.get_file_info(p)
    except (OSError, ValueError) as e:
        raise PartitionError(f"{location!r} cannot be listed: {e}", location, "unreadable") from None
    if info.type == pafs.FileType.File:
        base, _, name = p.rpartition("/")
        _own_files(scheme + base, [name])
        return scheme + base, [name]
    if info.type != pafs.FileType.Directory:
        raise PartitionError(f"{location!r} is neither a file nor a directory", location, "missing")
    if scheme:
        root = p.rstrip("/") + "/"
        files = sorted(i.path[len(root):] for i in fs.get_file_info(pafs.FileSelector(p, recursive=True))
                       if i.type == pafs.FileType.File and i.base_name.endswith((".parquet", ".pq"))
                       and i.path.startswith(root) and not any(map(hidden, i.path[len(root):].split("/"))))
    else:
        files = _local_parquet_files(p)
    if not files:
        raise PartitionError(f"{location!r} holds no .parquet files", location, "empty")
    _own_files(location, files)
    return location, files


def schema_to_json(schema: pa.Schema) -> str:
    """The Arrow schema in a JSON-safe form (its IPC bytes, base64), metadata dropped."""
    return base64.b64encode(schema.remove_metadata().serialize().to_pybytes()).decode()


def schema_from_json(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def footer_digest(f) -> str:
    """SHA-256 (hex, 32 digits) of a Parquet file's footer bytes, read from the open file
    ``f``: the row groups' offsets, sizes and statistics (min, max, nulls) of every column.
    A file rewritten with other rows of the same size and count (fixed-width columns,
    plain encoding, no compression) changed neither, and was answered on."""
    size = f.size()
    f.seek(size - 8)
    length = int.from_bytes(f.read(4), "little")
    if not 0 < length <= size - 12:
        raise OSError("not a Parquet footer")
    f.seek(size - 8 - length)
    return hashlib.sha256(f.read(length)).hexdigest()[:32]


def mtime_ns(path: str) -> int | None:
    """A local file's modification time (ns); None for an object store's."""
    return None if "://" in path else os.stat(path).st_mtime_ns


def _metadata(path: str, label: str) -> tuple[pa.Schema, pq.FileMetaData, int, str]:
    """(Arrow schema, footer, size in bytes, ``footer_digest``) of one Parquet file; errors
    name it ``label``."""
    try:
        with open_file(path) as f:
            pf = pq.ParquetFile(f)
            return pf.schema_arrow.remove_metadata(), pf.metadata, f.size(), footer_digest(f)
    except FileNotFoundError:
        raise PartitionError(f"partition {label!r} is missing", label, "missing") from None
    except (OSError, pa.ArrowException) as e:
        raise PartitionError(f"partition {label!r} cannot be read as Parquet: {str(e)[:200]}", label,
                             "unreadable") from None


def footer(path: str, label: str | None = None) -> tuple[pa.Schema, int, str]:
    """(Arrow schema, rows, ``footer_digest``) of one Parquet file, from its footer; errors
    name it ``label``."""
    schema, md, _, digest = _metadata(path, label or path)
    return schema, md.num_rows, digest


def _range_in(md: pq.FileMetaData, arrow: pa.Schema, column: str) -> tuple | None:
    """(min, max) of an integer column in one file from its footer; () for a file without
    rows; None when a row group has no statistics, or statistics that cannot be true (min
    above max), or the column is not an integer as Arrow reads it (``arrow``, the file's
    schema: dates, timestamps and decimals are stored as integers too, and so is a
    duration, whose Parquet logical type says nothing)."""
    names = [md.schema.column(j).path for j in range(len(md.schema))]
    if column not in names or md.schema.column(names.index(column)).logical_type.type not in ("NONE", "INT"):
        return None
    if arrow.get_field_index(column) < 0 or not pa.types.is_integer(arrow.field(column).type):
        return None
    ranges = []
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        if group.num_rows == 0:
            continue
        chunk = next((group.column(j) for j in range(group.num_columns) if group.column(j).path_in_schema == column),
                     None)
        stats = chunk.statistics if chunk is not None else None
        if stats is None or not stats.has_min_max or stats.physical_type not in ("INT32", "INT64") \
                or not isinstance(stats.min, int) or not isinstance(stats.max, int):
            return None
        if stats.min > stats.max:
            return None
        ranges.append((int(stats.min), int(stats.max)))
    return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else ()


def span(ranges) -> tuple[int, int] | None:
    """(min, max) over files' ranges (``file_ranges``), or None (no range, or none known)."""
    if ranges is None or any(r is None for r in ranges):
        return None
    ranges = [r for r in ranges if r]
    return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None


def _known(ranges: list) -> tuple | None:
    """The files' ranges as a tuple, or None when one is not known."""
    return None if any(r is None for r in ranges) else tuple(ranges)


def file_ranges(paths, column: str) -> tuple | None:
    """Each file's (min, max) of an integer column (``()`` for a file without rows), from
    the footers' statistics (no row read), or None when a non-empty row group has none
    (or the column is not an integer, or a footer cannot be read)."""
    def one(path):
        with open_file(path) as f:
            pf = pq.ParquetFile(f)
            return _range_in(pf.metadata, pf.schema_arrow, column)

    try:
        with ThreadPoolExecutor(max_workers=FOOTER_THREADS) as pool:
            ranges = list(pool.map(one, paths))
    except (OSError, pa.ArrowException):
        return None
    return _known(ranges)


def integer_range(paths, column: str) -> tuple[int, int] | None:
    """(min, max) of an integer column over every file, from the footers' statistics (no
    row read), or None when a non-empty row group has none (or the column is not an
    integer). Statistics a writer got wrong cannot make an answer wrong: callers use the
    range to spread work, never to drop a value outside it."""
    return span(file_ranges(paths, column))


def differences(expected: pa.Schema, found: pa.Schema, columns=None) -> list[str]:
    """How ``found`` differs from ``expected`` in ``columns`` (default: every column of
    either)."""
    names = list(columns) if columns is not None else list(dict.fromkeys(expected.names + found.names))
    out = []
    for name in names:
        i, j = expected.get_field_index(name), found.get_field_index(name)
        if j < 0:
            out.append(f"column {name!r} is missing")
        elif i < 0:
            out.append(f"column {name!r} is not in the registered schema")
        elif expected.field(i).type != found.field(j).type:
            out.append(f"column {name!r} is {found.field(j).type}, registered as {expected.field(i).type}")
    return out


def check_manifest(base: str, parts: list[dict], schema: pa.Schema, columns: list[str] | None = None,
                   range_of: str | None = None) -> tuple[int, tuple | None]:
    """Check every partition against the manifest: it exists, holds the registered row
    count and size in bytes (when the manifest has it: a local file's), and its schema
    matches the registered one (in ``columns``, or all). Reads
    footers only; errors name partitions by their manifest name, not their server path.
    Returns the total row count and, from the same footers, ``file_ranges`` of the column
    ``range_of`` (None without one; ``span`` is their union); raises ``PartitionError``."""
    total = 0
    _own_files(base, [part["path"] for part in parts])  # a file swapped for a link since registration
    with ThreadPoolExecutor(max_workers=FOOTER_THREADS) as pool:  # an object store answers each in ~50 ms
        footers = list(pool.map(lambda part: _metadata(join(base, part["path"]), part["path"]), parts))
    for part, (found, md, size, digest) in zip(parts, footers):
        diff = differences(schema, found, columns)
        if diff:
            raise PartitionError(f"partition {part['path']!r} has a different schema: " + "; ".join(diff),
                                 part["path"], "schema")
        if md.num_rows != part["rows"]:
            raise PartitionError(f"partition {part['path']!r} holds {md.num_rows} rows, registered with "
                                 f"{part['rows']}: it was rewritten since registration", part["path"], "rows")
        if part.get("bytes") is not None and size != part["bytes"]:  # other rows, as many of them
            raise PartitionError(f"partition {part['path']!r} is {size:,} bytes, registered at {part['bytes']:,}: "
                                 "it was rewritten since registration", part["path"], "bytes")
        if part.get("mtime_ns") is not None and mtime_ns(join(base, part["path"])) != part["mtime_ns"]:
            raise PartitionError(f"partition {part['path']!r} was modified since registration (its modification "
                                 "time); register the files again if that was meant", part["path"], "modified")
        if part.get("footer") is not None and digest != part["footer"]:  # other rows, as many bytes
            raise PartitionError(f"partition {part['path']!r} has another footer (its row groups' statistics) "
                                 "than when registered: it was rewritten since registration", part["path"], "footer")
        total += md.num_rows
    return total, (_known([_range_in(md, found, range_of) for found, md, _, _ in footers]) if range_of else None)


@dataclass(frozen=True)
class PartitionedTable:
    """What a distributed engine gets instead of a ``pyarrow.Table``: the checked
    partitions, the columns to read (planned columns plus the unit column), the total
    row count, and the Dask scheduler to run on (``""``: threads in this process)."""

    paths: tuple[str, ...]
    columns: tuple[str, ...]
    num_rows: int
    unit_column: str | None = None
    scheduler: str = ""
    retries: int = 2
    unit_ranges: tuple | None = ...  # file_ranges of the unit ids, when known (None: none); ...: not read
    max_rows_per_unit: int | None = None  # the most rows of one unit when registered: a hint, never trusted
    expected: tuple | None = None  # each path's (rows, bytes, footer, mtime_ns or None) in the manifest: checked at each read

    @property
    def unit_range(self) -> tuple[int, int] | None:
        """``span`` of ``unit_ranges`` (``...``: not read)."""
        return ... if self.unit_ranges is ... else span(self.unit_ranges)

    def one(self, i: int) -> PartitionedTable:
        """This table's ``i``-th file alone, with its own manifest line: what a task that
        reads one file carries. Each task carried the whole table (every path and manifest
        line: 114 KB for 2,000 files), so a graph's size grew with the square of the files
        and a probe's 2,000 files of 5 rows paused both workers out of memory, for good."""
        path = self.paths[i]
        per_file = self.unit_ranges if self.unit_ranges in (None, ...) else (self.unit_ranges[i],)
        return replace(self, paths=(path,), unit_ranges=per_file,
                       expected=None if self.expected is None else (self.expected[i],))

    def ranges_of(self, column: str) -> tuple | None:
        """``file_ranges`` of ``column``: the unit ids' as the manifest check read them with
        the rest of the footers, when known, else read here."""
        if column == self.unit_column and self.unit_ranges is not ...:
            return self.unit_ranges
        return file_ranges(self.paths, column)

    def read_file(self, path: str) -> pa.Table:
        """One partition's planned columns (called on a Dask worker), every column nullable
        (a file may write one as required, another as optional: they are one table). With
        ``expected``, the file read must still be the file checked: as many rows and bytes
        as the manifest says, or ``PartitionError`` (a partition rewritten after the check,
        or between a lost worker's read and its retry, would be answered on rows the run's
        sizes, sensitivity grid and unit count were not planned for)."""
        if "://" not in path and not stat.S_ISREG(os.stat(path).st_mode):
            raise PartitionError(f"partition {os.path.basename(path)!r} is not a regular file", path, "not_a_file")
        with open_file(path) as f:
            pf = pq.ParquetFile(f, pre_buffer=True)  # as pq.read_table does: one read of the columns' ranges
            if self.expected is not None:
                rows, size, digest, mtime = self.expected[self.paths.index(path)]
                if pf.metadata.num_rows != rows or (size is not None and f.size() != size) \
                        or (digest is not None and footer_digest(f) != digest) \
                        or (mtime is not None and mtime_ns(path) != mtime):
                    raise PartitionError(f"partition {os.path.basename(path)!r} was rewritten while the run read "
                                         "it", path, "rewritten")
            t = pf.read(columns=list(self.columns))
        if all(field.nullable for field in t.schema):
            return t
        return t.cast(pa.schema([field.with_nullable(True) for field in t.schema]))

    def to_arrow(self) -> pa.Table:
        """Every partition read into one table, in this process (for engines that do not
        run distributed: the table must then fit one worker's memory)."""
        tables = [self.read_file(p) for p in self.paths]
        if not tables:
            return pa.table({c: pa.array([]) for c in self.columns})
        if not self.columns:  # (concat_tables of tables without columns drops their rows: 0 rows)
            return pa.Table.from_struct_array(pa.array([{}] * sum(t.num_rows for t in tables), type=pa.struct([])))
        return pa.concat_tables(tables)
