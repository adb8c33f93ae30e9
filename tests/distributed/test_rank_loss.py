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
from .test_dpsgd_ranks import PARAMS


@pytest.mark.parametrize("dies", [1, 0], ids=["rank1-dies", "rank0-dies"])
def test_a_rank_that_dies_fails_the_run_within_a_minute_charged_the_steps_taken(hosts, partitioned, tmp_path, dies):
    scheduler, dirs = hosts
    table, manifest, _ = partitioned
    c = cluster.client(scheduler)
    heal_hosts(2)
    ds = DatasetMeta(name="events", columns=UNIT_COLUMNS, unit_column="pid", n_rows=table.num_rows,
                     n_units=len(set(table.column("pid").to_pylist())), delta=1e-6)
    req = EngineRequest("train", {**PARAMS, "epochs": 400, "canaries": 0})
    plan = plugins.plan("dpsgd", req, ds)
    parts = PartitionedTable(paths=tuple(m["path"] for m in manifest), columns=("pid", "age", "income", "site", "flag"),
                             num_rows=table.num_rows, unit_column="pid", scheduler=scheduler)
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
