"""The ``query`` kind: several aggregates over the same filtered rows and the same groups,
planned as one request (what a SQL SELECT with more than the simplest shape becomes).

Params (JSON)::

    {"select": [{"name": "region", "group": 0},                      # a group key, shown
                {"name": "n", "agg": "count"},
                {"name": "mean_income", "agg": "mean", "column": "income"},
                {"name": "p90", "agg": "quantile", "column": "income", "q": 0.9},
                {"name": "people", "agg": "count_distinct", "column": "<the unit column>"},
                {"name": "jobs", "agg": "count_distinct", "column": "occupation"}],  # public values
     "group_by": [{"column": "region"},                               # categorical: declared domain
                  {"column": "age", "width": 10, "multiplier": 10},  # FLOOR(age / 10) * 10
                  {"column": "age", "thresholds": [30, 60], "closed": "left",
                   "labels": ["young", "middle", "old"]}],           # CASE WHEN age < 30 ...
     "where": [...], "having": [{"column": "n", "op": ">", "value": 100}],
     "order_by": [{"column": "n", "desc": true}], "limit": 10,
     "epsilon": 1.0, ...}

Privacy: the aggregates are released on the same rows, so their costs add up (sequential
composition): the budget given (epsilon, or rho for the gaussian mechanism) is the whole
query's and is split equally between the aggregates; ``accuracy`` applies to each. The event
is ``{"kind": "composed", "events": [one per aggregate]}``, charged once. Every aggregate
is planned, bounded and noised exactly as its own kind (planner.py), on the groups of the
cartesian product of the group keys' public labels (declared domains, and bins from the
declared bounds: never from the data). ``count_distinct`` of the privacy-unit column counts
each unit once per group, keeping at most ``max_rows_per_unit`` groups per unit (sensitivity
``max_rows_per_unit``, as a count); of another column with public values (a declared domain,
or an integer column's bounds: ``params.group_labels``) it counts the values held by some
kept row, per group (a unit's k kept rows add at most k: the same sensitivity). HAVING,
ORDER BY and LIMIT act on the released (noisy) values only: post-processing, free.
"""

from __future__ import annotations

import itertools
import math
import operator
import struct
from typing import Any

from engines.types import DatasetMeta, EngineRequest, Plan, PlanError
from engines.validation import is_number, unknown_keys

from . import params as P

AGGS = {"count": "count", "count_distinct": "count", "sum": "sum", "mean": "mean", "variance": "variance",
        "quantile": "quantile"}
QUERY_KEYS = {"select", "group_by", "where", "having", "order_by", "limit", "mechanism", "epsilon", "rho",
              "accuracy", "max_rows_per_unit", "candidates"}
MAX_SELECT = 20
MAX_NAME = 200  # characters of an output name, unless it is one of the dataset's column names
MAX_GROUP_KEYS = 4
MAX_GROUPS = 10_000
MAX_LIMIT = 1_000_000
HAVING_OPS = ("==", "!=", "<", "<=", ">", ">=")


def _err(errors: dict, key: str, message: str) -> None:
    errors.setdefault(key, message)


def _floor_edge(j: int, w: float) -> float:
    """The least float x with floor(x / w) >= j (x / w in float64, as SQL's FLOOR(col / w)
    computes it): bins [edge_j, edge_j+1) hold exactly the values whose FLOOR(x / w) is j.
    j * w alone is off by a unit in the last place for widths such as 0.1 (1.7 / 0.1 is
    17.0, 17 * 0.1 is 1.7000000000000002, so 1.7 fell in the bin of 16). x / w >= j (which
    for an integer j is floor(x / w) >= j) is monotone in x, so a bisection over the
    floats' order finds it in at most about 130 divisions. One float at a time it took
    about w / 2 steps for bin 0 of a wide bin (x / w is -0.0 for every tiny negative x):
    a width of 1e12 held a web thread for good."""

    def at_or_past(k: int) -> bool:
        return _float_of(k) / w >= j

    hi, step = _order_of(float(j * w)), 1
    while not at_or_past(hi):
        hi, step = hi + step, step * 2
    lo, step = hi - 1, 1
    while at_or_past(lo):
        lo, step = lo - step, step * 2
    while hi - lo > 1:  # at_or_past(lo) is false, at_or_past(hi) true
        mid = (lo + hi) // 2
        if at_or_past(mid):
            hi = mid
        else:
            lo = mid
    return _float_of(hi)


_SIGN = 1 << 63
_TOP = 0x7FF0_0000_0000_0000  # inf's order; the finite floats lie strictly between -_TOP and _TOP


def _order_of(x: float) -> int:
    """x's place in the order of the floats (adjacent floats differ by 1; -0.0 and 0.0 are 0)."""
    i = struct.unpack("<q", struct.pack("<d", x))[0]
    return i if i >= 0 else -(i & (_SIGN - 1))


def _float_of(k: int) -> float:
    k = max(-_TOP, min(_TOP, k))  # past the largest float: inf, where x / w >= j is decided too
    return struct.unpack("<d", struct.pack("<Q", k if k >= 0 else -k | _SIGN))[0]


BIN_KEYS = {"column", "name", "width", "multiplier"}
THRESHOLD_KEYS = {"column", "name", "thresholds", "closed", "labels"}


def _too_long(name: str, dataset: DatasetMeta) -> bool:
    """An output name past ``MAX_NAME`` characters that is not one of the dataset's columns
    (a registered column may have a longer name: a survey's question as its header, and
    a select item or a group key is named after its column by default)."""
    return len(name) > MAX_NAME and name not in dataset.columns


def _group_key(i: int, g: Any, dataset: DatasetMeta, errors: dict) -> dict | None:
    key = f"group_by[{i}]"
    if not isinstance(g, dict) or "column" not in g:
        _err(errors, key, 'must be an object with "column" (and "width" or "thresholds" to bin a numeric one)')
        return None
    # the keys each form takes; any other is refused, never accepted and ignored (it would be
    # stored in the request and its audit record, and make the same question a new one)
    form, what = ((BIN_KEYS, "width bins take") if "width" in g else
                  (THRESHOLD_KEYS, "threshold bins take") if "thresholds" in g else
                  ({"column", "name"}, "a categorical key takes"))
    extra = set(g) - form
    if extra:
        _err(errors, key, f"unknown key(s) {', '.join(sorted(map(str, extra)))[:300]}: {what} "
                          f"{', '.join(sorted(form))}")
        return None
    if "name" in g and (not isinstance(g["name"], str) or not g["name"] or _too_long(g["name"], dataset)):
        _err(errors, key, f"name must be a string of 1 to {MAX_NAME} characters (or a column's name)")
        return None
    spec, err = P._column_spec(dataset, g["column"])
    if err:
        _err(errors, key, err)
        return None
    col = g["column"]
    name = g.get("name", col)
    if "width" not in g and "thresholds" not in g:
        dom = P.group_labels(spec)
        if dom is None:
            _err(errors, key, f"group by needs {P.GROUP_HINT}, or bins of a bounded numeric column "
                              f"(FLOOR({col} / w) * w, CASE WHEN {col} < a THEN ...); {col!r} is {P._described(spec)}")
            return None
        return {"name": name, "column": col, "type": "categorical", "labels": dom}
    bounds = P._bounds(spec)
    if bounds is None:
        _err(errors, key, f"bins need a numeric column with declared bounds; {col!r} is {spec.get('type')!r}")
        return None
    lo, hi = bounds
    if "width" in g:
        w, mult = g["width"], g.get("multiplier", 1)
        if not is_number(w) or w <= 0 or not is_number(mult) or mult == 0:
            _err(errors, key, "width must be a number > 0 and multiplier a non-zero number")
            return None
        w, mult = float(w), float(mult)
        ratios = (lo / w, hi / w, (hi / w + 2) * abs(mult), (lo / w - 1) * abs(mult))
        if not all(math.isfinite(x) and abs(x) < 2**52 for x in ratios):
            _err(errors, key, f"width {w:g} and multiplier {mult:g} give bins beyond the number range")
            return None
        first, last = math.floor(lo / w), math.floor(hi / w)
        if last - first + 1 > MAX_GROUPS:
            _err(errors, key, f"{last - first + 1} bins of width {w} in [{lo:g}, {hi:g}]: at most {MAX_GROUPS}")
            return None
        idx = list(range(first, last + 2))
        edges = [_floor_edge(j, w) for j in idx]
        labels = [_num(j * mult) for j in idx[:-1]]
        return {"name": name, "column": col, "type": "bins", "bounds": [lo, hi], "edges": edges, "labels": labels}
    th, closed, labels = g.get("thresholds"), g.get("closed", "left"), g.get("labels")
    if (not isinstance(th, list) or not th or not all(is_number(t) for t in th)
            or any(a >= b for a, b in zip(th[:-1], th[1:]))):
        _err(errors, key, "thresholds must be a strictly increasing list of numbers")
        return None
    if closed not in ("left", "right"):
        _err(errors, key, "closed must be 'left' (col < t) or 'right' (col <= t)")
        return None
    if not isinstance(labels, list) or len(labels) != len(th) + 1 or not all(P._scalar_ok(v) for v in labels):
        _err(errors, key, f"labels must be {len(th) + 1} values (one per bin, the last for ELSE)")
        return None
    if len(th) >= MAX_GROUPS or not all(abs(float(t)) < 1e300 for t in th):
        _err(errors, key, f"at most {MAX_GROUPS - 1} thresholds, each a number below 1e300")
        return None
    cuts = [float(t) if closed == "left" else math.nextafter(float(t), math.inf) for t in th]
    # bins [e_i, e_i+1) over the clamped values; the outer edges hold every value in [lo, hi]
    edges = [min(lo, cuts[0]) - 1.0] + cuts + [math.nextafter(max(hi, cuts[-1]) + 1.0, math.inf)]
    if len({str if isinstance(v, str) else bool if isinstance(v, bool) else float for v in labels}) > 1:
        # SQL gives a CASE one type: its text labels become numbers ('01' is 1, 'a' an error) and
        # the bins group as those; kept apart, 1 and '01' were two groups where DuckDB makes one
        _err(errors, key, "labels must be of one type (all text, all numbers or all booleans): SQL converts a "
                          "CASE's text labels to its numbers ('01' is 1, 'a' an error)")
        return None
    if len({P.as_text(v) for v in labels}) != len(labels):  # the same label for two bins: they are one group
        # (compared as text: '1' and 1 were two groups where SQL makes one of both types' rows)
        _err(errors, key, "labels must differ, also as text ('1' and 1 are one label; merge the bins with one "
                          "threshold instead)")
        return None
    # a null (or NaN) is not < t: it takes ELSE, as in SQL (every row has a group). Each
    # row's own value is compared, as WHERE compares it: clamped to the declared bounds
    # first, the rows under a threshold below the lower bound went to ELSE (only the
    # aggregated values are clamped); the outer edges keep every value in a bin.
    return {"name": name, "column": col, "type": "bins", "bounds": [edges[0], edges[-1]], "edges": edges,
            "labels": labels, "nulls": len(labels) - 1}


def _num(x: float):
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def group_domain(keys: list[dict]) -> list:
    """The groups, in order: the cartesian product of the keys' labels (a label alone for one key)."""
    if len(keys) == 1:
        return list(keys[0]["labels"])
    return [list(t) for t in itertools.product(*(k["labels"] for k in keys))]


def validate(params: Any, dataset: DatasetMeta) -> tuple[list, list, list, dict]:
    """(select items, group keys, aggregates as (name, Query), post-processing) or PlanError."""
    if not isinstance(params, dict):
        raise PlanError("params must be a JSON object", {"params": "must be an object"})
    errors: dict[str, str] = {}
    for k in unknown_keys(params, QUERY_KEYS)[0]:
        errors[str(k)[:100]] = f"unknown parameter for query; allowed: {', '.join(sorted(QUERY_KEYS))}"
    gb = params.get("group_by", [])
    keys: list[dict] = []
    if not isinstance(gb, list) or len(gb) > MAX_GROUP_KEYS:
        errors["group_by"] = f"must be a list of at most {MAX_GROUP_KEYS} group keys"
    else:
        keys = [k for k in (_group_key(i, g, dataset, errors) for i, g in enumerate(gb)) if k]
        for i, g in enumerate(gb):  # the same key twice: groups of a x a, most of them empty by construction
            if g in gb[:i]:
                errors[f"group_by[{i}]"] = f"repeats group_by[{gb.index(g)}]: name each key once"
        n_groups = math.prod(len(k["labels"]) for k in keys) if keys else 1
        if n_groups > MAX_GROUPS:
            errors["group_by"] = f"{n_groups} groups (the product of the keys' labels): at most {MAX_GROUPS}"
    select = params.get("select")
    if not isinstance(select, list) or not select or len(select) > MAX_SELECT + MAX_GROUP_KEYS:
        raise PlanError(f"invalid query request: select must be a list of 1 to {MAX_SELECT} aggregates "
                        "(and the group keys)", {**errors, "select": "must be a non-empty list"})
    items, aggs, names = [], [], set()
    n_aggs = sum(1 for it in select if isinstance(it, dict) and "agg" in it)
    if not 1 <= n_aggs <= MAX_SELECT:
        errors["select"] = f"select 1 to {MAX_SELECT} aggregates, got {n_aggs}"
        n_aggs = max(n_aggs, 1)
    shared = {k: params[k] for k in ("where", "mechanism", "max_rows_per_unit") if k in params}
    budget = {k: params[k] for k in ("epsilon", "rho", "accuracy") if params.get(k) is not None}
    for i, it in enumerate(select):
        key = f"select[{i}]"
        if not isinstance(it, dict) or not isinstance(it.get("name"), str) or not it["name"]:
            errors[key] = 'must be {"name", "agg", ...} or {"name", "group": index}'
            continue
        name = it["name"]
        if _too_long(name, dataset):
            errors[key] = f"an output name is at most {MAX_NAME} characters (or a column's name)"
            continue
        if name in names:
            errors[key] = f"the column name {name!r} is used twice: give each its own alias"
            continue
        names.add(name)
        if "group" in it:
            g = it["group"]
            n_keys = len(gb) if isinstance(gb, list) else 0  # (a group_by that is no list is refused above)
            if set(it) != {"name", "group"} or isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < n_keys:
                errors[key] = "a group item is {\"name\", \"group\": index into group_by}"
                continue
            items.append({"name": name, "group": g})
            continue
        agg = it.get("agg")
        if not isinstance(agg, str) or agg not in AGGS:
            errors[key] = f"agg must be one of {', '.join(AGGS)}, got {agg!r}"
            continue
        sub = {k: v for k, v in it.items() if k not in ("name", "agg")}
        allowed = {"column"} | P.KIND_KEYS[AGGS[agg]]
        if extra := sorted(map(str, set(sub) - allowed)):
            where = [k for k in extra if k in P.COMMON_KEYS]
            errors[key] = (f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)[:300]} for {agg}: an item "
                           f"takes name, agg and {', '.join(sorted(allowed))}" +
                           (f"; {', '.join(where)} apply to the whole query (every aggregate is on the same rows "
                            "and groups): give them at the top level" if where else ""))
            continue
        sub.update(shared)
        share = dict(budget)
        for b in ("epsilon", "rho"):
            if is_number(share.get(b)) and share[b] > 0:
                share[b] = share[b] / n_aggs
        if AGGS[agg] == "quantile":
            if "candidates" in params:
                sub.setdefault("candidates", params["candidates"])
            sub.pop("mechanism", None)
        sub.update(share)
        distinct_of = None
        if agg == "count_distinct":
            col = sub.pop("column", None)
            if not (dataset.unit_column and col == dataset.unit_column):
                # the distinct values of a column with public values: a unit's k kept rows
                # add at most k of them (in all groups together), so the count's sensitivity
                spec, err = P._column_spec(dataset, col)
                distinct_of = P.group_labels(spec) if spec else None
                if distinct_of is None:
                    units = (f", or the privacy-unit column {dataset.unit_column!r} (COUNT(DISTINCT "
                             f"{dataset.unit_column}) counts units)") if dataset.unit_column else ""
                    errors[key] = (f"COUNT(DISTINCT column) counts the distinct values of {P.GROUP_HINT} (values "
                                   f"outside it are not counted){units}; {col!r}: "
                                   + (err or f"is {P._described(spec)}"))
                    continue
        sub_errors: dict[str, str] = {}
        try:
            q = P.validate(AGGS[agg], sub, dataset)
        except PlanError as e:
            sub_errors = dict(e.errors)
        for k, v in sub_errors.items():
            errors.setdefault(k if k.startswith("where") or k in ("epsilon", "rho", "accuracy", "mechanism",
                                                                    "max_rows_per_unit") else f"{key}.{k}", v)
        if sub_errors:
            continue
        q.distinct_units = agg == "count_distinct" and distinct_of is None
        if distinct_of is not None:
            q.column, q.distinct_of = col, distinct_of
        items.append({"name": name, "agg": len(aggs)})
        aggs.append((name, agg, q))
    if "candidates" in params and not any(isinstance(it, dict) and isinstance(it.get("agg"), str)
                                          and AGGS.get(it["agg"]) == "quantile" for it in select):
        errors["candidates"] = "candidates are for a quantile (median, percentile): this query has none"
    post = _post(params, names, _kinds(items, keys), errors)
    _refuse_an_empty_having(post["having"], {it["name"]: keys[it["group"]]["labels"] for it in items
                                             if "agg" not in it and it["group"] < len(keys)}, errors)
    if errors:
        detail = "; ".join(f"{k}: {v}" for k, v in errors.items())
        raise PlanError(f"invalid query request: {detail}", errors)
    return items, keys, aggs, post


def _kind(v) -> str:
    if isinstance(v, bool):
        return "a boolean"
    return "a number" if isinstance(v, (int, float)) else "text"


def _kinds(items: list, keys: list) -> dict:
    """The kinds of value (``_kind``) each selected column holds: an aggregate a number, a
    group key its labels' (public: the declared domain, the bins)."""
    return {it["name"]: ({"a number"} if "agg" in it else {_kind(v) for v in keys[it["group"]]["labels"]})
            for it in items if "agg" in it or it["group"] < len(keys)}


def _refuse_an_empty_having(having: list, labels: dict, errors: dict) -> None:
    """A HAVING item (ANDed with the others) ``key == v`` where the group key ``key`` has no
    label v: the answer is empty whatever the data, and was charged (a probe's HAVING site
    = 'nowhere'; the same in WHERE is refused as holding on no row)."""
    for i, h in enumerate(having):
        if isinstance(h, dict) and h.get("op") == "==" and h.get("column") in labels:
            known = list(labels[h["column"]])
            if not any(_kind(v) == _kind(h["value"]) and v == h["value"] for v in known):
                listed = ", ".join(repr(v) for v in known[:20]) + (" ..." if len(known) > 20 else "")
                errors.setdefault(f"having[{i}]", f"{h['column']} has no group {h['value']!r} ({listed}): the "
                                                  "answer would be empty whatever the data")


def _having_list(having: Any, names: set, kinds: dict, errors: dict) -> list:
    """A validated HAVING list: comparisons of selected columns with literals, ANDed, an item
    may also be ``{"or": [list, ...]}`` or ``{"not": list}``, nested (``P.nested_list``; on
    released values)."""
    def comparison(i: int, h: Any, item: str) -> dict | None:
        if (not isinstance(h, dict) or set(h) != {"column", "op", "value"} or not isinstance(h["column"], str)
                or h["column"] not in names or h["op"] not in HAVING_OPS or not P._scalar_ok(h["value"])):
            errors[item] = (f"must be {{column, op, value}} on a selected column ({', '.join(sorted(names))}), "
                            f"op one of {', '.join(HAVING_OPS)}, value a literal")
            return None
        if h["column"] in kinds and _kind(h["value"]) not in kinds[h["column"]]:
            # a value no row can equal or be ordered with: the answer would be empty (or
            # every row), charged for nothing; SQL refuses such a comparison too
            errors[item] = (f"{h['column']} holds {' or '.join(sorted(kinds[h['column']]))}, "
                            f"not {_kind(h['value'])} like {h['value']!r}")
            return None
        return dict(h)

    return P.nested_list(having, comparison, errors, "having", what="comparison")


def _post(params: dict, names: set, kinds: dict, errors: dict) -> dict:
    out: dict = {"having": [], "order_by": [], "limit": None}
    out["having"] = _having_list(params.get("having", []), names, kinds, errors)
    order = params.get("order_by", [])
    if not isinstance(order, list):
        errors["order_by"] = "must be a list of {column, desc}"
    else:
        for i, o in enumerate(order):
            if not isinstance(o, dict) or o.get("column") not in names or not isinstance(o.get("desc", False), bool):
                errors[f"order_by[{i}]"] = f"must be {{column, desc}} on a selected column ({', '.join(sorted(names))})"
            else:
                out["order_by"].append({"column": o["column"], "desc": o.get("desc", False)})
    limit = params.get("limit")
    if limit is not None:
        # (0 answers no row whatever the data, and was charged for it: a probe)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            errors["limit"] = f"must be an integer between 1 and {MAX_LIMIT}"
        else:
            out["limit"] = limit
    return out


def make_plan(request: EngineRequest, dataset: DatasetMeta) -> Plan:
    from .planner import DETAILS_VERSION, plan_validated, where_columns

    items, keys, aggs, post = validate(request.params, dataset)
    domain = group_domain(keys) if keys else None
    label = ", ".join(k["name"] for k in keys) if keys else None
    events, subs, errors = [], [], {}
    total: dict[str, float] = {}
    # the tables each aggregate keeps until its noise, summed over the query: groups x
    # (candidates + 1) for a quantile's scores, groups x values for a distinct count's rows
    # per value (20 distinct counts of 10,000 values in 10,000 groups were 16 GB: a probe)
    cells = 0
    for name, agg, q in aggs:
        if keys:
            q.group_by, q.domain = label, domain
        groups = len(domain) if keys else 1
        if q.kind == "quantile" and keys:
            cells += groups * (q.candidates + 1)
            if cells > P.MAX_SCORE_CELLS:
                errors[f"{name}.candidates"] = (f"{groups} groups x {q.candidates} candidates is too many "
                                                "(with the aggregates before it); keep groups x candidates, summed "
                                                f"over the query's quantiles and distinct counts, under "
                                                f"{P.MAX_SCORE_CELLS:,}")
                continue
        if q.distinct_of is not None:
            cells += groups * len(q.distinct_of)
            if cells > P.MAX_SCORE_CELLS:
                errors[name] = (f"{groups} groups x {len(q.distinct_of)} values of {q.column!r} is too many (with "
                                "the aggregates before it); keep groups x values, summed over the query's distinct "
                                f"counts and quantiles, under {P.MAX_SCORE_CELLS:,}")
                continue
        try:
            event, details = plan_validated(q, dataset)
        except PlanError as e:
            errors.update({f"{name}.{k}" if not k.startswith(("epsilon", "rho", "accuracy")) else k: v
                           for k, v in e.errors.items()})
            continue
        details["name"], details["agg"] = name, agg
        details["group_keys"] = keys or None
        details["distinct_units"] = bool(getattr(q, "distinct_units", False))
        events.append(event)
        subs.append(details)
        for k, v in details["cost"].items():
            total[k] = total.get(k, 0.0) + v
    if errors:
        raise PlanError("invalid query request: " + "; ".join(f"{k}: {v}" for k, v in errors.items()), errors)
    first = aggs[0][2]
    details = {
        "version": DETAILS_VERSION, "kind": "query", "mechanism": subs[0]["mechanism"],
        "unit_column": dataset.unit_column, "n_rows": int(dataset.n_rows), "max_rows_per_unit": first.k,
        "where": first.where, "group_keys": keys or None, "select": items, "aggregates": subs,
        "cost": total, **post,
    }
    event = events[0] if len(events) == 1 else {"kind": "composed", "events": events}
    columns = [c for s in subs for c in [s["column"]] if c]
    columns += [k["column"] for k in keys] + where_columns(first.where)
    return Plan(event=event, columns=list(dict.fromkeys(columns)), details=details)


# --------------------------------------------------------------------------- the release (post-processing)


def _cell(result: dict, g: int | None) -> tuple[Any, Any]:
    if g is None:
        return result.get("value"), result.get("ci95")
    row = result["groups"][g]
    return row["value"], row.get("ci95")


def assemble(d: dict, results: list[dict]) -> dict:
    """The query's table from its aggregates' releases: one row per group (or one row), the
    select list's columns in order, then HAVING, ORDER BY and LIMIT on the released values."""
    keys = d["group_keys"] or []
    domain = group_domain(keys) if keys else [None]
    columns = [it["name"] for it in d["select"]]
    rows, cis = [], []
    for g, labels in enumerate(domain):
        parts = labels if len(keys) > 1 else [labels]
        row, ci = [], []
        for it in d["select"]:
            if "group" in it:
                row.append(parts[it["group"]])
                ci.append(None)
            else:
                v, c = _cell(results[it["agg"]], g if keys else None)
                row.append(v)
                ci.append(c)
        rows.append(row)
        cis.append(ci)
    pos = {c: i for i, c in enumerate(columns)}
    keep = [i for i, row in enumerate(rows) if _having_truth(row, pos, d["having"])[0]]
    for o in reversed(d["order_by"]):
        j = pos[o["column"]]
        keep.sort(key=lambda i: _sort_key(rows[i][j]), reverse=o["desc"])
    if d["limit"] is not None:
        keep = keep[:d["limit"]]
    aggregates = []
    for s, r in zip(d["aggregates"], results):
        info = {k: v for k, v in r.items() if k not in ("groups", "value", "ci95", "group_by")}
        info.update({"name": s["name"], "agg": s["agg"], "column": s["column"]})
        aggregates.append(info)
    out = {"kind": "query", "columns": columns, "rows": [rows[i] for i in keep], "ci95": [cis[i] for i in keep],
           "group_by": [k["name"] for k in keys], "aggregates": aggregates, "mechanism": d["mechanism"],
           "max_rows_per_unit": d["max_rows_per_unit"]}
    out.update(d["cost"])
    if d["having"] or d["limit"] is not None:
        out["post_processing"] = ("HAVING / LIMIT applied to the noisy values; rows left out were released too. "
                                  "Each interval is 95% on its own: rows kept for their noisy values (the top "
                                  "ones, those past a threshold) were kept partly for their noise, and their "
                                  "intervals hold the exact value less often")
    return out


def _having_truth(row: list, pos: dict, having: list) -> tuple[bool, bool]:
    """(the HAVING list holds on ``row``, it is false there), in SQL's three-valued logic: a
    comparison with a value the release left out (None) is neither, nor is its NOT."""
    true, false = True, False
    for h in having:
        if "or" in h:
            branches = [_having_truth(row, pos, b) for b in h["or"]]
            t, f = any(b[0] for b in branches), all(b[1] for b in branches)
        elif "not" in h:
            f, t = _having_truth(row, pos, h["not"])
        else:
            t = _holds(row[pos[h["column"]]], h["op"], h["value"])
            f = t is False
            t = t is True
        true, false = true and t, false or f
    return true, false


def _holds(v, op: str, value) -> bool | None:
    """``v op value``; None (unknown) where ``v`` is None or cannot be compared with it."""
    if v is None:
        return None
    try:
        return bool(_HAVING_COMPARE[op](v, value))
    except TypeError:
        return None


_HAVING_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
                   ">=": operator.ge}


def _sort_key(v):
    if v is None:
        return (2, 0, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, v, "")
    return (1, 0, str(v))
