"""The audit record of a distributed run names its cluster job (governance/ledger/trail.py
``cluster``): the scheduler without credentials and the Dask keys. The key is optional in
the hashed body, so a chain written before it existed (and every local run's record)
hashes and verifies as before, also with the independent tool; a changed job id is caught."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from governance.audit import verification, export as audit_export
from governance.ledger import trail, actions as ledger
from governance.models import AuditRecord
from tests.audit.conftest import build_history, ctx, tamperer  # noqa: F401 (fixture)

from .test_distributed_api import ask, events, on_cluster, parts_dir, table  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db
TOOL = Path(__file__).resolve().parents[2] / "tools" / "recompose_audit.py"
JOB = {"backend": "dask", "scheduler": "tcp://10.0.0.5:8786", "keys": ["finalize-0f1e2d3c"]}


def old_digest(rec: AuditRecord, name: str) -> str:
    """The hash as the code before the ``cluster`` key computed it: the same fields, no more."""
    body = trail.body(rec, name)
    return trail.digest({k: body[k] for k in trail.FIELDS})


@pytest.fixture
def mixed_chain(make_dataset, grant, analyst):
    """Records in the old format (no cluster), then one of a distributed run."""
    ds = make_dataset("survey", epsilon=3.0)
    grant(analyst, ds)
    build_history(ds, [analyst], n=8)
    old = list(AuditRecord.objects.filter(dataset=ds).order_by("seq"))
    entry = ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.1}, reference="distributed")
    ledger.commit(entry, audit_ctx=ctx(outcome="succeeded", worker="cpu@a", cluster=JOB))
    return ds, old


def test_records_without_a_cluster_job_hash_as_before(mixed_chain):
    ds, old = mixed_chain
    assert len(old) >= 8
    for rec in old:
        assert rec.cluster is None and "cluster" not in trail.body(rec, ds.name)
        assert rec.hash == old_digest(rec, ds.name)
    assert verification.verify().ok


def test_the_api_shows_the_job_the_export_has(mixed_chain, api, officer):
    """``GET /api/audit/`` left ``cluster`` out, which the export and the hash hold (a probe)."""
    ds, _ = mixed_chain
    last = AuditRecord.objects.filter(dataset=ds).latest("seq")
    client = api(officer)
    assert client.get(f"/api/audit/{last.pk}/").json()["cluster"] == JOB
    rows = client.get(f"/api/audit/?dataset__name={ds.name}&page_size=1000").json()["results"]
    assert [r["cluster"] for r in rows].count(JOB) == 1 and rows[0]["cluster"] is None


def test_a_distributed_records_job_is_hashed_and_checked_by_the_tool(mixed_chain, tmp_path):
    ds, _ = mixed_chain
    last = AuditRecord.objects.filter(dataset=ds).latest("seq")
    assert trail.body(last, ds.name)["cluster"] == JOB
    assert last.hash != old_digest(last, ds.name)  # the job is under the hash
    path = tmp_path / "export.json"
    path.write_bytes(audit_export.to_json(audit_export.build([ds])))
    p = subprocess.run([sys.executable, "-I", str(TOOL), str(path), "--json"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def test_a_tampered_job_id_is_detected(mixed_chain, tamperer):  # noqa: F811
    ds, _ = mixed_chain
    last = AuditRecord.objects.filter(dataset=ds).latest("seq")
    forged = {**JOB, "keys": ["finalize-ffffffff"]}
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {AuditRecord._meta.db_table} SET cluster = %s WHERE id = %s",
                    [json.dumps(forged), last.pk])
    found = verification.verify()
    assert not found.ok and found.first_broken.seq == last.seq


def test_the_job_names_the_scheduler_without_credentials():
    job = trail.cluster_job({"cluster": {"backend": "dask", "scheduler": "tls://ops:s3cret@dask.internal:8786?t=1",
                                         "graph_key": "finalize-abc", "partitions": 4}})
    assert job == {"backend": "dask", "scheduler": "tls://dask.internal:8786", "keys": ["finalize-abc"]}
    assert trail.cluster_job({"other": 1}) is None and trail.cluster_job(None) is None


def test_a_distributed_counts_record_names_its_graph(api, analyst, events, on_cluster,  # noqa: F811
                                                    django_capture_on_commit_callbacks):
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5, "max_rows_per_unit": 1},
               django_capture_on_commit_callbacks)
    assert body["status"] == "succeeded", body
    rec = AuditRecord.objects.filter(action="commit").latest("seq")
    assert rec.cluster["scheduler"] == on_cluster and rec.cluster["backend"] == "dask"
    assert len(rec.cluster["keys"]) == 1 and rec.cluster["keys"][0]
    assert verification.verify().ok


def test_a_distributed_run_that_fails_on_the_cluster_names_its_job_too(api, analyst, events, on_cluster,  # noqa: F811
                                                                       django_capture_on_commit_callbacks,
                                                                       monkeypatch):
    from engines.distributed import aggregates

    def broken(*a, **kw):
        raise RuntimeError("after the cluster answered")

    monkeypatch.setattr(aggregates.local, "finish", broken)
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5, "max_rows_per_unit": 1},
               django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_after_read", body
    rec = AuditRecord.objects.filter(action="commit").latest("seq")
    assert rec.outcome == "failed" and rec.cluster["scheduler"] == on_cluster and len(rec.cluster["keys"]) == 1
    assert verification.verify().ok
