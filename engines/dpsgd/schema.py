"""JSON schemas of the dpsgd kinds' parameters (shown by ``GET /api/engines/``); params.py
checks everything against the dataset and is the authority."""

from __future__ import annotations

from .model_spec import ACTIVATIONS, DEFAULT_MODEL, MAX_WIDTH
from .params import (
    DEFAULT_ROWS_PER_UNIT,
    DEFAULT_SWEEP,
    MAX_CANARIES,
    MAX_EPOCHS,
    MAX_RANKS,
    MAX_ROWS_PER_UNIT,
    MAX_SWEEP,
    OPTIMIZERS,
    TASKS,
)

_POS = {"type": "number", "exclusiveMinimum": 0}
_LAYER = {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["linear", "layernorm", "groupnorm", "batchnorm", "dropout", *ACTIVATIONS]},
    "out": {"type": "integer", "minimum": 1, "maximum": MAX_WIDTH},
    "groups": {"type": "integer", "minimum": 1},
    "p": {"type": "number", "minimum": 0, "exclusiveMaximum": 1}}}

_COMMON = {
    "target": {"type": "string", "description": "the column to predict (numeric with bounds, or categorical)"},
    "task": {"enum": list(TASKS), "description": "default: regression for a numeric target (binary with "
                                                 "target_threshold), binary or multiclass for a categorical one"},
    "target_threshold": {"type": "number", "description": "binary task on a numeric target: label = value > this"},
    "positive_values": {"type": "array", "description": "binary task on a categorical target: the positive classes"},
    "features": {"type": "array", "items": {"type": "string"},
                 "description": "feature columns (default: every numeric column with bounds and categorical column)"},
    "model": {"type": "object", "default": DEFAULT_MODEL, "description": "an MLP: {hidden, activation, norm, dropout} "
              "or {layers: [...]}; the output layer is added. BatchNorm is replaced by GroupNorm (fix_model)",
              "properties": {"hidden": {"type": "array", "items": {"type": "integer"}},
                             "activation": {"enum": list(ACTIVATIONS)},
                             "norm": {"enum": ["layernorm", "groupnorm", "batchnorm", "none"]},
                             "dropout": {"type": "number"}, "layers": {"type": "array", "items": _LAYER}}},
    "fix_model": {"type": "boolean", "default": True, "description": "replace BatchNorm by GroupNorm (else refuse)"},
    "epochs": {"type": "integer", "minimum": 1, "maximum": MAX_EPOCHS, "default": 5},
    "batch_size": {"type": "integer", "minimum": 1, "description": "expected batch (privacy units) under Poisson "
                                                                   "sampling; default min(256, n_train / 10)"},
    "learning_rate": {**_POS, "description": "default 1e-3 (adam, adamw), 0.1 (sgd)"},
    "optimizer": {"enum": list(OPTIMIZERS), "default": "adam"},
    "momentum": {"type": "number", "minimum": 0, "maximum": 0.999, "default": 0,
                 "description": "sgd only (adam and adamw keep their own moment estimates)"},
    "weight_decay": {"type": "number", "minimum": 0, "default": 0},
    "max_grad_norm": {**_POS, "default": 1.0, "description": "clipping norm of each privacy unit's gradient"},
    "delta": {**_POS, "description": "default and most: the dataset's delta"},
    "test_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5, "default": 0.2,
                      "description": "privacy units held out before training, for the DP metrics"},
    "eval_epsilon": {"type": "number", "minimum": 0, "description": "budget of the held-out metrics (one release per "
                     "epoch), inside the target; default: the least whose stated 95% interval is +-0.05 over "
                     "the held-out units, within 5-25% of the target (0.1 with noise_multiplier); 0: none"},
    "max_rows_per_unit": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS_PER_UNIT,
                          "default": DEFAULT_ROWS_PER_UNIT, "description": "datasets with a privacy unit: rows kept "
                          "per unit (the unit's combined gradient is clipped, whatever k)"},
    "canaries": {"type": "integer", "minimum": 0, "maximum": MAX_CANARIES, "description": "canaries for the "
                 "membership-inference audit (default min(500, n_train / 50)); 0: no audit"},
    "early_stopping_patience": {"type": "integer", "minimum": 1, "description": "stop after this many epochs "
                                "without a better DP validation metric; unspent steps are refunded"},
    "accountant": {"enum": ["rdp", "pld"], "default": "rdp", "description": "what calibrates the noise to the "
                   "target and certifies each run: rdp (the ledger's own accountant) or pld (privacy loss "
                   "distribution: tighter for one pre-planned run, so less noise; only on datasets whose officer "
                   "allows pld_certification). The ledger charges the run by its RDP curve either way"},
    "ranks": {"type": "integer", "minimum": 1, "maximum": MAX_RANKS, "default": 1, "description": "data-parallel "
              "training processes, one per Dask worker (datasets with execution 'distributed' on a cluster; at most "
              "the cluster's workers; elsewhere only 1, a larger number is refused). Each rank trains on its share "
              "of the privacy units; the noise, "
              "sample rate and charge are those of one process"},
}


def params_schema() -> dict:
    train = {**_COMMON,
             "target_epsilon": {**_POS, "description": "the run's epsilon (training + metrics) at delta under the "
                                "accountant (rdp, or pld); the noise multiplier is calibrated. Give this or noise_multiplier"},
             "noise_multiplier": {**_POS, "description": "noise standard deviation / max_grad_norm"},
             "max_epsilon": {**_POS, "description": "stop before an epoch that would cross this; the ledger commits "
                             "the steps taken and refunds the rest"}}
    sweep = {**_COMMON,
             "epsilons": {"type": "array", "maxItems": MAX_SWEEP, "default": DEFAULT_SWEEP,
                          "items": {"oneOf": [_POS, {"const": "inf"}]},
                          "description": "one run per epsilon; \"inf\" is a non-private baseline (only on datasets "
                                         "whose officer allows non-private releases)"}}
    canaries_max = {"canaries": {**_COMMON["canaries"], "maximum": MAX_CANARIES}}
    return {kind: {"type": "object", "additionalProperties": False, "required": ["target"],
                   "properties": {**props, **canaries_max}} for kind, props in (("train", train), ("sweep", sweep))}
