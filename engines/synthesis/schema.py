"""JSON schema of the synthesis parameters (shown by ``GET /api/engines/``); params.py checks
everything against the dataset and is the authority."""

from __future__ import annotations

from engines.validation import RUN_ACCOUNTANTS as ACCOUNTANTS

from .params import (AIM_DEFAULT_MIN_UNITS, DEFAULT_BINS, DEFAULT_ROWS_PER_UNIT, MAX_AUTO_ROWS_PER_UNIT, MAX_BINS, MAX_ROWS,
                     MAX_ROWS_PER_UNIT, METHODS, VAE_DEFAULTS)


def params_schema() -> dict:
    props = {
        "method": {"enum": list(METHODS),
                   "description": "mst: marginal-based, a maximum spanning tree of pairs (graphical model); aim: "
                                  "marginal-based, adaptive rounds over all pairs and columns (AIM, McKenna et al. "
                                  "2022; 3-7 times MST's time); vae: a tabular VAE trained with DP-SGD. Default, by "
                                  f"measurement: aim on a table of at least {AIM_DEFAULT_MIN_UNITS:,} training units "
                                  "(not distributed, accountant rdp), else mst; the plan states the method used"},
        "epsilon": {"type": "number", "exclusiveMinimum": 0, "maximum": 100,
                    "description": "the whole run's epsilon at delta (the service's RDP accountant; with accountant "
                                   "pld, the PLD certificate)"},
        "delta": {"type": "number", "exclusiveMinimum": 0, "description": "default and most: the dataset's"},
        "accountant": {"enum": list(ACCOUNTANTS), "default": "rdp",
                       "description": "what calibrates MST's noise to the epsilon and certifies the run: rdp (the "
                                      "ledger's own accountant) or pld (privacy loss distribution: less noise; MST only, at "
                                      "one row per unit, when the dataset's officer allows pld_certification). The "
                                      "ledger charges the run by its RDP curve either way"},
        "rows": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS, "description": "default: the dataset's rows"},
        "columns": {"type": "array", "items": {"type": "string"},
                    "description": "default: every bounded numeric and categorical column"},
        "bins": {"type": "integer", "minimum": 2, "maximum": MAX_BINS, "default": DEFAULT_BINS,
                 "description": "mst, aim: at most this many model cells per numeric column (private quantile bins of its "
                                "measured cells); vae: equal-width bins of its declared range"},
        "max_rows_per_unit": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS_PER_UNIT,
                              "description": "datasets with a privacy unit: rows each unit may contribute. Default: "
                                             f"vae {DEFAULT_ROWS_PER_UNIT}; mst and aim the dataset's mean rows per "
                                             f"unit (1 to {MAX_AUTO_ROWS_PER_UNIT}), halved while its one-way "
                                             "noise would be refused; the plan states the k it used"},
        "unit_weighting": {"type": "boolean",
                           "description": "mst, aim on a dataset with a privacy unit (not distributed): model the "
                                          "bucket of each row's unit's rows as one more column and draw the sample "
                                          "with weight rows / max_rows_per_unit, so units with more rows than "
                                          "that weigh what they weigh in the table (default true; false saves that "
                                          "column's share of the budget where every unit has the same rows)"},
        "holdout_fraction": {"type": "number", "minimum": 0, "maximum": 0.5, "default": 0.2,
                             "description": "units held out for the officer's quality and privacy reports"},
        "target": {"type": "string", "description": "a column for train-synthetic-test-real utility in the report"},
        "epochs": {"type": "integer", "minimum": 1, "maximum": 500, "default": VAE_DEFAULTS["epochs"],
                   "description": "vae"},
        "batch_size": {"type": "integer", "minimum": 1, "default": VAE_DEFAULTS["batch_size"],
                       "description": "vae: expected batch (at most a quarter of the training units by default)"},
        "latent_dim": {"type": "integer", "minimum": 1, "maximum": 256, "default": VAE_DEFAULTS["latent_dim"],
                       "description": "vae"},
        "hidden": {"type": "array", "items": {"type": "integer"}, "default": VAE_DEFAULTS["hidden"],
                   "description": "vae: encoder and decoder widths"},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": VAE_DEFAULTS["learning_rate"],
                          "description": "vae"},
    }
    return {"synthesize": {"type": "object", "additionalProperties": False, "required": ["epsilon"],
                           "properties": props}}
