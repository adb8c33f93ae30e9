"""A governed federated run end to end (issue 27): a federated dataset registered through
the REST API, its sites' secrets handed out by the officer, a real Flower SuperLink, real
site agents (``python -m engines.federated.site`` -> ``flower-supernode``), a real Celery
worker; the analyst follows the rounds in the request's progress; the ledger charges the
plan's event; the audit record names the sites that took part and the one refused."""

import pytest

from governance.models import AuditRecord, LedgerEntry
from tests.federated.conftest import Cluster
from tests.federated.helpers import write_sites

from .conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = [
    {"name": "x1", "type": "numeric", "lower": -3.0, "upper": 3.0},
    {"name": "x2", "type": "numeric", "lower": -3.0, "upper": 3.0},
    {"name": "color", "type": "categorical", "domain": ["red", "green", "blue"]},
    {"name": "label", "type": "categorical", "domain": ["no", "yes"]},
]


@pytest.fixture
def superlink(tmp_path, monkeypatch):
    """A SuperLink, named to the worker (started after this fixture) by FEDERATED_SUPERLINK."""
    cluster = Cluster(tmp_path)
    monkeypatch.setenv("FEDERATED_SUPERLINK", cluster.address)
    monkeypatch.setenv("FEDERATED_WAIT_SITES_SECONDS", "60")
    monkeypatch.setenv("FEDERATED_ROUND_TIMEOUT_SECONDS", "40")
    yield cluster
    cluster.close()


def test_a_federated_run_on_real_sites_and_a_real_worker(superlink, real_worker, api, officer, analyst, grant,
                                                         tmp_path):
    off = api(officer)
    r = off.post("/api/datasets/", {"name": "clinics", "execution": "federated", "schema": SCHEMA, "budget_epsilon": 6,
                                    "sites": [{"site": s, "n_rows": 300} for s in "abc"], "activate": True},
                 format="json")
    assert r.status_code == 201, r.content
    tables = write_sites(tmp_path, 3, rows=300)
    for site, table in zip("abc", tables):
        secret = off.post(f"/api/datasets/clinics/sites/{site}/secret/").json()["secret"]
        superlink.start_site(site, table, key=secret)
    superlink.start_site("mallory", tables[0], key="guessed")  # not registered: refused at hello
    from governance.models import Dataset

    grant(analyst, Dataset.objects.get(name="clinics"))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "clinics", "engine": "federated", "kind": "train", "params": {
        "target": "label", "rounds": 2, "eval_every": 2, "target_epsilon": 4.0, "eval_epsilon": 0.5}}, format="json")
    assert r.status_code == 202, r.content
    rid, reserved = r.json()["id"], r.json()["charge"]["rdp"]["epsilon"]
    seen = []

    def done():
        body = client.get(f"/api/requests/{rid}/").json()
        seen.append(body["progress"])
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None

    body = wait_for(done, timeout=150, interval=0.3)
    assert body["status"] == "succeeded", (body["error"], seen[-3:])
    rounds = [p for p in seen if p.get("phase") == "training"]
    assert rounds and rounds[-1]["history"][-1]["round"] == rounds[-1]["round"]
    assert all(0 < h["epsilon_spent"] <= 4.0 * 1.001 for h in rounds[-1]["history"])
    res = body["result"]
    assert res["rounds"] == 2 and res["epsilon_spent"] == pytest.approx(res["planned_epsilon"])
    assert sorted(res["sites"]["connected"]) == ["a", "b", "c"]
    assert res["test"]["dp"] and len(res["test"]["accuracy_ci95"]) == 2
    assert body["charge"]["ledger_status"] == "committed"
    assert body["charge"]["rdp"]["epsilon"] == pytest.approx(reserved)  # the whole plan ran: charged as planned
    entry = LedgerEntry.objects.get(request__id=rid)
    assert entry.status == "committed" and entry.committed_event is None
    rec = AuditRecord.objects.get(request_id=rid, action="commit")
    assert rec.cluster["backend"] == "flower" and rec.cluster["superlink"] == superlink.address
    assert rec.cluster["sites"]["connected"] == ["a", "b", "c"]
    assert rec.cluster["sites"]["aggregated"] == ["a", "b", "c"]
    refused = rec.cluster["sites"]["refused"]  # the name it claimed is not repeated: maybe another dataset's
    assert "unregistered site" in refused and not any("mallory" in why for why in refused)
    assert rec.cluster["job"] == str(res["flower_run_id"])
    # the officer sees the same names in the request's officer report; the analyst no secret anywhere
    assert off.get(f"/api/requests/{rid}/").json()["officer_report"]["cluster"]["sites"]["connected"] == ["a", "b", "c"]
    from governance.datasets.federated import site_secret

    text = client.get(f"/api/requests/{rid}/").content.decode() + client.get("/api/datasets/clinics/").content.decode()
    assert not any(site_secret("clinics", s) in text for s in "abc")
