"""DP-SGD on inputs nobody tuned for (found by a probe): bounds whose span overflows, a model
that diverges, a canary audit with every coin on one side."""

import json
import math
import tempfile

import numpy as np
import pyarrow as pa
import pytest
import torch

from engines import plugins
from engines.types import DatasetMeta, EngineRequest, PlanError

N = 600


def table(seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-3, 3, N)
    return pa.table({"x1": x1, "y": np.where(x1 > 0, "yes", "no"), "r": 2 * x1 + rng.normal(0, 1, N)})


def meta(r_bounds=(-10, 10), x_bounds=(-3, 3), n=N):
    return DatasetMeta("t", {"x1": {"type": "numeric", "lower": x_bounds[0], "upper": x_bounds[1]},
                             "y": {"type": "categorical", "domain": ["no", "yes"]},
                             "r": {"type": "numeric", "lower": r_bounds[0], "upper": r_bounds[1]}}, None, n, n, 1e-5)


def run(params, ds, data):
    torch.manual_seed(0)
    req = EngineRequest("train", params)
    plan = plugins.plan("dpsgd", req, ds)
    with tempfile.TemporaryDirectory() as out:
        return plugins.run("dpsgd", req, ds, data.select(plan.columns), plan, lambda _: None, workdir=out).result


@pytest.mark.parametrize("target, bounds", [("r", {"r_bounds": (-1e308, 1e308)}), ("y", {"x_bounds": (-1e308, 1e308)})])
def test_bounds_whose_span_overflows_are_refused_at_plan_time(target, bounds):
    """upper - lower was inf: every target scaled to 0 and an infinite MAE released, or a
    feature silently constant."""
    with pytest.raises(PlanError, match="span more than the largest number"):
        plugins.plan("dpsgd", EngineRequest("train", {"target": target, "features": ["x1"], "target_epsilon": 3}),
                     meta(**bounds))


def test_a_diverged_model_stops_and_scores_the_worst_not_a_perfect_model(monkeypatch):
    """A model whose outputs are NaN was released with MAE 0.0 (NaN sums into the noise).
    Now the run stops after the epoch its weights stop being finite, and each held-out
    unit counts the worst error (the sensitivity the noise assumes)."""
    from engines.dpsgd import train

    real_step = train.Trainer.step

    def poisoned(self):
        real_step(self)
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))

    monkeypatch.setattr(train.Trainer, "step", poisoned)
    result = run({"target": "r", "features": ["x1"], "target_epsilon": 90, "epochs": 3, "eval_epsilon": 40,
                  "model": {"hidden": [8]}, "canaries": 0}, meta(), table())
    assert result["stopped"] == "diverged" and len(result["history"]) == 1
    span = 20.0
    # worst error on every unit: MAE near the whole span (at epsilon 40 of evaluation, noise is small)
    assert result["test"]["mae"] > 0.8 * span
    json.dumps(result, allow_nan=False)


def test_an_audit_with_every_canary_on_one_side_releases_null_not_nan():
    """One canary (allowed on 20 rows): its coin puts it on one side, so there is no AUC
    to measure; the release was NaN (not strict JSON)."""
    from engines.dpsgd.audit import audit

    got = audit(np.array([0.3]), np.array([True]), 1e-5, 3.0)
    assert got["auc"] is None and got["fpr_at_median"] is None and got["tpr_at_median"] == 0.0
    json.dumps(got, allow_nan=False)


def test_early_stopping_without_evaluations_is_refused_not_ignored():
    with pytest.raises(PlanError, match="early_stopping_patience.*needs eval_epsilon > 0"):
        plugins.plan("dpsgd", EngineRequest("train", {"target": "y", "features": ["x1"], "target_epsilon": 3,
                                                      "eval_epsilon": 0, "early_stopping_patience": 2}), meta())
    plugins.plan("dpsgd", EngineRequest("train", {"target": "y", "features": ["x1"], "target_epsilon": 3,
                                                  "early_stopping_patience": 2}), meta())  # the default share


def test_a_table_whose_encoded_inputs_would_not_fit_is_refused_at_plan_time():
    """Three columns of 10,000 declared codes on 20,000 rows (600M one-hot cells, copied a
    few times): admitted, charged, and the worker killed out of memory after the read."""
    from engines.dpsgd import features as enc
    from engines.dpsgd.params import MAX_ENCODED_CELLS

    codes = {f"c{i}": {"type": "categorical", "domain": [f"v{j}" for j in range(10_000)]} for i in range(3)}
    cols = {**codes, "y": {"type": "categorical", "domain": ["no", "yes"]}}
    params = {"target": "y", "positive_values": ["yes"], "target_epsilon": 1.0, "epochs": 1}
    big = DatasetMeta(name="wide", columns=cols, unit_column=None, n_rows=20_000, n_units=20_000, delta=1e-6)
    with pytest.raises(PlanError, match="encoded inputs") as e:
        plugins.plan("dpsgd", EngineRequest("train", params), big)
    assert "features" in e.value.errors
    small = DatasetMeta(name="wide", columns=cols, unit_column=None, n_rows=5_000, n_units=5_000, delta=1e-6)
    assert 5_000 * 30_000 <= MAX_ENCODED_CELLS and plugins.plan("dpsgd", EngineRequest("train", params), small)
    # the model's look at the declared domain: float32, one 1.0 per categorical column, no k x k identity
    pts = enc.random_inputs([{"column": c, **v} for c, v in codes.items()], 4096)
    assert pts.shape == (4096, 30_000) and pts.dtype == np.float32 and (pts.sum(1) == 3).all()
