"""DP-SGD data-parallel through the REST API: a real Celery worker (Redis broker, its own
process) drives a 2-rank training on the real local Dask cluster (two worker processes,
one rank each, joined by a gloo group); the charge is the plan's, which is that of one
process (tests/dpsgd/test_parallel.py checks the noise and the plan)."""

import pytest

from governance.models import Dataset, LedgerEntry, Request
from tests.workers.conftest import real_worker, redis_server, wait_for  # noqa: F401 (fixtures)

from .conftest import make_table, write_partitions
from .test_real_worker import cluster_env  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

PARAMS = {"target": "flag", "features": ["age", "income", "site"], "target_epsilon": 2.0, "epochs": 2,
          "batch_size": 100, "model": {"hidden": [8]}, "max_rows_per_unit": 2, "canaries": 20, "ranks": 2}


def test_a_two_rank_training_runs_on_the_cluster_through_the_api(cluster_env, real_worker,  # noqa: F811
                                                                 api, officer, analyst, grant, import_dir):
    table = make_table(6_000, seed=11)
    write_partitions(table, import_dir / "events", 3)
    r = api(officer).post("/api/datasets/", {"name": "events", "path": str(import_dir / "events"),
                                             "execution": "distributed", "unit_column": "pid",
                                             "schema": {"age": {"lower": 18, "upper": 90},
                                                        "income": {"lower": 0, "upper": 100_000}},
                                             "budget_epsilon": 10.0, "activate": True}, format="json")
    assert r.status_code == 201, r.json()
    grant(analyst, Dataset.objects.get(name="events"))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "events", "engine": "dpsgd", "kind": "train", "params": PARAMS},
                    format="json")
    assert r.status_code == 202, r.json()
    rid = r.json()["id"]
    body = wait_for(lambda: (b := client.get(f"/api/requests/{rid}/").json())["status"] in ("succeeded", "failed")
                    and b, timeout=120)
    assert body["status"] == "succeeded", body
    result = body["result"]
    assert result["ranks"] == 2
    assert result["steps"] == result["planned_steps"] > 0 and result["stopped"] == "completed"
    assert result["epsilon_spent"] == pytest.approx(result["planned_epsilon"], rel=1e-6)
    assert len(result["history"]) == 2 and "val_accuracy" in result["history"][-1]
    assert result["audit"] is not None  # rank 0 held the canaries and audited
    assert {f["name"] for f in result["files"]} >= {"model.pt", "preprocessing.json"}
    entry, planned = LedgerEntry.objects.get(), Request.objects.get(pk=rid).plan["event"]["events"][0]
    assert entry.status == "committed" and entry.committed_event is None  # the whole plan, spent
    assert {k: entry.event["events"][0][k] for k in ("sample_rate", "noise_multiplier", "steps")} == \
        {k: planned[k] for k in ("sample_rate", "noise_multiplier", "steps")}
    job = Request.objects.get(pk=rid).officer_report["cluster"]
    assert job["scheduler"] == cluster_env and len(job["workers"]) == 2
    assert job["keys"] == [f"{job['job']}-rank0", f"{job['job']}-rank1"]


def test_ranks_hold_whole_units_and_every_row_once(partitioned):
    from engines.distributed import PartitionedTable
    from engines.distributed.training import rank_rows

    table, manifest, _ = partitioned
    parts = PartitionedTable(paths=tuple(m["path"] for m in manifest), columns=("pid", "age"),
                             num_rows=table.num_rows, unit_column="pid")
    ranks = [rank_rows(parts, r, 3) for r in range(3)]
    units = [set(t.column("pid").to_pylist()) for t in ranks]
    assert sum(t.num_rows for t in ranks) == table.num_rows
    assert all(len(units[i] & units[j]) == 0 for i in range(3) for j in range(i + 1, 3))
    assert all(t.num_rows > table.num_rows / 5 for t in ranks)  # a fair share each
    rows = PartitionedTable(paths=parts.paths, columns=("age",), num_rows=table.num_rows)  # no unit: whole files
    assert sum(rank_rows(rows, r, 2).num_rows for r in range(2)) == table.num_rows


def test_a_cancelled_two_rank_run_charges_the_steps_taken(dask_cluster, partitioned, tmp_path):
    from engines import plugins
    from engines.distributed import PartitionedTable
    from engines.types import Cancelled, DatasetMeta, EngineRequest

    from .conftest import UNIT_COLUMNS

    table, manifest, _ = partitioned
    ds = DatasetMeta(name="events", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                     n_units=len(set(table.column("pid").to_pylist())), delta=1e-6, distributed=True)
    req = EngineRequest("train", {**PARAMS, "epochs": 50, "canaries": 0})
    plan = plugins.plan("dpsgd", req, ds)
    parts = PartitionedTable(paths=tuple(m["path"] for m in manifest), columns=("pid", "age", "income", "site", "flag"),
                             num_rows=table.num_rows, unit_column="pid", scheduler=dask_cluster)

    def progress(info):
        if info.get("steps", 0) >= 1:
            raise Cancelled("stop")

    with pytest.raises(Cancelled) as got:
        plugins.run("dpsgd", req, ds, parts, plan, progress, workdir=tmp_path)
    spent, planned = got.value.actual_event, plan.event["events"][0]
    # the steps taken, composed with the evaluations released if any were (execute.py)
    trained = spent["events"][0] if spent["kind"] == "composed" else spent
    assert 0 < trained["steps"] < planned["steps"]
    assert trained["sample_rate"] == planned["sample_rate"]
