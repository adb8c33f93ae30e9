"""The sweep kind: one run per epsilon, a non-private baseline ("inf") charged as a
``non_private`` part of the composed event, a real PNG plot and a CSV table."""

import csv
import json
from dataclasses import asdict

import pytest
import torch

from engines import plugins
from engines.dpsgd import execute
from engines.types import EngineRequest, Plan
from tests.engines.dpsgd_helpers import make_table, one_thread, rows_meta  # noqa: F401  (autouse)

SWEEP = {"target": "y", "features": ["x1", "x2", "c"], "epsilons": [1, "inf"], "epochs": 2, "batch_size": 64,
         "model": {"hidden": [8]}, "learning_rate": 0.02, "canaries": 20}


@pytest.fixture
def seeded(monkeypatch):
    seeds = iter(range(100, 200))
    monkeypatch.setattr(execute, "secure_generator", lambda dev: torch.Generator(device=dev).manual_seed(next(seeds)))


def test_a_sweep_plans_a_non_private_part_and_writes_its_plot_and_table(tmp_path, seeded):
    ds, req = rows_meta(), EngineRequest("sweep", SWEEP)
    p = plugins.plan("dpsgd", req, ds)
    p = Plan(**json.loads(json.dumps(asdict(p))))
    assert p.event["kind"] == "composed"
    dp_run, baseline = p.event["events"]
    assert baseline == {"kind": "non_private"}
    assert dp_run["kind"] == "composed" and dp_run["events"][0]["kind"] == "subsampled_gaussian"
    runs = p.details["runs"]
    assert [r["label"] for r in runs] == ["1", "inf"]
    assert runs[0]["planned_epsilon"] <= 1.0 and runs[1]["noise_multiplier"] is None

    release = plugins.run("dpsgd", req, ds, make_table().select(p.columns), p, lambda _: None, workdir=tmp_path)
    assert release.actual_event is None
    r = release.result
    json.dumps(r)
    assert r["plot"] == "sweep.png"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["epsilon"] for row in rows] == ["1", "inf"]
    assert float(rows[0]["epsilon_spent"]) == pytest.approx(runs[0]["planned_epsilon"])
    assert rows[1]["epsilon_spent"] == "" and rows[1]["noise_multiplier"] == ""
    for row in rows:
        assert 0 <= float(row["test_accuracy"]) <= 1 and row["audit_epsilon_lower_bound"] != ""
    # The baseline's metrics are exact (no noise): a learnable task, clearly learnt.
    assert r["runs"][1]["test"]["accuracy"] > 0.8
    assert r["runs"][1]["audit"]["claimed_epsilon"] is None
    assert {(tmp_path / f"model-eps{x}.pt").exists() for x in ("1", "inf")} == {True}
