"""Validation of DP-SGD requests (engines/dpsgd/params.py) against declared metadata:
every bad input is a PlanError naming the offending parameter, directly and through
``engines.plugins.plan``; good input is normalised. No data, no torch."""

from dataclasses import replace

import pytest

from engines import plugins
from engines.dpsgd.params import validate
from engines.types import EngineRequest, PlanError
from tests.engines.dpsgd_helpers import N_ROWS, rows_meta, units_meta

BASE = {"target": "y", "features": ["x1", "x2", "c"], "noise_multiplier": 1.0, "epochs": 2, "batch_size": 64}
ROWS = rows_meta()
UNITS = units_meta()
EXTRA = replace(ROWS, columns={**ROWS.columns,
                               "nb": {"type": "numeric", "lower": None, "upper": None},
                               "half": {"type": "numeric", "lower": 5},
                               "const": {"type": "categorical", "domain": ["only"]}})


def errors(params, ds=EXTRA, kind="train", via_plugins=False):
    with pytest.raises(PlanError) as info:
        if via_plugins:
            plugins.plan("dpsgd", EngineRequest(kind, params), ds)
        else:
            validate(kind, params, ds)
    assert info.value.errors, info.value.message
    return info.value.errors


BAD = [
    pytest.param({"features": ["x1", "nope"]}, "features", "unknown column 'nope'", id="unknown-feature"),
    pytest.param({"target": "nope"}, "target", "unknown column 'nope'", id="unknown-target"),
    pytest.param({"target": None}, "target", "required", id="no-target"),
    pytest.param({"target": "const"}, "target", "one class", id="one-class-domain"),
    pytest.param({"target": "r", "target_threshold": 50}, "target_threshold", "outside", id="threshold-above"),
    pytest.param({"target": "r", "target_threshold": -10.5}, "target_threshold", "outside", id="threshold-below"),
    pytest.param({"target": "r", "task": "binary"}, "target_threshold", "required", id="threshold-missing"),
    pytest.param({"target": "c", "positive_values": ["a", "b", "c"], "features": ["x1"]}, "positive_values",
                 "every class", id="all-positive"),
    pytest.param({"target": "r", "target_threshold": 5, "positive_values": []}, "positive_values",
                 "categorical target", id="positive-values-on-a-numeric-target"),
    pytest.param({"target": "klass", "task": "regression", "features": ["x1"]}, "task", "categorical",
                 id="regression-on-categorical"),
    pytest.param({"epochs": 0}, "epochs", ">= 1", id="epochs-0"),
    pytest.param({"epochs": -3}, "epochs", ">= 1", id="epochs-negative"),
    pytest.param({"epochs": 2.5}, "epochs", "integer", id="epochs-fractional"),
    pytest.param({"batch_size": 1601}, "batch_size", "larger than the training split (1600", id="batch-too-big"),
    pytest.param({"batch_size": 0}, "batch_size", ">= 1", id="batch-0"),
    pytest.param({"target_epsilon": 2.0}, "target_epsilon", "exactly one", id="both-budgets"),
    pytest.param({"noise_multiplier": None}, "target_epsilon", "exactly one", id="neither-budget"),
    pytest.param({"noise_multiplier": -1.0}, "noise_multiplier", "> 0", id="negative-noise"),
    pytest.param({"features": ["x1", "nb"]}, "features", "no declared bounds", id="numeric-without-bounds"),
    pytest.param({"features": ["half"]}, "features", "no declared bounds", id="numeric-half-bounds"),
    pytest.param({"features": ["x1", "notes"]}, "features", "'text'", id="text-feature"),
    pytest.param({"features": ["x1", "y"]}, "features", "is the target", id="target-as-feature"),
    pytest.param({"features": []}, "features", "non-empty", id="no-features"),
    pytest.param({"max_rows_per_unit": 4}, "max_rows_per_unit", "no privacy-unit column", id="k-without-units"),
    pytest.param({"model": {"hidden": [0]}}, "model", "hidden[0]", id="model-width-0"),
    pytest.param({"model": {"layers": [{"type": "attention"}]}}, "model", "unknown layer type", id="model-unknown"),
    pytest.param({"model": {"hidden": [8], "norm": "batchnorm"}, "fix_model": False}, "model", "BatchNorm",
                 id="batchnorm-unfixed"),
    pytest.param({"eval_epsilon": 1.0, "noise_multiplier": None, "target_epsilon": 2.0}, "eval_epsilon",
                 "less than half", id="eval-half-of-target"),
    pytest.param({"canaries": 161}, "canaries", "a tenth", id="too-many-canaries"),
    pytest.param({"learning_rate": 0}, "learning_rate", "> 0", id="lr-0"),
    pytest.param({"delta": 0.5}, "delta", "<= 0.1", id="delta-large"),
    # a certificate at a delta above the dataset's (1e-5 here) promised little: 0.1 was accepted
    pytest.param({"delta": 2e-5}, "delta", "at most the dataset's delta (1e-05), got 2e-05",
                 id="delta-above-the-datasets"),
    pytest.param({"optimizer": "adam", "momentum": 0.9}, "momentum", "only for optimizer sgd",
                 id="momentum-ignored-by-adam"),
    pytest.param({"epochs": 1, "early_stopping_patience": 1}, "early_stopping_patience", "one epoch",
                 id="patience-on-one-epoch"),
    pytest.param({"optimizer": "lbfgs"}, "optimizer", "adam", id="optimizer"),
    pytest.param({"colour": "red"}, "params", "colour", id="unknown-param"),
    # each said another reason (a probe): "at most 200 distinct columns", "can be features", "required"
    pytest.param({"features": ["x1", "x1"]}, "features", "'x1' listed more than once", id="feature-twice"),
    pytest.param({"target": "notes"}, "target", "can be a target", id="text-target"),
    pytest.param({"target": "r", "task": "binary", "target_threshold": "NaN"}, "target_threshold",
                 "a finite number, got 'NaN'", id="threshold-nan-text"),
]


@pytest.mark.parametrize("via_plugins", [False, True], ids=["validate", "plugins"])
@pytest.mark.parametrize("change, key, message", BAD)
def test_bad_input_names_the_offending_parameter(change, key, message, via_plugins):
    params = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    errs = errors(params, via_plugins=via_plugins)
    assert key in errs, errs
    assert message in errs[key]


def test_every_problem_is_reported_at_once():
    errs = errors({**BASE, "features": ["nope"], "epochs": 0, "batch_size": 10**6, "target_epsilon": 1.0})
    assert {"features", "epochs", "batch_size", "target_epsilon"} <= set(errs)


def test_unit_datasets_refuse_the_unit_column_as_a_feature_and_bound_k():
    assert "privacy-unit column" in errors({**BASE, "features": ["x1", "pid"]}, UNITS)["features"]
    assert "max_rows_per_unit" in errors({**BASE, "max_rows_per_unit": 0}, UNITS)
    assert "max_rows_per_unit" in errors({**BASE, "max_rows_per_unit": 257}, UNITS)
    # With units the training split counts units: 400 of 500, so batch 401 is too big.
    assert "(400 privacy units of 500" in errors({**BASE, "batch_size": 401}, UNITS)["batch_size"]


def test_params_must_be_an_object():
    with pytest.raises(PlanError) as info:
        validate("train", ["target", "y"], ROWS)
    assert "params" in info.value.errors


def test_sweep_epsilons_are_checked():
    base = {k: v for k, v in BASE.items() if k != "noise_multiplier"}
    # 1 and 1.0, or 1 and 1.0000001, were two runs labelled "1", charged both, one model file kept
    for bad in ([], [1, 1], [1, 1.0], [1, 1.0000001], [0], [-1], ["infinite"], list(range(1, 10)), "1,2"):
        assert "epsilons" in errors({**base, "epsilons": bad}, kind="sweep"), bad
    assert validate("sweep", {**base, "epsilons": [1, 1.00001]}, ROWS).epsilons == [1, 1.00001]
    # early stopping without a DP validation metric was refused in a training, accepted in a sweep
    assert "needs eval_epsilon" in errors({**base, "epsilons": [1, 4], "eval_epsilon": 0,
                                           "early_stopping_patience": 1}, kind="sweep")["early_stopping_patience"]
    assert "eval_epsilon" in errors({**base, "epsilons": [1, 4], "eval_epsilon": 0.5}, kind="sweep")
    assert "params" in errors({**base, "epsilons": [1], "target_epsilon": 1}, kind="sweep")


def test_momentum_zero_the_schemas_default_is_no_momentum_for_any_optimizer():
    assert validate("train", {**BASE, "optimizer": "adam", "momentum": 0}, ROWS).momentum == 0


def test_good_input_is_normalised():
    spec = validate("train", BASE, ROWS)
    assert spec.task == "binary" and spec.target["positive"] == ["yes"] and spec.target["classes"] == [False, True]
    assert [f["column"] for f in spec.features] == ["x1", "x2", "c"]
    assert spec.layers[0]["in"] == 2 + 3 and spec.layers[-1]["out"] == 1  # two numerics, one-hot of 3
    assert (spec.n_units, spec.n_test_units, spec.n_train_units) == (N_ROWS, 400, 1600)
    assert spec.unit_column is None and spec.max_rows_per_unit == 1
    assert spec.eval_epsilon == 0.1 and spec.noise_multiplier == 1.0 and spec.target_epsilon is None

    multi = validate("train", {**BASE, "target": "klass", "features": ["x1"]}, ROWS)
    assert multi.task == "multiclass" and multi.n_outputs == 3
    reg = validate("train", {**BASE, "target": "r"}, ROWS)
    assert reg.task == "regression" and reg.target["lower"] == -10
    thr = validate("train", {**BASE, "target": "r", "target_threshold": 0}, ROWS)
    assert thr.task == "binary" and thr.target["threshold"] == 0.0


def test_default_features_skip_columns_that_cannot_be_features():
    params = {k: v for k, v in BASE.items() if k != "features"}
    spec = validate("train", params, EXTRA)
    names = [f["column"] for f in spec.features]
    # Not the target y, the text column, nor the numerics without both bounds.
    assert names == ["x1", "x2", "c", "klass", "r", "const"]
    units = validate("train", params, UNITS)
    assert "pid" not in [f["column"] for f in units.features]
    assert units.max_rows_per_unit == 16 and units.unit_column == "pid"


def test_epsilon_too_small_to_train_one_step_is_a_plan_error_on_target_epsilon():
    params = {**{k: v for k, v in BASE.items() if k != "noise_multiplier"}, "target_epsilon": 1e-3}
    errs = errors(params, via_plugins=True)
    assert "too small to train" in errs["target_epsilon"]
    sweep = {k: v for k, v in params.items() if k != "target_epsilon"}
    assert "too small to train" in errors({**sweep, "epsilons": [1e-3]}, kind="sweep", via_plugins=True)["epsilons"]


@pytest.mark.parametrize("change, kind, key", [
    ({"target_epsilon": 1e-320}, "train", "target_epsilon"),
    ({"target_epsilon": 5e-324}, "train", "target_epsilon"),
    ({"target_epsilon": 1.0, "eval_epsilon": 1e-320}, "train", "eval_epsilon"),
    ({"epsilons": [1.0, 1e-320]}, "sweep", "epsilons"),
])
def test_an_epsilon_too_small_to_compute_a_noise_with_is_a_plan_error(change, kind, key):
    """1e-320 made a noise scale of inf (or its share 0.0): the request answered 500 (a probe)."""
    params = {**{k: v for k, v in BASE.items() if k != "noise_multiplier"}, **change}
    errs = errors(params, kind=kind, via_plugins=True)
    assert key in errs, errs


def test_max_epsilon_below_one_epoch_is_a_plan_error():
    errs = errors({**BASE, "max_epsilon": 0.01}, via_plugins=True)
    assert "below the cost of one epoch" in errs["max_epsilon"]
    # Above one epoch's cost it plans.
    plugins.plan("dpsgd", EngineRequest("train", {**BASE, "max_epsilon": 100.0}), ROWS)


def test_a_test_fraction_that_leaves_no_held_out_unit_is_said_so():
    """1e-9 of the units: the refusal said the dataset was too small to train."""
    errs = errors({**BASE, "test_fraction": 1e-9})
    assert "leaves no held-out unit" in errs["test_fraction"] and "dataset" not in errs
