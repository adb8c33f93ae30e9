"""Validation of a DP-SGD request against the dataset's public metadata.

``validate(kind, params, dataset)`` returns a normalised ``Spec`` (plain JSON-able data)
or raises ``PlanError`` with every problem found, keyed by parameter. Nothing here reads
data and nothing here imports torch: planning happens in the web process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engines.types import DatasetMeta, PlanError
from engines.validation import RUN_ACCOUNTANTS as ACCOUNTANTS
from engines.validation import (
    is_number,
    run_accountant_error,
    run_delta_error,
    span_error,
    unknown_keys,
    unknown_message,
)

from .model_spec import ModelSpecError, expand_model

KINDS = ("train", "sweep")
TASKS = ("binary", "multiclass", "regression")
OPTIMIZERS = ("adam", "adamw", "sgd")
MAX_EPOCHS = 1000
MAX_CLASSES = 1000
MAX_FEATURES = 200
# rows x encoded inputs (a float32 each, one per numeric column and per declared category),
# held dense and copied a few times while the split is prepared: 1 GB a copy at the limit.
# Three columns of 10,000 declared codes on 20,000 rows (600M cells) were admitted, charged,
# and the worker killed out of memory after the read.
MAX_ENCODED_CELLS = 250_000_000
MAX_ROWS_PER_UNIT = 256
DEFAULT_ROWS_PER_UNIT = 16
MAX_CANARIES = 10_000
MAX_RANKS = 64  # data-parallel ranks of one run (distributed datasets; engines/distributed/training.py)
MAX_SWEEP = 8
DEFAULT_SWEEP = [1.0, 3.0, 8.0]
DEFAULT_EVAL_SHARE = 0.05  # of target_epsilon, the least the held-out metrics get by default (planner.eval_share)
MAX_EVAL_SHARE = 0.25  # of target_epsilon, the most they get by default
DEFAULT_EVAL_EPSILON = 0.1  # when the noise multiplier is given instead of a target

COMMON_KEYS = {"target", "task", "target_threshold", "positive_values", "features", "model", "fix_model",
               "epochs", "batch_size", "learning_rate", "optimizer", "momentum", "weight_decay",
               "max_grad_norm", "delta", "test_fraction", "eval_epsilon", "max_rows_per_unit", "canaries",
               "early_stopping_patience", "accountant", "ranks"}
KIND_KEYS = {
    "train": COMMON_KEYS | {"target_epsilon", "noise_multiplier", "max_epsilon"},
    "sweep": COMMON_KEYS | {"epsilons"},
}


@dataclass
class Spec:
    """A validated training request (plain data; stored in the plan's details)."""

    kind: str
    task: str
    target: dict  # {"column", "type", ...how labels are made}
    features: list[dict]  # declared specs of the feature columns, in order
    layers: list[dict]  # the expanded model (see model_spec), output layer included
    model_fixes: list[str]
    epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str
    momentum: float
    weight_decay: float
    max_grad_norm: float
    delta: float
    test_fraction: float
    n_units: int
    n_test_units: int
    n_train_units: int
    unit_column: str | None
    max_rows_per_unit: int
    canaries: int
    early_stopping_patience: int | None
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    max_epsilon: float | None = None
    eval_epsilon: float = 0.0
    epsilons: list = field(default_factory=list)  # sweep: numbers and "inf"
    accountant: str = "rdp"  # "pld": noise calibrated and the run certified by PLD (engines/dpsgd/pld.py)
    ranks: int = 1  # data-parallel ranks asked for (a distributed dataset on a Dask cluster); not in the event

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Spec":
        return cls(**d)

    @property
    def n_outputs(self) -> int:
        return len(self.target["classes"]) if self.task == "multiclass" else 1



def run_label(epsilon: Any) -> str:
    """A sweep run's label, which also names its model file: "inf", or the epsilon at 6
    significant digits."""
    return "inf" if epsilon == "inf" else f"{float(epsilon):g}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Errors(dict):
    def number(self, params, key, default, *, lo=None, hi=None, lo_open=False, integer=False):
        v = params.get(key)
        if v is None:  # absent, or JSON null: the default (None: not given)
            v = default
            if v is None:
                return None
        if integer and not _is_int(v):
            self[key] = f"must be an integer, got {v!r}"
            return default
        if not is_number(v):
            self[key] = f"must be a finite number, got {v!r}"
            return default
        if lo is not None and (v <= lo if lo_open else v < lo):
            self[key] = f"must be {'>' if lo_open else '>='} {lo:g}, got {v!r}"
            return default
        if hi is not None and v > hi:
            self[key] = f"must be <= {hi:g}, got {v!r}"
            return default
        return int(v) if integer else float(v)


def _feature_spec(name: str, col: dict) -> dict | str:
    typ = col.get("type")
    if typ == "numeric":
        lo, hi = col.get("lower"), col.get("upper")
        if not (is_number(lo) and is_number(hi) and lo < hi):
            return f"numeric column {name!r} has no declared bounds (lower < upper): the officer must declare them"
        if problem := span_error(lo, hi):
            return f"numeric column {name!r}: {problem}"
        return {"column": name, "type": "numeric", "lower": float(lo), "upper": float(hi)}
    if typ == "categorical":
        domain = col.get("domain")
        if not isinstance(domain, list) or not domain:
            return f"categorical column {name!r} has no declared domain"
        return {"column": name, "type": "categorical", "domain": list(domain)}
    return f"column {name!r} is of type {typ!r}: only numeric and categorical columns can be features"


def _target_spec(params: dict, ds: DatasetMeta, errors: _Errors) -> tuple[str | None, dict | None]:
    name = params.get("target")
    if not isinstance(name, str) or not name:
        errors["target"] = "required: the column to predict"
        return None, None
    col = ds.columns.get(name)
    if col is None:
        errors["target"] = f"unknown column {name!r}; columns: {', '.join(sorted(ds.columns))}"
        return None, None
    spec = _feature_spec(name, col)
    if isinstance(spec, str):  # (said of a feature: "only numeric and categorical columns can be features")
        errors["target"] = spec.replace("can be features", "can be a target")
        return None, None
    task = params.get("task")
    if task is not None and task not in TASKS:
        errors["task"] = f"must be one of {', '.join(TASKS)}, got {task!r}"
        return None, None
    threshold = params.get("target_threshold")
    positive = params.get("positive_values")
    if spec["type"] == "numeric":
        if positive is not None:
            errors["positive_values"] = "only for a categorical target (a numeric one: target_threshold)"
        if task is None:
            task = "binary" if threshold is not None else "regression"
        if task == "multiclass":
            errors["task"] = f"a numeric target ({name!r}) supports binary (with target_threshold) or regression"
            return None, None
        if task == "binary":
            if not is_number(threshold):
                given = "" if threshold is None else f"a finite number, got {str(threshold)[:50]!r}: "
                errors["target_threshold"] = (f"{given or 'required for a binary task on a numeric target: '}the "
                                              "label is value > target_threshold (e.g. a DP median from the "
                                              "aggregates engine)")
                return None, None
            if not spec["lower"] <= threshold < spec["upper"]:
                errors["target_threshold"] = (f"{threshold!r} is outside [{spec['lower']:g}, {spec['upper']:g}): "
                                              "the target would have one class")
                return None, None
            return task, {**spec, "threshold": float(threshold), "classes": [False, True]}
        if threshold is not None:
            errors["target_threshold"] = "only for a binary task"
        return task, spec
    domain = spec["domain"]
    if len(domain) < 2:
        errors["target"] = f"target {name!r} has one class in its declared domain: there is nothing to learn"
        return None, None
    if threshold is not None:
        errors["target_threshold"] = "only for a numeric target"
    if task is None:
        task = "binary" if len(domain) == 2 or positive is not None else "multiclass"
    if task == "regression":
        errors["task"] = f"a categorical target ({name!r}) supports binary or multiclass"
        return None, None
    if task == "multiclass":
        if positive is not None:
            errors["positive_values"] = "only for a binary task"
        if len(domain) > MAX_CLASSES:
            errors["target"] = f"at most {MAX_CLASSES} classes"
        return task, {**spec, "classes": list(domain)}
    if positive is None:
        if len(domain) != 2:
            errors["positive_values"] = f"required: the target has {len(domain)} classes; name the positive ones"
            return None, None
        positive = [domain[1]]
    if not isinstance(positive, list) or not positive or any(v not in domain for v in positive):
        errors["positive_values"] = f"must be a non-empty list of values from the declared domain {domain!r}"
        return None, None
    if len(set(map(repr, positive))) == len(domain):
        errors["positive_values"] = "every class is positive: the target would have one class"
        return None, None
    return task, {**spec, "positive": positive, "classes": [False, True]}


def input_width(features: list[dict]) -> int:
    """The number of encoded inputs: one per numeric column, one per declared category."""
    return sum(1 if f["type"] == "numeric" else len(f["domain"]) for f in features)


def features_of(params: dict, ds: DatasetMeta, errors: _Errors) -> list[dict]:
    """The feature columns' specs ``params["features"]`` names (by default every numeric
    column with bounds and every categorical one but the target), each problem noted in
    ``errors["features"]``. Shared by the DP-SGD and federated engines."""
    features = []
    names = params.get("features")
    if names is None:
        names = [c for c, spec in ds.columns.items()
                 if spec.get("type") in ("numeric", "categorical") and c != params.get("target")]
        usable = []
        for c in names:  # by default skip columns that cannot be features (no bounds)
            f = _feature_spec(c, ds.columns[c])
            if isinstance(f, dict):
                usable.append(f)
        features = usable
        if not features:
            errors["features"] = "the dataset has no usable feature column (numeric with bounds or categorical)"
    elif not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        errors["features"] = "must be a non-empty list of column names"
    elif len(names) > MAX_FEATURES:
        errors["features"] = f"at most {MAX_FEATURES} columns, got {len(names)}"
    elif len(set(names)) != len(names):
        twice = sorted({c for c in names if names.count(c) > 1})
        errors["features"] = f"each column once: {', '.join(repr(c[:100]) for c in twice[:10])} listed more than once"
    else:
        problems = []
        for c in names:
            if c not in ds.columns:
                problems.append(f"unknown column {c!r}")
            elif c == params.get("target"):
                problems.append(f"{c!r} is the target")
            elif c == ds.unit_column:
                problems.append(f"{c!r} is the privacy-unit column")
            else:
                f = _feature_spec(c, ds.columns[c])
                if isinstance(f, str):
                    problems.append(f)
                else:
                    features.append(f)
        if problems:
            errors["features"] = "; ".join(problems)
    return features


def validate(kind: str, params: dict, ds: DatasetMeta) -> Spec:
    if not isinstance(params, dict):
        raise PlanError("params must be an object", {"params": "must be an object"})
    errors = _Errors()
    unknown, n_unknown = unknown_keys(params, KIND_KEYS[kind])
    if unknown:
        errors["params"] = f"unknown parameter(s) for {kind}: {unknown_message(unknown, n_unknown)}"

    task, target = _target_spec(params, ds, errors)
    features = features_of(params, ds, errors)
    n_inputs = input_width(features)
    if features and ds.n_rows * n_inputs > MAX_ENCODED_CELLS:
        errors["features"] = (f"{ds.n_rows:,} rows x {n_inputs:,} encoded inputs (one per numeric column and per "
                              f"declared category) is {ds.n_rows * n_inputs:,} cells, over {MAX_ENCODED_CELLS:,}: "
                              "choose fewer features or declare fewer categories")

    epochs = errors.number(params, "epochs", 5, lo=1, hi=MAX_EPOCHS, integer=True)
    test_fraction = errors.number(params, "test_fraction", 0.2, lo=0.0, hi=0.5, lo_open=True)
    k = 1
    if ds.unit_column:
        k = errors.number(params, "max_rows_per_unit", DEFAULT_ROWS_PER_UNIT, lo=1, hi=MAX_ROWS_PER_UNIT, integer=True)
    elif "max_rows_per_unit" in params:
        errors["max_rows_per_unit"] = "this dataset has no privacy-unit column: each row is a unit"
    n_units = int(ds.n_units or ds.n_rows)
    n_test = int(round(n_units * (test_fraction or 0.2)))
    n_train = n_units - n_test
    batch_size = errors.number(params, "batch_size", min(256, max(1, n_train // 10)), lo=1, integer=True)
    if batch_size and "batch_size" not in errors and batch_size > n_train:
        errors["batch_size"] = (f"{batch_size} is larger than the training split ({n_train} privacy units of "
                                f"{n_units}; test_fraction {test_fraction:g})")
    if n_train >= 10 and n_test < 1 and "test_fraction" in params:
        errors["test_fraction"] = (f"{test_fraction:g} of {n_units} privacy units leaves no held-out unit: raise it "
                                   f"above {0.5 / n_units:.3g}")
    elif n_train < 10 or n_test < 1:
        errors["dataset"] = f"too small to train: {n_units} privacy units"
    optimizer = params.get("optimizer", "adam")
    if optimizer not in OPTIMIZERS:
        errors["optimizer"] = f"must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}"
    lr = errors.number(params, "learning_rate", 1e-3 if optimizer != "sgd" else 0.1, lo=0, hi=10, lo_open=True)
    momentum = errors.number(params, "momentum", 0.0, lo=0, hi=0.999)
    if momentum and optimizer != "sgd" and optimizer in OPTIMIZERS:  # (0, the default, is no momentum)
        errors["momentum"] = f"only for optimizer sgd ({optimizer} keeps its own moment estimates)"
    weight_decay = errors.number(params, "weight_decay", 0.0, lo=0, hi=1)
    clip = errors.number(params, "max_grad_norm", 1.0, lo=0, hi=1e6, lo_open=True)
    delta = errors.number(params, "delta", ds.delta, lo=0, hi=0.1, lo_open=True)
    if delta and "delta" not in errors and (problem := run_delta_error(delta, ds.delta)):
        errors["delta"] = problem
    canaries_default = max(0, min(500, n_train // 50))
    canaries = errors.number(params, "canaries", canaries_default, lo=0, hi=MAX_CANARIES, integer=True)
    if canaries and n_train and canaries > n_train // 10:
        errors["canaries"] = f"at most a tenth of the training split ({n_train // 10})"
    patience = errors.number(params, "early_stopping_patience", None, lo=1, hi=MAX_EPOCHS, integer=True)
    if patience and epochs == 1:
        errors["early_stopping_patience"] = "a run of one epoch has nothing to stop early"
    ranks = errors.number(params, "ranks", 1, lo=1, hi=MAX_RANKS, integer=True)
    if ranks and ranks > 1 and not ds.distributed:
        errors["ranks"] = "only for a distributed dataset (its partitions train on the Dask cluster's ranks)"
    accountant = params.get("accountant", "rdp")
    if problem := run_accountant_error(accountant, ds.allow_pld):
        errors["accountant"] = problem
    fix_model = params.get("fix_model", True)
    if not isinstance(fix_model, bool):
        errors["fix_model"] = "must be true or false"

    layers, fixes = [], []
    if task is not None:
        n_out = len(target["classes"]) if task == "multiclass" else 1
        try:
            layers, fixes = expand_model(params.get("model"), n_inputs, n_out, fix=fix_model is not False)
        except ModelSpecError as e:
            errors["model"] = str(e)

    spec_kw: dict[str, Any] = {}
    if kind == "train":
        te, nm = params.get("target_epsilon"), params.get("noise_multiplier")
        if (te is None) == (nm is None):
            errors["target_epsilon"] = "give exactly one of target_epsilon and noise_multiplier"
        te = errors.number(params, "target_epsilon", None, lo=0, hi=100, lo_open=True)
        nm = errors.number(params, "noise_multiplier", None, lo=0, hi=1000, lo_open=True)
        cap = errors.number(params, "max_epsilon", None, lo=0, hi=1000, lo_open=True)
        ev = errors.number(params, "eval_epsilon", None if te else DEFAULT_EVAL_EPSILON, lo=0, hi=100)
        if te and ev is None:  # the planner chooses the share (planner.eval_share)
            ev = -1.0
        elif te and ev >= te / 2:
            errors["eval_epsilon"] = f"must be less than half of target_epsilon ({te:g}), got {ev:g}"
        spec_kw = {"target_epsilon": te, "noise_multiplier": nm, "max_epsilon": cap, "eval_epsilon": ev or 0.0}
    else:
        eps = params.get("epsilons", DEFAULT_SWEEP)
        good = (isinstance(eps, list) and 1 <= len(eps) <= MAX_SWEEP
                and all(e == "inf" or (is_number(e) and 0 < e <= 100) for e in eps)
                and len({run_label(e) for e in eps}) == len(eps))
        if not good:  # distinct as the runs are labelled and their models named (1 and 1.0 were two runs, one file)
            errors["epsilons"] = (f"must be a list of 1 to {MAX_SWEEP} distinct epsilons in (0, 100] (distinct "
                                  "at 6 significant digits), and \"inf\" for a non-private baseline")
            eps = []
        finite = [e for e in eps if e != "inf"]
        ev = errors.number(params, "eval_epsilon", None, lo=0, hi=100)
        if ev is not None and finite and ev >= min(finite) / 2:
            errors["eval_epsilon"] = f"must be less than half of the smallest epsilon ({min(finite):g})"
        spec_kw = {"epsilons": [e if e == "inf" else float(e) for e in eps], "eval_epsilon": -1.0 if ev is None else ev}

    if patience and spec_kw.get("eval_epsilon") == 0:  # (it was ignored: the run went to its last epoch)
        errors["early_stopping_patience"] = "stops on the DP validation metric: needs eval_epsilon > 0"
    if errors:
        first = next(iter(errors.items()))
        raise PlanError(f"invalid {kind} request: {first[0]}: {first[1]}", dict(errors))
    return Spec(kind=kind, task=task, target=target, features=features, layers=layers, model_fixes=fixes,
                epochs=epochs, batch_size=batch_size, learning_rate=lr, optimizer=optimizer, momentum=momentum,
                weight_decay=weight_decay, max_grad_norm=clip, delta=delta, test_fraction=test_fraction,
                n_units=n_units, n_test_units=n_test, n_train_units=n_train, unit_column=ds.unit_column,
                max_rows_per_unit=k, canaries=canaries, early_stopping_patience=patience,
                accountant=accountant if accountant in ACCOUNTANTS else "rdp", ranks=ranks or 1, **spec_kw)
