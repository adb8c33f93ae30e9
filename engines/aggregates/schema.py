"""JSON schemas of each kind's parameters (shown by ``GET /api/engines/``).

The schemas describe the shape; params.py checks everything against the dataset
(columns, bounds, domains) and is the authority.
"""

from __future__ import annotations

from .params import (DEFAULT_CANDIDATES, KIND_KEYS, MAX_BINS, MAX_CANDIDATES, MAX_IN_VALUES, MAX_K, MAX_PREDICATES,
                     NULL_OPS, OPS)

_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_SCALAR = {"type": ["string", "number", "boolean"]}

_COMMON = {
    "where": {
        "type": "array", "maxItems": MAX_PREDICATES,
        "description": "predicates ANDed; only on declared numeric or categorical columns (a categorical "
                       "literal must be in the declared domain; like / ilike take a pattern, % any text, _ one character, a "
                       "backslash escaping, matched against a categorical column's declared values); a null never "
                       "matches but is_null; an item may also be "
                       '{"or": [list, list, ...]} (any list holds) or {"not": list} (the list does not hold), nested',
        "items": {"anyOf": [
            {"type": "object", "additionalProperties": False, "required": ["or"],
             "properties": {"or": {"type": "array", "minItems": 2, "items": {"$ref": "#/properties/where"}}}},
            {"type": "object", "additionalProperties": False, "required": ["not"],
             "properties": {"not": {"$ref": "#/properties/where"}}},
            {
            "type": "object", "additionalProperties": False, "required": ["column", "op", "value"],
            "properties": {
                "column": {"type": "string"},
                "op": {"enum": [op for op in OPS if op not in NULL_OPS]},
                "value": {"oneOf": [_SCALAR, {"type": "array", "items": _SCALAR, "minItems": 1,
                                              "maxItems": MAX_IN_VALUES},
                                    {"type": "object", "additionalProperties": False, "required": ["column"],
                                     "properties": {"column": {"type": "string"}},
                                     "description": "another numeric column, compared row by row"}]},
            },
            },
            {"type": "object", "additionalProperties": False, "required": ["column", "op"],
             "description": "SQL's IS [NOT] NULL (a NaN is null): true or false, never unknown",
             "properties": {"column": {"type": "string"}, "op": {"enum": list(NULL_OPS)}, "value": {"type": "null"}}},
            ]},
    },
    "group_by": {"type": "string", "description": "a categorical column with a declared domain (one output "
                                                  "per domain value, in domain order), or a numeric column "
                                                  "declared integer with bounds (one per integer within them)"},
    "mechanism": {"enum": ["laplace", "gaussian"], "default": "laplace",
                  "description": "laplace: pure epsilon-DP; gaussian: zCDP (rho)"},
    "epsilon": {**_POSITIVE, "description": "pure-DP budget (laplace); give exactly one of epsilon, rho, accuracy"},
    "rho": {**_POSITIVE, "description": "zCDP budget (gaussian)"},
    "accuracy": {"type": "object", "additionalProperties": False, "required": ["halfwidth"],
                 "properties": {"halfwidth": _POSITIVE},
                 "description": "95% half-width the engine turns into the cost (count, sum, histogram)"},
    "max_rows_per_unit": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 1,
                          "description": "rows kept per privacy unit (datasets with a unit column); "
                                         "sensitivity scales with it"},
}

_COLUMN = {"type": "string", "description": "a numeric column with declared lower and upper bounds"}

_EXTRA = {
    "count": {"column": {"type": "string", "description": "optional: count the rows where this declared "
                                                        "numeric or categorical column is not null (COUNT(column))"}},
    "sum": {"column": _COLUMN},
    "mean": {"column": _COLUMN},
    "variance": {"column": _COLUMN},
    "histogram": {
        "column": {"type": "string", "description": "a categorical column (bins = declared domain) or a "
                                                    "bounded numeric column with bins"},
        "bins": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": MAX_BINS + 1,
                 "description": "strictly increasing edges inside [lower, upper]: bins [a, b), the last closed"},
    },
    "quantile": {
        "column": _COLUMN,
        "q": {"type": "number", "minimum": 0.0001, "maximum": 0.9999, "default": 0.5},
        "candidates": {"type": "integer", "minimum": 2, "maximum": MAX_CANDIDATES, "default": DEFAULT_CANDIDATES,
                       "description": "size of the evenly spaced grid in [lower, upper]"},
    },
}


def params_schema() -> dict:
    out = {}
    for kind, extra in _EXTRA.items():
        assert set(extra) == KIND_KEYS[kind]
        props = {**_COMMON, **extra}
        required = ["column"] if "column" in extra and kind != "count" else []
        if kind == "quantile":
            props = {k: v for k, v in props.items() if k not in ("rho", "accuracy", "mechanism")}
            props["mechanism"] = {"enum": ["exponential"], "default": "exponential"}
            required.append("epsilon")
        if kind == "histogram":
            props.pop("group_by")
        out[kind] = {"type": "object", "additionalProperties": False, "properties": props, "required": required}
    out["query"] = _QUERY
    return out


_QUERY = {
    "type": "object", "additionalProperties": False, "required": ["select"],
    "description": "several aggregates over the same rows and groups, one request (what SQL becomes; "
                   "engines/aggregates/query.py). The budget is the query's, split equally between the aggregates.",
    "properties": {
        "select": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "group": {"type": "integer", "minimum": 0},
            "agg": {"enum": ["count", "count_distinct", "sum", "mean", "variance", "quantile"]},
            "column": {"type": "string"}, "q": {"type": "number", "minimum": 0.0001, "maximum": 0.9999}}}},
        "group_by": {"type": "array", "maxItems": 4, "items": {"type": "object", "required": ["column"], "properties": {
            "column": {"type": "string"}, "name": {"type": "string"},
            "width": _POSITIVE, "multiplier": {"type": "number"},
            "thresholds": {"type": "array", "items": {"type": "number"}, "minItems": 1},
            "closed": {"enum": ["left", "right"]}, "labels": {"type": "array", "items": _SCALAR}}},
            "description": "categorical columns (declared domain; column, name), integer columns with bounds "
                           "(column, name: every integer in the bounds), or bins of bounded numeric "
                           "columns: width (FLOOR(col / width) * multiplier; column, name, width, multiplier) or "
                           "thresholds (CASE WHEN col < t ...; column, name, thresholds, closed, labels). A key "
                           "its form does not take is a 400"},
        "where": _COMMON["where"],
        "having": {"type": "array", "items": {"type": "object"},
                   "description": "on released values: {column, op, value} on a selected column, ANDed; an item "
                                  "may also be {\"or\": [list, ...]} or {\"not\": list}, nested"},
        "order_by": {"type": "array", "items": {"type": "object", "properties": {
            "column": {"type": "string"}, "desc": {"type": "boolean"}}}},
        "limit": {"type": "integer", "minimum": 1},
        **{k: _COMMON[k] for k in ("mechanism", "epsilon", "rho", "accuracy", "max_rows_per_unit")},
        "candidates": {"type": "integer", "minimum": 2, "maximum": MAX_CANDIDATES, "default": DEFAULT_CANDIDATES,
                       "description": "for a quantile item; refused on a query without one"},
    },
}
