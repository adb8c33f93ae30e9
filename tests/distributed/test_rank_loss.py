"""DP-SGD data-parallel on the cluster that models 2 hosts: a rank whose worker dies
(SIGKILL) mid-training fails the run within a minute (the survivor's collective fails,
or the driver sees the worker gone), charged the steps taken (the one under way
counted), never the whole plan nor nothing."""

import os
import signal
import threading
import time

import pytest

from engines import plugins
from engines.distributed import PartitionedTable, cluster
from engines.distributed.training import RankLost, ranks_for
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS, heal_hosts, row_copies
from .slow_table import SlowTable
from .test_dpsgd_ranks import PARAMS


def _training(hosts, partitioned, table_class=PartitionedTable, **extra):
    """A 2-rank training request on the ``hosts`` cluster, healed first: (client, dataset,
    request, plan, the partitions as ``table_class``)."""
    scheduler, _ = hosts
    table, manifest, _ = partitioned
    heal_hosts(2)
    ds = DatasetMeta(name="events", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                     n_units=len(set(table.column("pid").to_pylist())), delta=1e-6, distributed=True)
    req = EngineRequest("train", {**PARAMS, "epochs": 400, "canaries": 0})
    parts = table_class(paths=tuple(m["path"] for m in manifest), columns=("pid", "age", "income", "site", "flag"),
                        num_rows=table.num_rows, unit_column="pid", scheduler=scheduler, **extra)
    return cluster.client(scheduler), ds, req, plugins.plan("dpsgd", req, ds), parts


@pytest.mark.parametrize("dies", [1, 0], ids=["rank1-dies", "rank0-dies"])
def test_a_rank_that_dies_fails_the_run_within_a_minute_charged_the_steps_taken(hosts, partitioned, tmp_path, dies):
    scheduler, dirs = hosts
    c, ds, req, plan, parts = _training(hosts, partitioned)
    victim = c.run(os.getpid)[ranks_for(2, scheduler)[dies]]
    killed = {}

    def progress(info):
        if info.get("steps", 0) >= 1 and not killed:
            killed["at"] = time.monotonic()
            killed["steps"] = info["steps"]
            os.kill(victim, signal.SIGKILL)

    with pytest.raises(RankLost) as got:
        plugins.run("dpsgd", req, ds, parts, plan, progress, workdir=tmp_path)
    took = time.monotonic() - killed["at"]
    assert took < 60, took
    spent, planned = got.value.actual_event, plan.event["events"][0]
    trained = spent["events"][0] if spent["kind"] == "composed" else spent
    assert killed["steps"] <= trained["steps"] < planned["steps"]
    assert trained["sample_rate"] == planned["sample_rate"]
    heal_hosts(2)
    assert row_copies(dirs) == {}


def test_a_rank_lost_while_reading_fails_the_run_at_once_and_frees_the_other_worker(hosts, partitioned, tmp_path):
    """Rank 0 killed while it reads its rows: rank 1, waiting for rank 0's address, waited
    out its 600 s and held its worker's one thread all that time after the run had failed
    (a helper's probe: the worker still busy 2 minutes later). The driver's stop ends the
    wait. No step was taken, but the rows were being read and the rank may have died of
    them: charged as a worker lost after the read (the whole plan, ``actual_event`` None)."""
    scheduler, dirs = hosts
    c, ds, req, plan, parts = _training(hosts, partitioned, SlowTable, delay=1.5)
    workers = ranks_for(2, scheduler)
    victim = c.run(os.getpid)[workers[0]]
    killed = {}

    def kill_soon():
        time.sleep(2.0)  # rank 0 is reading its second of five files
        killed["at"] = time.monotonic()
        os.kill(victim, signal.SIGKILL)

    def progress(info):
        if "starting" in str(info.get("phase")) and not killed.get("thread"):
            killed["thread"] = threading.Thread(target=kill_soon, daemon=True)
            killed["thread"].start()

    with pytest.raises(RankLost) as got:
        plugins.run("dpsgd", req, ds, parts, plan, progress, workdir=tmp_path)
    # within a minute, as the other kill test and issue 23 say (30 s in a CI run at load
    # 4, a 20 s bound failed it); the survivor's thread, below, is what kept waiting 600 s
    assert time.monotonic() - killed["at"] < 60
    assert got.value.actual_event is None
    free = c.submit(os.getpid, workers=[workers[1]], pure=False)
    assert free.result(timeout=15) > 0  # the survivor's thread is free again at once
    heal_hosts(2)
    assert row_copies(dirs) == {}


@pytest.mark.django_db
def test_through_the_api_a_lost_rank_fails_the_request_charged_the_steps_taken(
        hosts, settings, api, officer, analyst, grant, import_dir, django_capture_on_commit_callbacks):
    from governance.models import Dataset, LedgerEntry, Request

    from .conftest import make_table, write_partitions
    from .test_distributed_api import ask

    scheduler, dirs = hosts
    settings.DASK_SCHEDULER_ADDRESS = scheduler
    heal_hosts(2)
    table = make_table(6_000, seed=11)
    write_partitions(table, import_dir / "events", 3)
    r = api(officer).post("/api/datasets/", {"name": "events", "path": str(import_dir / "events"),
                                             "execution": "distributed", "unit_column": "pid",
                                             "schema": {"age": {"lower": 18, "upper": 90},
                                                        "income": {"lower": 0, "upper": 100_000}},
                                             "budget_epsilon": 10.0, "activate": True}, format="json")
    assert r.status_code == 201, r.json()
    grant(analyst, Dataset.objects.get(name="events"))
    c = cluster.client(scheduler)
    victim = c.run(os.getpid)[ranks_for(2, scheduler)[1]]

    def kill_once_training():  # rank 0 reports its progress in a Dask Variable named after the job
        from distributed import Variable

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            keys = [str(k) for k in c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
                    if str(k).startswith("dpsgd-") and str(k).endswith("-rank0")]
            if keys:
                info = Variable(keys[0][:-len("-rank0")] + "-progress", client=c).get(timeout=5)
                if info.get("steps", 0) >= 1:
                    os.kill(victim, signal.SIGKILL)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_once_training, daemon=True)
    killer.start()
    body = ask(api(analyst), "events", "train", {**PARAMS, "epochs": 400, "canaries": 0},
               django_capture_on_commit_callbacks, engine="dpsgd")
    killer.join(5)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_after_read", body
    entry = LedgerEntry.objects.get()
    planned = Request.objects.get(pk=body["id"]).plan["event"]["events"][0]
    spent = entry.committed_event
    assert entry.status == "committed" and spent is not None  # not the whole plan
    trained = spent["events"][0] if spent["kind"] == "composed" else spent
    assert 0 < trained["steps"] < planned["steps"]
    heal_hosts(2)
    assert row_copies(dirs) == {}


def test_a_cancel_while_a_rank_is_frozen_is_charged_the_steps_the_others_report(monkeypatch):
    """A probe froze rank 1 (SIGSTOP) and cancelled: rank 0's collective timed out and it
    returned the steps it took as a failure, no rank returned "cancelled", and the run was
    charged the whole plan (6,000 steps for 31 taken). The failed ranks' steps are the charge."""
    from engines.distributed import training
    from engines.types import Cancelled

    class Future:
        def __init__(self, result=None):
            self._result, self.status = result, "finished" if result is not None else "pending"

        def done(self):
            return self._result is not None

        def result(self):
            return self._result

    class Flag:
        def set(self):
            pass

    class Report:
        def get(self, timeout):
            return {"phase": "training"}

    taken = {"kind": "subsampled_gaussian", "steps": 31}
    survivor, frozen = Future(), Future()
    monkeypatch.setattr(training, "CANCEL_GRACE_SECONDS", 0.2)
    # the scheduler still lists the frozen rank's worker
    monkeypatch.setattr(training.cluster, "scheduler_info", lambda c, n_workers=-1: {"workers": {"w0": {}, "w1": {}}})

    def progress(info):
        # rank 1 froze; the cancel is heard, then rank 0's collective times out
        survivor._result, survivor.status = {"rank": 0, "failed": "RuntimeError", "spent": taken}, "finished"
        raise Cancelled("cancelled by the analyst")

    with pytest.raises(Cancelled) as e:
        training._gather([survivor, frozen], ["w0", "w1"], None, progress, Flag(), Report())
    assert e.value.actual_event == taken


def test_a_cancel_while_the_ranks_read_is_charged_nothing_and_frees_both_workers(hosts, partitioned, tmp_path):
    """A cancel before the group forms: no step taken (charged nothing). Rank 0, reading its
    rows when the stop came, went on to wait the collective's 45 s for a group that would
    never form, its worker's thread held; it now looks at the stop first."""
    from engines.distributed.training import NOTHING
    from engines.types import Cancelled

    scheduler, dirs = hosts
    c, ds, req, plan, parts = _training(hosts, partitioned, SlowTable, delay=1.0)
    workers = ranks_for(2, scheduler)
    asked = {}

    def progress(info):
        asked.setdefault("at", time.monotonic())
        if time.monotonic() - asked["at"] > 1.5:  # both ranks are reading their files
            raise Cancelled("stop")

    with pytest.raises(Cancelled) as got:
        plugins.run("dpsgd", req, ds, parts, plan, progress, workdir=tmp_path)
    assert got.value.actual_event == NOTHING
    free = [c.submit(os.getpid, workers=[w], pure=False) for w in workers]
    started = time.monotonic()
    assert all(f.result(timeout=40) > 0 for f in free)
    assert time.monotonic() - started < 30  # not the 45 s connect timeout
    heal_hosts(2)
    assert row_copies(dirs) == {}
