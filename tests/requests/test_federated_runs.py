"""A federated run through the worker's path (in-process, the engine's run replaced: the
real-process run is tests/workers/test_federated_run.py): without a SuperLink the run fails
before reaching a site and is refunded; a cancel after one round charges that round (the
engine's ``actual_event``, as DP-SGD's steps) and its audit record names the sites; the
progress per round carries the history of epsilon and the DP evaluation."""

import pytest

from engines import plugins
from engines.federated import planner
from engines.types import Cancelled
from governance.datasets import registry
from governance.models import AuditRecord, LedgerEntry, Request
from governance.requests.federated_runs import Recorder

pytestmark = pytest.mark.django_db

SCHEMA = [{"name": "x", "type": "numeric", "lower": 0, "upper": 1},
          {"name": "label", "type": "categorical", "domain": ["no", "yes"]}]
PARAMS = {"target": "label", "rounds": 4, "eval_every": 2, "target_epsilon": 3.0}


@pytest.fixture
def wards(officer, analyst, grant):
    ds = registry.register(name="wards", created_by=officer, schema=SCHEMA, budget_epsilon=5.0, activate=True,
                           execution="federated", sites=[{"site": s, "n_rows": 100} for s in ("h1", "h2", "h3")])
    grant(analyst, ds)
    return ds


def submit(api, analyst, capture):
    with capture(execute=True):  # the task is sent on commit; Celery runs it in-process
        r = api(analyst).post("/api/requests/", {"dataset": "wards", "engine": "federated", "kind": "train",
                                                 "params": PARAMS}, format="json")
    assert r.status_code in (200, 202), r.content
    return api(analyst).get(f"/api/requests/{r.json()['id']}/").json()


def test_without_a_superlink_the_run_fails_before_any_site_and_is_refunded(
        api, analyst, wards, settings, django_capture_on_commit_callbacks):
    settings.FEDERATED_SUPERLINK = ""
    body = submit(api, analyst, django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read"
    assert "FEDERATED_SUPERLINK is not set" in body["error"]["detail"]
    assert LedgerEntry.objects.get().status == "released"


def test_a_cancel_after_one_round_charges_that_round_and_names_the_sites(
        api, analyst, wards, settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.FEDERATED_SUPERLINK = "127.0.0.1:9"
    seen = {}

    def run(engine, request, dataset, data, plan, progress, workdir=None):
        seen["keys"] = sorted(data.site_keys)
        seen["sites"] = [s["site"] for s in dataset.sites]
        progress({"phase": "sites", "connected": ["h1", "h2"], "refused": {"7": "unregistered site 'eve'"}})
        progress({"phase": "training", "round": 1, "rounds": 4, "epsilon_spent": 1.1, "fraction": 0.25,
                  "sites": {"sampled": ["h1", "h2", "h3"], "accepted": ["h1", "h2"], "rejected": {},
                            "not_connected": ["h3"]}, "eval": {}})
        c = Cancelled("cancelled")
        c.actual_event = planner.rounds_event(plan.details, 1, 0)
        raise c

    monkeypatch.setattr(plugins, "run", run)
    body = submit(api, analyst, django_capture_on_commit_callbacks)
    assert seen == {"keys": ["h1", "h2", "h3"], "sites": ["h1", "h2", "h3"]}
    assert body["status"] == "cancelled"
    entry = LedgerEntry.objects.get()
    assert entry.status == "committed" and entry.committed_event is not None
    assert body["charge"]["rdp"]["epsilon"] < Request.objects.get().plan["details"]["planned_epsilon"]
    rec = AuditRecord.objects.get(action="commit")
    assert rec.outcome == "cancelled"
    assert rec.cluster == {"backend": "flower", "superlink": "127.0.0.1:9", "sites": {
        "connected": ["h1", "h2"], "aggregated": ["h1", "h2"], "refused": ["unregistered site 'eve'"]}}


def test_the_recorder_keeps_each_rounds_epsilon_and_dp_evaluation():
    out = []
    rec = Recorder(out.append, "link:9093")
    rec({"phase": "sites", "fraction": 0.0, "connected": ["a", "b"], "refused": {}})
    rec({"phase": "sites", "fraction": 0.0, "node": "9", "site": None, "why": "unregistered site 'm'"})
    rec({"phase": "training", "round": 1, "rounds": 2, "epsilon_spent": 0.5, "sites": {"accepted": ["a"]},
         "eval": {}})
    rec({"phase": "training", "round": 2, "rounds": 2, "epsilon_spent": 0.9, "sites": {"accepted": ["a", "b"]},
         "eval": {"accuracy": 0.7, "accuracy_ci95": [0.6, 0.8], "dp": True}})
    assert out[1] == {"phase": "sites", "fraction": 0.0, "connected": ["a", "b"], "refused": ["unregistered site 'm'"]}
    assert out[-1]["history"] == [{"round": 1, "epsilon_spent": 0.5},
                                  {"round": 2, "epsilon_spent": 0.9, "accuracy": 0.7, "accuracy_ci95": [0.6, 0.8],
                                   "dp": True}]
    # b dropped in round 3: no longer named connected in the progress, still in the audit's list
    rec({"phase": "training", "round": 3, "rounds": 3, "epsilon_spent": 1.0,
         "sites": {"accepted": ["a"], "connected": ["a"]}, "eval": {}})
    assert out[-1]["connected"] == ["a"]
    job = rec.job({"flower_run_id": 42, "sites": {"connected": ["a", "b", "c"], "refused": {}}, "history": []})
    assert job["job"] == "42" and job["sites"]["connected"] == ["a", "b", "c"]
    assert job["sites"]["aggregated"] == ["a", "b"]


def test_a_round_reported_again_is_one_row_of_the_history():
    """The engine repeats its last report between rounds (so that a cancel is heard)."""
    out = []
    rec = Recorder(out.append, "link:9093")
    update = {"phase": "training", "round": 1, "rounds": 2, "epsilon_spent": 0.5, "sites": {"accepted": ["a"]},
              "eval": {}}
    for _ in range(3):
        rec(update)
    rec({**update, "round": 2, "epsilon_spent": 0.9})
    assert out[-1]["history"] == [{"round": 1, "epsilon_spent": 0.5}, {"round": 2, "epsilon_spent": 0.9}]


def test_a_run_no_site_answered_is_refunded(api, analyst, wards, settings, monkeypatch,
                                           django_capture_on_commit_callbacks):
    """The engine knows no row was read (engines/federated/execute.py, stopped "no_sites")."""
    from engines.federated import execute

    settings.FEDERATED_SUPERLINK = "127.0.0.1:9"

    def run(engine, request, dataset, data, plan, progress, workdir=None):
        return execute._release(plan.details, {"stopped": "no_sites", "rounds": 0, "evals": 0}, None, "1")

    monkeypatch.setattr(plugins, "run", run)
    body = submit(api, analyst, django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read"
    assert "no registered site took part" in body["error"]["detail"]
    assert LedgerEntry.objects.get().status == "released" and body["charge"]["rdp"]["epsilon"] == 0
