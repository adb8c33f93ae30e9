"""A partition rewritten in place after registration with other rows, as many of them and
as many bytes (fixed-width columns, plain encoding, no compression, no statistics): the
manifest's rows and sizes matched, and the request was answered on rows that were not the
registered ones (600 units registered, 301 read). The manifest keeps each file's footer
digest and modification time: such a request fails before the read, refunded. (A
helper's probe.)"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from governance.models import Dataset, LedgerEntry

from .test_distributed_api import ask

pytestmark = pytest.mark.django_db


def test_a_partition_rewritten_with_as_many_rows_and_bytes_fails_before_the_read(api, officer, analyst, grant, import_dir, django_capture_on_commit_callbacks):
    d = import_dir / "inplace"
    d.mkdir()
    n = 600
    pid = np.arange(n, dtype=np.int64) + 1_000_000  # 600 units, one row each
    x = np.linspace(0, 100, n)
    for i in range(2):
        sl = slice(i * 300, (i + 1) * 300)
        pq.write_table(pa.table({"pid": pid[sl], "x": x[sl]}), d / f"part-{i}.parquet", compression="none",
                       use_dictionary=False, write_statistics=False)
    r = api(officer).post("/api/datasets/", {"name": "inplace", "path": str(d), "execution": "distributed",
                                             "unit_column": "pid", "schema": {"x": {"lower": 0, "upper": 100}},
                                             "budget_epsilon": 1e6, "activate": True}, format="json")
    assert r.status_code == 201, r.json()
    grant(analyst, Dataset.objects.get(name="inplace"))
    # rewrite part-1 in place: every row now belongs to unit 1_000_000 (bytes and rows unchanged)
    p = d / "part-1.parquet"
    raw = bytearray(p.read_bytes())
    old = pid[300:].tobytes()
    at = raw.find(old)
    assert at > 0
    raw[at:at + len(old)] = np.full(300, 1_000_000, dtype=np.int64).tobytes()
    size = p.stat().st_size
    p.write_bytes(bytes(raw))
    assert p.stat().st_size == size and pq.ParquetFile(p).metadata.num_rows == 300
    body = ask(api(analyst), "inplace", "count", {"epsilon": 1e4, "max_rows_per_unit": 1},
               django_capture_on_commit_callbacks)
    assert body["status"] == "failed", "answered on rows that are not the registered ones"
    assert body["error"]["code"] == "request.failed_before_read", body["error"]
    assert LedgerEntry.objects.get(request__id=body["id"]).status == "released"
