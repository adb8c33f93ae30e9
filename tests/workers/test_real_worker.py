"""Requests through the REST API, a real Redis broker and a real worker process."""

import pytest

from governance.models import LedgerEntry, Request

from .conftest import wait_for

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
