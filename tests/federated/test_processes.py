"""Federated runs on real processes: a ``flower-superlink`` and site agents
(``python -m engines.federated.site`` -> ``flower-supernode``) on localhost, the engine
submitting its Flower App with ``flwr run`` (through the plugin manager's hooks)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from engines import federated, plugins
from engines.federated import planner
from engines.federated.types import Federation
from engines.types import Cancelled, EngineRequest
from tests.federated.helpers import meta, write_sites



@pytest.fixture(autouse=True)
def engine():
    assert plugins.pm.is_registered(federated)  # a built-in engine (engines.plugins.BUILTINS)
    yield


def fed(cluster, sites, **kw):
    return Federation(cluster.address, {s: f"key-{s}" for s in sites}, **kw)


def test_bad_sites_are_refused_and_bad_updates_rejected_on_real_supernodes(cluster, tmp_path):
    tables = write_sites(tmp_path, 4, rows=300)
    schema = tmp_path / "schema.csv"
    import pyarrow.csv as pcsv

    pcsv.write_csv(pq.read_table(tables[3]).drop(["x2"]), schema)
    registered = ["a", "b", "c", "e"]  # (an oversized update: test_coordinator.py, in-process)
    cluster.start_site("a", tables[0])
    cluster.start_site("b", tables[1])
    cluster.start_site("c", tables[2], misbehave="nan")
    cluster.start_site("e", schema)  # registered, but its table lacks a declared column
    cluster.start_site("mallory", tables[0])  # not registered: its own secret, no registration
    ds = meta(registered, rows=300)
    req = EngineRequest("train", {"target": "label", "rounds": 2, "eval_every": 2, "target_epsilon": 8.0,
                                  "eval_epsilon": 1.0})
    plan = plugins.plan("federated", req, ds)
    seen = []
    out = tmp_path / "out"
    out.mkdir()
    # every site answers here: a round waits only as long as the slowest (a first hello starts a
    # ClientApp process, which took over 30 s on a CI machine at load 14: "no answer to hello")
    rel = plugins.run("federated", req, ds, fed(cluster, registered, wait_sites_seconds=40, round_timeout=120),
                      plan, seen.append, out)
    r = rel.result
    assert r["stopped"] == "completed" and r["rounds"] == 2 and rel.actual_event is None
    assert sorted(r["sites"]["connected"]) == ["a", "b", "c"]
    refused = " | ".join(r["sites"]["refused"].values())
    assert "unregistered site" in refused and "mallory" not in refused  # not named: maybe another's
    assert "e: schema: missing column 'x2'" in refused
    for h in r["history"]:
        assert h["sites"]["accepted"] == ["a", "b"]
        assert "not_finite" in h["sites"]["rejected"]["c"]
    assert r["epsilon_spent"] == pytest.approx(plan.details["planned_epsilon"])
    assert r["test"]["dp"] and len(r["test"]["accuracy_ci95"]) == 2
    rounds = [p["round"] for p in seen if p.get("phase") == "training"]
    assert [r for i, r in enumerate(rounds) if not i or r != rounds[i - 1]] == [1, 2]  # a report may repeat
    assert (out / "model.json").exists()


def test_a_site_killed_mid_run_and_a_site_joining_late(cluster, tmp_path):
    tables = write_sites(tmp_path, 4, rows=300)
    registered = ["a", "b", "c", "d"]
    for s, t in zip("abc", tables):
        cluster.start_site(s, t)
    ds = meta(registered, rows=300)
    req = EngineRequest("train", {"target": "label", "rounds": 3, "eval_every": 3, "target_epsilon": "inf"})
    plan = plugins.plan("federated", req, ds)

    done = []

    def progress(p):
        if p.get("round") == 1 and not done:  # after round 1: c dies (SIGKILL, its SuperNode and ClientApp),
            done.append(1)                    # d comes up (once: the engine repeats its last report)
            cluster.kill_site("c")
            cluster.start_site("d", tables[3])

    rel = plugins.run("federated", req, ds, fed(cluster, registered, wait_sites_seconds=60, min_sites=3,
                                                       round_timeout=30),
                      plan, progress, None)
    h = rel.result["history"]
    assert len(h) == 3 and rel.result["stopped"] == "completed"
    assert h[0]["sites"]["accepted"] == ["a", "b", "c"] and h[0]["sites"]["not_connected"] == ["d"]
    # c's round-2 update never arrives: the round completes with the others, c's share counts 0
    assert "c" in h[1]["sites"]["rejected"] and "c" not in h[1]["sites"]["accepted"]
    assert {"a", "b"} <= set(h[1]["sites"]["accepted"])
    assert "d" in h[2]["sites"]["accepted"]  # joined late, identified, trained
    assert "c" not in h[2]["sites"]["accepted"]
    assert h[0]["sites"]["connected"] == ["a", "b", "c"] and h[2]["sites"]["connected"] == ["a", "b", "d"]


def test_secure_aggregation_and_a_cancel_that_charges_only_the_rounds_done(cluster, tmp_path):
    """SecAgg+'s four stages through a real SuperLink (the server gets the sum only; a site
    whose update is NaN withholds it itself, zeros in the sum), and a cancel after round 1."""
    tables = write_sites(tmp_path, 3, rows=300)
    cluster.start_site("a", tables[0])
    cluster.start_site("b", tables[1])
    cluster.start_site("c", tables[2], misbehave="nan")
    ds = meta(["a", "b", "c"], rows=300)
    req = EngineRequest("train", {"target": "label", "rounds": 6, "target_epsilon": 3.0, "eval_every": 6,
                                  "secure_aggregation": True})
    plan = plugins.plan("federated", req, ds)
    rounds = []

    def progress(p):
        if p.get("phase") == "training":
            rounds.append(p)
            raise Cancelled("cancelled by the analyst")

    with pytest.raises(Cancelled) as e:
        plugins.run("federated", req, ds, fed(cluster, ["a", "b", "c"], wait_sites_seconds=40, round_timeout=120),
                    plan, progress, None)
    first = rounds[0]
    assert first["round"] == 1 and first["epsilon_spent"] == pytest.approx(planner.epsilon_after(plan.details, 1, 0))
    assert first["sites"]["accepted"] == ["a", "b"]
    assert first["sites"]["rejected"]["c"] == "withheld at the site: not_finite"
    done = e.value.actual_event["steps"]
    assert done in (1, 2)  # the round under way when the cancel came finishes
    assert e.value.actual_event == planner.rounds_event(plan.details, done, 0)


def test_a_site_agent_starts_its_supernode_again_when_it_ends(cluster, tmp_path):
    """A probe restarted the SuperLink: every site's SuperNode was told to terminate (the
    SuperLink keeps its nodes in memory), every agent ended with it, and the next run found
    no site. The agent now starts its SuperNode again; the site then serves the next run."""
    import os
    import signal
    import time

    import psutil

    from tests.workers.conftest import wait_for

    tables = write_sites(tmp_path, 1, rows=300)
    agent = psutil.Process(cluster.start_site("a", tables[0]).pid)

    def supernode():
        return next((p for p in agent.children() if "flower-supernode" in " ".join(p.cmdline())), None)

    first = wait_for(supernode, timeout=30)
    os.kill(first.pid, signal.SIGKILL)  # it ends on its own, as on the SuperLink's word
    again = wait_for(lambda: (p := supernode()) is not None and p.pid != first.pid and p, timeout=30)
    assert agent.is_running() and again.is_running()
    time.sleep(0.5)
    ds = meta(["a"], rows=300)
    req = EngineRequest("train", {"target": "label", "rounds": 1, "target_epsilon": "inf"})
    rel = plugins.run("federated", req, ds, fed(cluster, ["a"], wait_sites_seconds=60, round_timeout=60),
                      plugins.plan("federated", req, ds), lambda p: None, None)
    assert rel.result["sites"]["connected"] == ["a"] and rel.result["stopped"] == "completed"
    assert b"starting it again" in (tmp_path / "agent-a.log").read_bytes()
