"""The production path: a real Celery worker (Redis broker, its own process) drives a
request on a distributed dataset through the Dask cluster's scheduler and commits its
charge (a second delivery is tests/workers' and test_distributed_api's concern)."""

import pytest

from governance.models import Dataset, LedgerEntry, Request
from tests.workers.conftest import real_worker, redis_server, wait_for  # noqa: F401 (fixtures)

from .conftest import make_table, write_partitions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster_env(dask_cluster, settings, monkeypatch):
    """The worker subprocess reads DASK_SCHEDULER_ADDRESS from its environment."""
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_cluster)
    settings.DASK_SCHEDULER_ADDRESS = dask_cluster
    return dask_cluster


def test_a_real_worker_runs_a_distributed_count_on_the_cluster(cluster_env, real_worker,  # noqa: F811
                                                               api, officer, analyst, grant, import_dir):
    table = make_table(6_000, seed=7)
    write_partitions(table, import_dir / "events", 3)
    r = api(officer).post("/api/datasets/", {"name": "events", "path": str(import_dir / "events"),
                                             "execution": "distributed", "unit_column": "pid",
                                             "budget_epsilon": 5.0, "activate": True}, format="json")
    assert r.status_code == 201, r.json()
    grant(analyst, Dataset.objects.get(name="events"))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "events", "engine": "aggregates", "kind": "count",
                                       "params": {"epsilon": 0.5, "max_rows_per_unit": 1}}, format="json")
    assert r.status_code == 202, r.json()
    rid = r.json()["id"]
    body = wait_for(lambda: (b := client.get(f"/api/requests/{rid}/").json())["status"] in ("succeeded", "failed")
                    and b)
    assert body["status"] == "succeeded", body
    assert abs(body["result"]["value"] - len(set(table.column("pid").to_pylist()))) < 100  # noise b = 2
    assert LedgerEntry.objects.get().status == "committed" and body["charge"]["ledger_status"] == "committed"
    assert Request.objects.get(pk=rid).officer_report["cluster"]["scheduler"] == cluster_env
