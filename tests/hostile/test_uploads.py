"""Hostile tables and server paths at ``POST /api/datasets/`` (a privacy officer), and
formula injection through the real API into the CSV audit export.

Each hostile table or path is a 4xx with a code and a reason, stores nothing (no dataset
row, no file under DATA_DIR) and is never a 500. tests/api/test_datasets.py already covers
noise, PNG, empty and header-only files, duplicate columns, a file over MAX_UPLOAD_BYTES,
absolute and ``..`` paths and a symlinked file; these add the rest: nested Parquet
columns, 10,000 columns, archives posing as tables, a Parquet compression bomb, NUL
characters (PostgreSQL cannot store them), nameless columns, percent-encoded, overlong and
special paths, symlinked directories, FIFOs and devices.

The service reads two formats, CSV and Parquet, and decompresses nothing itself: a gzip or
zip file named ``.csv`` is read as (invalid) CSV text and refused; a stored table is named
``<name>-<sha>-<random>.csv|.parquet``, so Arrow's decompression by file extension never applies.
Parquet's internal compression is the only bomb: its decoded size is bounded at
registration (``MAX_DECODED_RATIO`` x ``MAX_UPLOAD_BYTES``), batch by batch.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from governance.datasets import files as dataset_files, registry as datasets
from governance.models import AuditRecord, Dataset
from tests.api.conftest import assert_error, stored_files, upload
from tests.conftest import small_frame

pytestmark = pytest.mark.django_db
URL = "/api/datasets/"


@pytest.fixture
def nothing_stored(officer):
    before = Dataset.objects.count()
    yield
    assert Dataset.objects.count() == before
    assert stored_files() == []


@pytest.fixture
def client(api, officer):
    c = api(officer)
    c.raise_request_exception = False
    return c


def form(data: bytes, name="t.csv", **fields):
    return {"name": "hostile", "budget_epsilon": "1", "file": upload(data, name), **fields}


def parquet(table: pa.Table, **kw) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


def zipped(text: bytes) -> bytes:
    """A zip of ``text`` with a fixed timestamp: the archive's bytes (read as CSV, they fail
    as unreadable or as binary cells depending on them) must not change with the clock."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("t.csv", date_time=(2026, 1, 1, 0, 0, 0)), text,
                   compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def gzipped(text: bytes) -> bytes:
    return gzip.compress(text, mtime=0)  # no timestamp in the header, as for zipped


CSV = b"a,b\n" + b"1,2\n" * 100_000  # 400 kB; compresses to about 1 kB
TWO = pa.array([1, 2])


# --------------------------------------------------------------------------- tables


@pytest.mark.parametrize("data, name, fields, fragment", [
    (parquet(pa.table({"a": TWO, "s": pa.array([{"x": 1}, {"x": 2}])})), "t.parquet", {}, "nested type struct"),
    (parquet(pa.table({"a": TWO, "l": pa.array([[1], [2, 3]])})), "t.parquet", {}, "nested type list"),
    (parquet(pa.table({"a": TWO, "m": pa.array([[("k", 1)], [("j", 2)]], pa.map_(pa.string(), pa.int64()))})),
     "t.parquet", {}, "nested type map"),
    # Was a 500: the privacy-unit count (value_counts) is not implemented for nested types.
    (parquet(pa.table({"a": TWO, "l": pa.array([[1], [2, 3]])})), "t.parquet", {"unit_column": "l"}, "nested"),
    (parquet(pa.table({"a": TWO, "s": pa.array([{"x": 1}, {"x": 2}])})), "t.parquet", {"unit_column": "s"},
     "nested"),
    ((",".join(f"c{i}" for i in range(10_000)) + "\n" + ",".join("1" * 10_000) + "\n").encode(), "t.csv", {},
     "10000 columns; at most 2000"),
    (parquet(pa.table({f"c{i}": [1] for i in range(2_500)})), "t.parquet", {}, "2500 columns; at most 2000"),
    (zipped(CSV), "t.csv", {}, "not a readable CSV"),
    (zipped(CSV), "t.zip", {}, "not a readable CSV"),
    (gzipped(CSV), "t.csv", {}, "not a readable CSV"),
    (gzipped(CSV), "t.csv.gz", {}, "not a readable CSV"),
    (gzipped(CSV), "t.parquet", {}, "not a readable PARQUET"),
    (zipped(CSV), "t.csv", {"format": "parquet"}, "not a readable PARQUET"),
    ("a,b\n1,x\n".encode("utf-16"), "t.csv", {}, None),
    (b"a,b\n1,x\x00y\n2,z\n", "t.csv", {}, "NUL"),  # a NUL in a proposed domain value
    (b"a,b\x00c\n1,x\n2,z\n", "t.csv", {}, "NUL"),  # in a column name
    (b",b\n1,x\n2,z\n", "t.csv", {}, "no name"),  # was stored as the privacy-unit column
    (parquet(pa.table({"u": [1.0, None, 2.0], "b": [1, 2, 3]})), "t.parquet", {"unit_column": "u"}, "1 empty values"),
    (b"a,a\n1,2\n3,4\n", "t.csv", {}, "duplicate column names: 'a'"),
    (parquet(pa.Table.from_arrays([TWO, TWO], names=["a", "a"])), "t.parquet", {}, "duplicate column names: 'a'"),
    # NaN is no id either: it was taken as one unit for every row holding it
    (parquet(pa.table({"u": [1.0, float("nan"), float("nan")], "b": [1, 2, 3]})), "t.parquet", {"unit_column": "u"},
     "2 empty values (null or NaN)"),
    (b"a,b\n1,\xed\xa0\x80\n", "t.csv", {}, "not UTF-8"),  # an encoded lone surrogate
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40, "t.csv", {}, None),
    (b"a,b\n1,2\n" + b"\x00" * 5000, "t.csv", {}, None),
])
def test_it_refuses_hostile_tables(client, data, name, fields, fragment, nothing_stored):
    body = assert_error(client.post(URL, form(data, name, **fields), format="multipart"), 400, "dataset.invalid")
    if fragment:
        assert fragment in body["detail"]


def invalid_utf8_parquet() -> bytes:
    """A string column whose bytes are not UTF-8 (Arrow validates on build, not on read)."""
    raw = pa.array([b"ok", b"\xff\xfe"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())
    return parquet(pa.table({"a": TWO, "s": bad}))


def test_it_refuses_a_parquet_string_column_that_is_not_utf8(client, nothing_stored):
    body = assert_error(client.post(URL, form(invalid_utf8_parquet(), "t.parquet"), format="multipart"), 400,
                        "dataset.invalid")
    assert "UTF-8" in body["detail"]


def test_it_refuses_a_parquet_compression_bomb(client, settings, nothing_stored):
    # 20 million equal int64 values: about 90 kB on disk, 160 MB once decoded.
    data = parquet(pa.table({"z": pa.array(np.zeros(20_000_000, dtype=np.int64))}), compression="zstd")
    settings.MAX_UPLOAD_BYTES = 1_000_000
    assert len(data) < settings.MAX_UPLOAD_BYTES
    body = assert_error(client.post(URL, form(data, "t.parquet"), format="multipart"), 400, "dataset.invalid")
    assert "over the limit of 4000000" in body["detail"]


@pytest.mark.parametrize("store_schema", [True, False])
def test_it_refuses_a_dictionary_encoded_string_bomb(client, settings, store_schema, nothing_stored):
    # One 10 kB string repeated 100,000 times: under 1 kB on disk, 1 GB as Arrow strings.
    # Measured while still dictionary-encoded: the test would fail for memory if it were not.
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(100_000, dtype=np.int32)), pa.array(["x" * 10_000]))
    data = parquet(pa.table({"s": column}), compression="zstd", store_schema=store_schema)
    assert len(data) < 1000
    settings.MAX_UPLOAD_BYTES = 1_000_000
    body = assert_error(client.post(URL, form(data, "t.parquet"), format="multipart"), 400, "dataset.invalid")
    assert "compression bomb" in body["detail"]


def test_it_refuses_a_plain_encoded_string_bomb(client, settings, nothing_stored):
    # No dictionary: the footer's uncompressed sizes give it away before anything is read.
    data = parquet(pa.table({"s": pa.array(["x" * 10_000] * 20_000)}), compression="zstd", use_dictionary=False)
    settings.MAX_UPLOAD_BYTES = 1_000_000
    body = assert_error(client.post(URL, form(data, "t.parquet"), format="multipart"), 400, "dataset.invalid")
    assert "decodes to at least" in body["detail"]


def test_a_parquet_table_within_the_decoded_limit_is_registered(client, settings):
    data = parquet(pa.table({"z": pa.array(np.arange(100_000) % 7)}), compression="zstd")
    settings.MAX_UPLOAD_BYTES = 1_000_000  # decoded: 800 kB < 4 MB
    r = client.post(URL, form(data, "t.parquet"), format="multipart")
    assert r.status_code == 201, r.content[:300]
    assert r.json()["n_rows"] == 100_000


def test_a_server_file_over_the_upload_limit_is_refused(client, import_dir, settings, nothing_stored):
    path = import_dir / "big.csv"
    path.write_bytes(CSV)
    settings.MAX_UPLOAD_BYTES = 10_000
    body = assert_error(client.post(URL, {"name": "big", "path": str(path), "budget_epsilon": 1}, format="json"),
                        400, "dataset.invalid")
    assert "MAX_UPLOAD_BYTES" in body["detail"]


def test_accepted_odd_but_flat_types(client):
    """Not hostile, only unusual: flat Parquet types the schema can describe are kept."""
    table = pa.table({"d": pa.array([1, 2], pa.date32()), "dec": pa.array([1, 2], pa.decimal128(10, 2)),
                      "u64": pa.array([2**64 - 1, 0], pa.uint64()), "dict": pa.array(["x", "y"]).dictionary_encode(),
                      "n": pa.array([None, None], pa.null())})
    r = client.post(URL, form(parquet(table), "t.parquet"), format="multipart")
    assert r.status_code == 201, r.content[:300]
    types = {c["name"]: c["type"] for c in r.json()["columns"]}
    assert types == {"d": "categorical", "dec": "numeric", "u64": "numeric", "dict": "categorical", "n": "text"}


@pytest.mark.parametrize("column,fragment", [
    (pa.array(["a", "b"] * 50, pa.string_view()), "string_view"),
    (pa.array([b"a", b"b"] * 50, pa.binary_view()), "binary_view"),
    (pa.array(np.array([1, 2] * 50, dtype=np.float16)), "float16"),
])
def test_types_the_engines_cannot_read_are_refused_with_what_to_write(client, column, fragment, nothing_stored):
    """A Polars table's text (string_view) and float16 registered, then every query grouping,
    filtering or bounding by the column failed after the read, charged (a helper's probe)."""
    table = pa.table({"g": column, "x": pa.array(range(100))})
    r = client.post(URL, form(parquet(table), "t.parquet"), format="multipart")
    body = assert_error(r, 400, "dataset.invalid")
    assert fragment in str(body) and "write it as" in str(body), body


# --------------------------------------------------------------------------- server paths


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret.csv"
    small_frame().to_csv(path, index=False)
    return path


def special_paths(imp, secret):
    (imp / "sub").mkdir()
    small_frame().to_csv(imp / "sub" / "ok.csv", index=False)
    (imp / "linkdir").symlink_to(secret.parent)
    (imp / "loop").symlink_to(imp / "loop")
    (imp / "zero.csv").symlink_to("/dev/zero")
    os.mkfifo(imp / "fifo.csv")
    return {
        "percent-encoded dot-dot": f"{imp}/%2e%2e/{secret.name}",
        "percent-encoded slash": f"{imp}/%2e%2e%2f{secret.name}",
        "backslashes": f"{imp}\\..\\{secret.name}",
        "symlinked directory": f"{imp}/linkdir/{secret.name}",
        "symlink loop": f"{imp}/loop",
        "symlink to /dev/zero": f"{imp}/zero.csv",
        "fifo": f"{imp}/fifo.csv",  # opening it would block the request forever
        "directory": f"{imp}/sub",
        "name too long": f"{imp}/{'a' * 300}.csv",  # was a 500 (ENAMETOOLONG from stat)
        "path too long": f"{imp}/" + "/".join(["a" * 200] * 20),
        "/proc": "/proc/self/environ",
        "/dev": "/dev/zero",
        "home": "~/secret.csv",
        "file URL": f"file://{secret}",
        "relative": f"../{secret.parent.name}/{secret.name}",
        "newline": f"{imp}/a\nb.csv",
        "unicode override": f"{imp}/\u202ecsv.exe",
        "NUL": f"{imp}/sub/ok.csv\x00.png",
        "NUL only": "\x00",
        "blank": " ",
    }


PATH_CASES = ["percent-encoded dot-dot", "percent-encoded slash", "backslashes", "symlinked directory", "symlink loop",
              "symlink to /dev/zero", "fifo", "directory", "name too long", "path too long", "/proc", "/dev", "home",
              "file URL", "relative", "newline", "unicode override", "NUL", "NUL only", "blank"]


@pytest.mark.parametrize("case", PATH_CASES)
def test_it_refuses_hostile_server_paths(client, import_dir, secret, case, nothing_stored):
    path = special_paths(import_dir, secret)[case]
    r = client.post(URL, {"name": "hostile", "path": path, "budget_epsilon": 1}, format="json")
    body = assert_error(r, 400)
    assert body["code"] in ("dataset.invalid", "request.invalid", "request.malformed"), body


def test_register_refuses_a_nul_path_called_directly(officer, import_dir):
    with pytest.raises(datasets.InvalidDataset):
        dataset_files.resolve_server_path(f"{import_dir}/x\x00.csv")


def test_dot_dot_that_stays_inside_the_import_dir_is_fine(client, import_dir):
    (import_dir / "sub").mkdir()
    small_frame().to_csv(import_dir / "sub" / "ok.csv", index=False)
    r = client.post(URL, {"name": "inside", "path": f"{import_dir}/sub/../sub//ok.csv", "budget_epsilon": 1},
                    format="json")
    assert r.status_code == 201, r.content[:300]


# --------------------------------------------------------------------------- CSV export


# (A leading tab or carriage return cannot get in: DRF trims text fields.)
FORMULAS = ["=HYPERLINK(\"http://evil.example\",\"x\")", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A2)"]


def test_formulas_entered_through_the_api_are_neutralised_in_the_csv_export(api, officer, make_dataset):
    """A reference an officer types and usernames an officer creates (each a trigger
    character first) travel through the real API into the audit trail; the CSV export
    prefixes every such cell with a quote. (test_audit_api.py plants one in the database.)"""
    make_dataset("survey", epsilon=100.0)
    boss = api(officer)
    for i, text in enumerate(FORMULAS):
        r = boss.post("/api/datasets/survey/charges/", {"event": {"kind": "laplace", "epsilon": 0.01},
                                                         "reference": text}, format="json")
        assert r.status_code == 201, r.content
    names = ["-2+3", "@SUM", "+1+1", "-A1", "@A1.B2"]  # what the username rule [\w.@+-] lets through
    for name in names:
        r = boss.post("/api/analysts/", {"username": name}, format="json")
        assert r.status_code == 201, (name, r.content)
        r = boss.post("/api/grants/", {"analyst": name, "dataset": "survey"}, format="json")
        assert r.status_code == 201, r.content
        r = api_for(api, name).post("/api/requests/", {"dataset": "survey", "engine": "no-such-engine",
                                                       "kind": "=1+1", "params": {}}, format="json")
        assert r.status_code == 400
        r = api_for(api, name).post("/api/datasets/survey/charges/", {"event": {"kind": "no_op"}}, format="json")
        assert r.status_code == 403
    # A refusal by the gate records the analyst as the actor:
    for name in names:
        r = api_for(api, name).post("/api/requests/", {"dataset": "survey", "engine": "aggregates", "kind": "count",
                                                       "params": {"epsilon": 1000.0}}, format="json")
        assert r.status_code == 409, r.content
    assert AuditRecord.objects.filter(actor__in=names).count() == len(names)

    r = boss.get("/api/audit/export/", {"dataset": "survey", "format": "csv"})
    assert r.status_code == 200
    rows = list(csv.DictReader(io.StringIO(r.getvalue().decode())))
    cells = [cell for row in rows for cell in row.values()]
    assert {f"'{t}" for t in FORMULAS} <= set(cells)
    assert {f"'{n}" for n in names if not _plain_number(n)} <= set(cells)
    for cell in cells:
        assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r") or _plain_number(cell), cell


def _plain_number(text: str) -> bool:
    import re

    return re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", text) is not None


def api_for(api, username):
    from django.contrib.auth import get_user_model

    return api(get_user_model().objects.get(username=username))


@pytest.mark.parametrize("name", ["-inf", "+nan", "-Infinity", "-1_0"])
def test_number_like_usernames_are_neutralised_too(api, officer, make_dataset, name):
    make_dataset("survey", epsilon=1.0)
    boss = api(officer)
    assert boss.post("/api/analysts/", {"username": name}, format="json").status_code == 201
    assert boss.post("/api/grants/", {"analyst": name, "dataset": "survey"}, format="json").status_code == 201
    r = api_for(api, name).post("/api/requests/", {"dataset": "survey", "engine": "aggregates", "kind": "count",
                                                   "params": {"epsilon": 100.0}}, format="json")
    assert r.status_code == 409
    rows = list(csv.DictReader(io.StringIO(boss.get("/api/audit/export/", {"dataset": "survey",
                                                                            "format": "csv"}).getvalue().decode())))
    assert [row["actor"] for row in rows if row["action"] == "refuse"] == [f"'{name}"]
    assert [row["actor"] for row in rows if row["action"] == "grant"] == [officer.username]  # who granted


def test_a_full_data_directory_is_a_507_that_keeps_nothing(client, import_dir, monkeypatch, nothing_stored):
    """Was Django's 500 page (with the traceback and settings: DEBUG is on by default)."""
    import errno

    path = import_dir / "t.csv"
    path.write_bytes(CSV)
    real_fdopen = os.fdopen

    class Full(io.RawIOBase):  # the copy's file: every write finds the disk full
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.f.close()
            super().close()

    monkeypatch.setattr(dataset_files.os, "fdopen", lambda fd, mode="r", *a, **kw: Full(real_fdopen(fd, mode)))
    r = client.post(URL, {"name": "full", "path": str(path), "budget_epsilon": 1}, format="json")
    assert r.status_code == 507 and r.json()["code"] == "storage.full", r.content[:300]
    assert "No space left on device" in r.json()["detail"]


@pytest.mark.parametrize("err", ["EROFS", "EACCES"])
def test_a_data_directory_that_cannot_be_written_is_a_503_that_keeps_nothing(client, import_dir, monkeypatch,
                                                                           nothing_stored, err):
    """A probe's read-only DATA_DIR: the copy's mkstemp raised EROFS, a 500 with Django's
    debug page (DEBUG is on by default)."""
    import errno

    path = import_dir / "t.csv"
    path.write_bytes(CSV)

    def unwritable(*a, **kw):
        raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)))

    monkeypatch.setattr(dataset_files.tempfile, "mkstemp", unwritable)
    r = client.post(URL, {"name": "ro", "path": str(path), "budget_epsilon": 1}, format="json")
    assert r.status_code == 503 and r.json()["code"] == "storage.unwritable", r.content[:300]
    assert os.strerror(getattr(errno, err)) in r.json()["detail"]


def test_a_csv_too_wide_is_refused_by_its_header_before_arrow_parses_it(tmp_path, monkeypatch):
    """Arrow takes about 10 KB per column: a probe's 3.5 MB CSV of 300,000 columns aborted
    the web process (std::bad_alloc) before the width was checked on the parsed table."""
    from governance.core.errors import InvalidDataset
    from governance.datasets import files

    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(3_000)) + "\n" + ",".join("1" * 3_000) + "\n")
    monkeypatch.setattr(files.pacsv, "read_csv", lambda *a, **k: pytest.fail("parsed before its width was checked"))
    with pytest.raises(InvalidDataset, match="3000 columns; at most 2000"):
        files.read_table(path, "csv", max_bytes=10**9)  # a registration's read


def test_a_table_that_runs_the_reader_out_of_memory_is_said_to_be_so(tmp_path, monkeypatch):
    """A probe's bomb failed as "not a readable PARQUET table: realloc of size 1048576
    failed": the file was readable, the process's memory was not enough."""
    import pyarrow.parquet as pq

    from governance.core.errors import InvalidDataset
    from governance.datasets import files

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)

    def no_memory(*a, **k):
        raise pa.ArrowMemoryError("realloc of size 1048576 failed")

    monkeypatch.setattr(files.pq, "ParquetFile", no_memory)
    with pytest.raises(InvalidDataset, match="could not be read within this process's memory"):
        files.read_table(path, "parquet", max_bytes=10**6)  # a registration's read
    monkeypatch.setattr(files.pq, "read_table", no_memory)
    with pytest.raises(MemoryError):  # a run's: left to the request's handling (its process replaced)
        files.read_table(path, "parquet")
