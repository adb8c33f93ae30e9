"""Requests through the REST API, a real Redis broker and a real worker process."""

import time

import pytest

from governance.models import LedgerEntry, Request

from .conftest import REDIS_URL, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    return ds


def finished(client, rid):
    def check():
        body = client.get(f"/api/requests/{rid}/").json()
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None
    return check


def test_a_dp_count_runs_on_a_real_worker(real_worker, api, analyst, clinic):
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": clinic.name, "engine": "aggregates", "kind": "count",
                                       "params": {"epsilon": 2.0}}, format="json")
    assert r.status_code == 202, r.content
    body = wait_for(finished(client, r.json()["id"]))
    assert body["status"] == "succeeded", body
    assert abs(body["result"]["value"] - 200) < 40
    lo, hi = body["result"]["ci95"]
    assert lo < body["result"]["value"] < hi
    assert body["charge"]["ledger_status"] == "committed"
    assert Request.objects.get(pk=body["id"]).worker  # the worker's hostname


def test_a_real_worker_keeps_its_database_connection_across_tasks(real_worker, api, analyst, make_dataset, grant):
    """Celery's Django fix-up would open a new connection for every task (a new PostgreSQL
    backend per request); settings.CELERY_DB_REUSE_MAX and workers.tasks keep it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL sessions (pg_stat_database)")
    ds = make_dataset(epsilon=50.0)
    grant(analyst, ds)
    client = api(analyst)

    def sessions():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            return cur.fetchone()[0]

    def count(eps):
        r = client.post("/api/requests/?wait=30", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                                   "params": {"epsilon": eps}}, format="json")
        assert r.status_code == 202 and r.json()["status"] == "succeeded", r.content

    count(1.0)  # the worker's connections are open
    time.sleep(1.2)  # sessions are counted when a backend reports its statistics (at most every second)
    before = sessions()
    for k in range(8):
        count(1.0 + (k + 1) * 1e-6)
    time.sleep(1.2)
    assert sessions() - before <= 2  # 8 with a connection per task


def test_a_task_delivered_twice_by_the_broker_changes_nothing(real_worker, api, analyst, clinic):
    client = api(analyst)
    rid = client.post("/api/requests/", {"dataset": clinic.name, "engine": "aggregates", "kind": "count",
                                         "params": {"epsilon": 1.0}}, format="json").json()["id"]
    first = wait_for(finished(client, rid))
    real_worker(rid)  # the broker delivers it again, twice
    real_worker(rid)
    sentinel = client.post("/api/requests/", {"dataset": clinic.name, "engine": "aggregates", "kind": "count",
                                              "params": {"epsilon": 0.5}}, format="json").json()["id"]
    wait_for(finished(client, sentinel))  # the worker has drained the queue (one process, in order)
    again = client.get(f"/api/requests/{rid}/").json()
    assert again["result"] == first["result"] and again["finished_at"] == first["finished_at"]
    assert LedgerEntry.objects.filter(status="committed").count() == 2


def test_a_model_is_trained_on_the_gpu_queue_by_a_real_worker(real_worker, api, analyst, make_dataset, grant):
    from tests.real_data import GSS_SCHEMA, GSS_TRAIN, gss_wages

    grant(analyst, make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "gss", "engine": "dpsgd", "kind": "train", "params": {
        **GSS_TRAIN, "target_epsilon": 3.0, "epochs": 2, "batch_size": 1024, "canaries": 100}}, format="json")
    assert r.status_code == 202, r.content
    rid = r.json()["id"]
    seen = []

    def done():
        body = client.get(f"/api/requests/{rid}/").json()
        seen.append(body["progress"])
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None

    body = wait_for(done, timeout=180)
    assert body["status"] == "succeeded", body
    res = body["result"]
    assert len(res["history"]) == 2 and res["epsilon_spent"] == pytest.approx(3.0, rel=0.01)
    assert res["test"]["accuracy"] > 0.6 and res["audit"]["canaries"] == 100
    assert body["charge"]["ledger_status"] == "committed"
    # progress was visible while it ran (on the run clock's ticks: which phases fall on a
    # tick depends on the machine's speed)
    assert any(p.get("phase") in ("preparing data", "auditing") or p.get("phase", "").startswith("training")
               for p in seen), seen
    model = client.get(f"/api/requests/{rid}/files/model.pt/")
    assert model.status_code == 200
    assert len(b"".join(model.streaming_content)) == {f["name"]: f for f in res["files"]}["model.pt"]["bytes"]


def test_a_synthetic_table_is_made_on_the_gpu_queue_by_a_real_worker(real_worker, api, analyst, officer,
                                                                      make_dataset, grant):
    from tests.real_data import GSS_SCHEMA, gss_wages

    grant(analyst, make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "gss", "engine": "synthesis", "kind": "synthesize", "params": {
        "method": "mst", "epsilon": 1.0, "rows": 2000, "holdout_fraction": 0.1}}, format="json")
    assert r.status_code == 202, r.content
    rid = r.json()["id"]
    body = wait_for(finished(client, rid), timeout=300)
    assert body["status"] == "succeeded", body
    assert body["result"]["rows"] == 2000 and body["charge"]["ledger_status"] == "committed"
    assert body["charge"]["rdp"]["epsilon"] == pytest.approx(1.0, rel=1e-6)
    table = client.get(f"/api/requests/{rid}/files/synthetic.parquet/")
    assert table.status_code == 200 and b"".join(table.streaming_content)[:4] == b"PAR1"
    report = api(officer).get(f"/api/requests/{rid}/").json()["officer_report"]
    assert report["quality"]["summary"] and report["privacy"]["summary"]


def test_a_worker_killed_mid_training_is_recovered_by_the_sweep(real_worker, api, analyst, make_dataset, grant):
    """kill -9 while a DP-SGD run trains: its heartbeat stops, the sweep finishes the request
    as failed and commits the reservation in full (the data was read), once; the chain verifies."""
    import os
    import signal
    import time

    from governance.audit import verification
    from governance.models import AuditRecord
    from governance.requests.recovery import sweep
    from tests.real_data import GSS_SCHEMA, GSS_TRAIN, gss_wages

    grant(analyst, make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA))
    client = api(analyst)
    rid = client.post("/api/requests/", {"dataset": "gss", "engine": "dpsgd", "kind": "train", "params": {
        **GSS_TRAIN, "target_epsilon": 3.0, "epochs": 20, "batch_size": 256}}, format="json").json()["id"]

    def training():
        req = Request.objects.get(pk=rid)
        return req.status == "running" and req.data_read and req.progress.get("phase", "").startswith("training")

    wait_for(training, timeout=120)
    reserved = LedgerEntry.objects.get(request__id=rid).cost
    time.sleep(1.5)  # a heartbeat or two
    beat = Request.objects.get(pk=rid).heartbeat_at
    assert beat is not None
    os.kill(real_worker.process.pid, signal.SIGKILL)
    real_worker.process.wait(10)
    assert sweep(lost_after=30)["lost"] == []  # within the grace period: left alone
    time.sleep(3)
    assert sweep(lost_after=2)["lost"] == [rid]
    req = Request.objects.get(pk=rid)
    entry = LedgerEntry.objects.get(pk=req.ledger_entry_id)
    assert req.status == "failed" and req.error["code"] == "request.worker_lost" and req.result is None
    assert entry.status == "committed" and entry.committed_cost is None and entry.cost == reserved
    assert AuditRecord.objects.filter(request_id=rid).count() == 1
    assert sweep(lost_after=2)["lost"] == [] and verification.verify().ok


def test_a_worker_started_again_under_its_name_does_not_vouch_for_the_dead_one_s_run(
        real_worker, api, analyst, make_dataset, grant, settings):
    """A probe killed a worker and started it again: the new one has the same node name
    (``celery@<host>``), and its liveness record vouched for the dead one's running request,
    which the sweep then only watched: finished 3 min 45 s after the kill instead of 2. The
    claim records the worker's process; a sweeper that had not watched the request finishes
    it at first sight, by the database's clock, while the new worker is alive."""
    import os
    import signal

    from governance.core import liveness
    from governance.requests import recovery
    from tests.real_data import GSS_SCHEMA, GSS_TRAIN, gss_wages

    settings.REDIS_URL = REDIS_URL  # this process reads the workers' records too
    grant(analyst, make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA))
    client = api(analyst)
    rid = client.post("/api/requests/", {"dataset": "gss", "engine": "dpsgd", "kind": "train", "params": {
        **GSS_TRAIN, "target_epsilon": 3.0, "epochs": 20, "batch_size": 256}}, format="json").json()["id"]
    wait_for(lambda: Request.objects.get(pk=rid).data_read, timeout=120)
    dead = real_worker.process
    req = Request.objects.get(pk=rid)
    # the solo pool: the worker's own process, its id and start time
    assert req.worker_process == liveness.process_key(dead.pid) and req.worker_process.startswith(f"{dead.pid}@")
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(10)
    again = real_worker.start_again()

    def only_the_new_one():
        pids = {r.get("pid") for r in liveness.alive() if r.get("node") == req.worker}
        return pids == {again.pid}  # its start removed the dead process's record (same host)
    wait_for(only_the_new_one, timeout=60)
    time.sleep(2.5)  # the dead run's heartbeat is older than the grace period below
    recovery.WATCH.seen.clear()  # a sweeper that has not watched it (a fresh process)
    assert recovery.sweep(lost_after=2)["lost"] == [rid]
    assert Request.objects.get(pk=rid).error["code"] == "request.worker_lost"


@pytest.mark.worker(pool="prefork", CELERY_TASK_SOFT_TIME_LIMIT="25", CELERY_TASK_TIME_LIMIT="120",
                    CELERY_VISIBILITY_TIMEOUT="240")
def test_the_worker_s_own_time_limit_stops_a_training_charged_its_steps(real_worker, api, analyst, make_dataset,
                                                                        grant, settings):
    """The limits set on the worker, not on the sender (this test process keeps 3 h): a DP-SGD
    run stopped at 25 s fails as request.time_limit, charged the steps taken, and the worker
    serves the next request. Before, the message carried the sender's 3 h and the worker's
    limits never fired (probe AF). (At 10 s, on a loaded machine, loading torch before the
    read took the whole limit once: failed before the read, refunded, as it should be, but
    not this test's case.)"""
    from tests.real_data import GSS_SCHEMA, GSS_TRAIN, gss_wages

    assert settings.CELERY_TASK_SOFT_TIME_LIMIT > 3600
    ds = make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA)
    grant(analyst, ds)
    client = api(analyst)
    rid = client.post("/api/requests/", {"dataset": "gss", "engine": "dpsgd", "kind": "train", "params": {
        **GSS_TRAIN, "target_epsilon": 3.0, "epochs": 100, "batch_size": 256}}, format="json").json()["id"]
    body = wait_for(finished(client, rid), timeout=180)
    assert body["status"] == "failed" and body["error"]["code"] == "request.time_limit", body["error"]
    entry = LedgerEntry.objects.get(request__id=rid)
    assert entry.status == "committed" and entry.committed_event is not None  # the steps taken, not all
    r = client.post("/api/requests/", {"dataset": "gss", "engine": "aggregates", "kind": "count",
                                       "params": {"epsilon": 0.5}}, format="json")
    assert wait_for(finished(client, r.json()["id"]))["status"] == "succeeded"
