"""JSON schema of the federated ``train`` parameters (shown by ``GET /api/engines/``);
``params.validate`` checks everything against the dataset and its sites and is the authority."""

from __future__ import annotations

from .params import DEFAULT_EVAL_SHARE, MAX_ROUNDS, MODES

_POS = {"type": "number", "exclusiveMinimum": 0}
_EPS = {"oneOf": [_POS, {"const": "inf"}]}

TRAIN = {
    "target": {"type": "string", "description": "the column to predict (categorical, or numeric with "
                                                "target_threshold)"},
    "task": {"enum": ["binary", "multiclass"], "description": "default: binary for two classes or a threshold"},
    "target_threshold": {"type": "number", "description": "binary task on a numeric target: label = value > this"},
    "positive_values": {"type": "array", "description": "binary task on a categorical target: the positive classes"},
    "features": {"type": "array", "items": {"type": "string"},
                 "description": "feature columns (default: every declared numeric column with bounds and "
                                "categorical column)"},
    "mode": {"enum": list(MODES), "default": "central",
             "description": "central: client-level DP-FedAvg (noise at the server, on the sum of the sites' "
                            "clipped updates); local: each site runs DP-SGD on its rows"},
    "rounds": {"type": "integer", "minimum": 1, "maximum": MAX_ROUNDS, "default": 10},
    "sites_per_round": {**_POS, "description": "expected sites per round: each registered site is sampled with "
                                              "q = sites_per_round / registered sites (default: all)"},
    "target_epsilon": {**_EPS, "description": "the run's epsilon (the noise is calibrated to it); \"inf\": "
                                              "non-private FedAvg. Exactly one of this and noise_multiplier"},
    "noise_multiplier": {**_POS, "description": "z: the noise's standard deviation is z C"},
    "max_epsilon": {**_POS, "description": "stop before a round that would pass it"},
    "clip_norm": {**_POS, "default": 1.0, "description": "C: the L2 bound of a site's whole update (local mode: "
                                                        "of each row's gradient)"},
    "local_epochs": {"type": "integer", "minimum": 1, "maximum": 100, "default": 1},
    "local_learning_rate": {**_POS, "default": 0.5},
    "local_batch_size": {"type": "integer", "minimum": 1, "default": 32,
                         "description": "local mode: the expected Poisson batch of each site's DP-SGD"},
    "server_learning_rate": {**_POS, "default": 1.0},
    "eval_epsilon": {"type": "number", "minimum": 0, "description": "the held-out evaluations' share, spread over "
                     f"them; default {DEFAULT_EVAL_SHARE:.0%} of target_epsilon"},
    "eval_every": {"type": "integer", "minimum": 1, "default": 1,
                   "description": "evaluate after every k-th round and the last"},
    "test_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5, "default": 0.2,
                      "description": "each site's rows held out for the DP evaluation"},
    "delta": {**_POS, "description": "default and most: the dataset's delta"},
    "secure_aggregation": {"type": "boolean", "default": False,
                           "description": "Flower's SecAgg+ (mode central, a private target, 2+ sites): the server "
                                          "sees only each round's sum; each site checks its own update"},
}


def params_schema() -> dict:
    return {"train": {"type": "object", "required": ["target"], "properties": TRAIN, "additionalProperties": False}}
