"""Validation of an aggregates request against the dataset's public metadata.

``validate(kind, params, dataset)`` returns a normalised ``Query`` or raises ``PlanError``
with every problem found, keyed by parameter (``{"epsilon": "must be > 0", ...}``).
Nothing here reads data.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from engines.types import DatasetMeta, PlanError
from engines.validation import MAX_EPSILON, MAX_UNKNOWN_REPORTED, is_number, unknown_keys

KINDS = ("count", "sum", "mean", "variance", "histogram", "quantile")
VALUE_KINDS = ("sum", "mean", "variance", "quantile")  # need a bounded numeric column
MECHANISMS = ("laplace", "gaussian")
NULL_OPS = ("is_null", "is_not_null")  # SQL's IS [NOT] NULL: true or false, never unknown
LIKE_OPS = ("like", "ilike")  # SQL's [I]LIKE on a declared domain: planned as ``in`` its matching values
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", *LIKE_OPS, *NULL_OPS)
EQUALITY_OPS = ("==", "!=", "in", "not_in", *LIKE_OPS, *NULL_OPS)
MAX_PREDICATES = 50
MAX_IN_VALUES = 1000
MAX_K = 1000
DEFAULT_CANDIDATES = 1024
MAX_CANDIDATES = 100_000
MAX_BINS = 10_000
MAX_SCORE_CELLS = 20_000_000  # groups x (candidates + 1) for a grouped quantile
MAX_HALFWIDTH = 1e15  # an accuracy target wider than any declared bound allows is a mistake

COMMON_KEYS = {"where", "group_by", "mechanism", "epsilon", "rho", "accuracy", "max_rows_per_unit"}
KIND_KEYS = {
    "count": {"column"},  # optional: COUNT(column), the rows where it is not null
    "sum": {"column"},
    "mean": {"column"},
    "variance": {"column"},
    "histogram": {"column", "bins"},
    "quantile": {"column", "q", "candidates"},
}
ACCURACY_KINDS = ("count", "sum", "histogram")


@dataclass
class Query:
    """A validated request (plain data)."""

    kind: str
    mechanism: str  # laplace | gaussian | exponential
    budget: tuple[str, float]  # ("epsilon" | "rho" | "halfwidth", value)
    k: int = 1
    column: str | None = None
    bounds: tuple[float, float] | None = None
    where: list[dict] = field(default_factory=list)
    group_by: str | None = None
    domain: list | None = None  # group_by's declared domain
    hist: dict | None = None  # {"type": "categorical", "labels"} | {"type": "numeric", "edges"}
    q: float | None = None
    candidates: int | None = None
    distinct_units: bool = False  # count_distinct of the unit column (query.py)
    distinct_of: list | None = None  # count_distinct of ``column``: its public values (``group_labels``)
    integer: bool = False  # the value column is declared integer (a quantile's interval ends are whole)
    non_null: list[dict] = field(default_factory=list)  # COUNT(column): ``column IS NOT NULL``, ANDed to where
    decimals: int | None = None  # its declared decimals (the ends are rounded out to them)



def _positive(v: Any, upper: float | None = None) -> str | None:
    if not is_number(v):
        return f"must be a finite number, got {v!r}"
    if float(v) <= 0:
        return f"must be > 0, got {v!r}"
    if upper is not None and float(v) > upper:
        return f"must be at most {upper:g}, got {v!r}"
    return None


def _scalar_ok(v: Any) -> bool:
    if isinstance(v, str):
        return _valid_unicode(v)
    return isinstance(v, bool) or is_number(v)


def _valid_unicode(s: str) -> bool:
    """False for a string holding a lone surrogate (JSON allows "\\ud800"; Arrow and UTF-8 do not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _column_spec(dataset: DatasetMeta, name: Any) -> tuple[dict | None, str | None]:
    if not isinstance(name, str) or not name:
        return None, "must be a column name"
    spec = dataset.columns.get(name)
    if spec is None:
        same = [c for c in dataset.columns if c.lower() == name.lower()]
        return None, f"unknown column {name!r}" + (f" (names are case-sensitive: {same[0]!r}?)" if same else "")
    if name == dataset.unit_column or spec.get("type") == "unit":
        return None, f"{name!r} is the privacy-unit column: it cannot be queried"
    return spec, None


def _described(spec: dict) -> str:
    """A column's declaration in a few words (for a refusal)."""
    what = repr(spec.get("type"))
    if spec.get("type") == "numeric":
        what += " declared integer" if spec.get("integer") is True else " without integer: true"
        if (bounds := _bounds(spec)) is None:
            what += ", without bounds"
        elif spec.get("integer") is True:  # too many integers to be groups (a probe's [0, 10**12] said only this)
            n = math.floor(bounds[1]) - math.ceil(bounds[0]) + 1
            what += f" on [{bounds[0]:g}, {bounds[1]:g}]: {n:,} values" if n > 0 else " with no integer in its bounds"
    return what


def _bounds(spec: dict) -> tuple[float, float] | None:
    lo, hi = spec.get("lower"), spec.get("upper")
    if spec.get("type") != "numeric" or not is_number(lo) or not is_number(hi) or not float(lo) < float(hi):
        return None
    return float(lo), float(hi)


def _domain(spec: dict) -> list | None:
    dom = spec.get("domain")
    if spec.get("type") != "categorical" or not isinstance(dom, list) or not dom:
        return None
    return list(dom)


MAX_INTEGER_GROUPS = 10_000


def group_labels(spec: dict) -> list | None:
    """The public groups of a column: its declared domain, or, for a numeric column declared
    ``integer`` with bounds, every integer within them (at most ``MAX_INTEGER_GROUPS``; a
    row whose value is not one of them, outside the bounds or a fraction, is in no group,
    as a categorical value outside its domain). None if the schema declares neither."""
    dom = _domain(spec)
    if dom is not None or spec.get("integer") is not True or (bounds := _bounds(spec)) is None:
        return dom
    first, last = math.ceil(bounds[0]), math.floor(bounds[1])
    if not -2**53 <= first <= last <= 2**53 or last - first + 1 > MAX_INTEGER_GROUPS:
        return None
    return list(range(first, last + 1))


GROUP_HINT = ("a categorical column with a declared domain, or a numeric column declared integer with bounds "
              f"(at most {MAX_INTEGER_GROUPS:,} values)")

MAX_WHERE_DEPTH = 8


#: LIKE patterns are matched against the declared values when a request is validated, on the
#: web process and free (``estimate``): at most this many pattern-character x value-character
#: steps per request (a probe's 10 patterns of 480 characters on 1,000 values of 999 took 6 s,
#: and an ``or`` of 50 x 50 of them would have taken 25 minutes); about 0.3 s
MAX_LIKE_WORK = 10**8


def where_list(where: Any, dataset: DatasetMeta, errors: dict, key: str = "where", depth: int = 0) -> list[dict]:
    """A validated where list: predicates ANDed; an item may also be ``{"or": [list, list, ...]}``
    (any of the lists holds) or ``{"not": list}`` (the list does not hold), nested."""
    like_work = [MAX_LIKE_WORK]  # what the request's LIKE patterns may still cost
    return nested_list(where, lambda i, p, item_key: _predicate(i, p, dataset, errors, item_key, like_work),
                       errors, key, depth)


def nested_list(items: Any, leaf, errors: dict, key: str, depth: int = 0, what: str = "predicate") -> list[dict]:
    """A list of ``leaf(i, item, key)`` (the validated item, or None with its error in
    ``errors``) ANDed, where an item may also be ``{"or": [list, ...]}`` or ``{"not": list}``,
    nested: WHERE's predicates on rows, HAVING's comparisons on released values (``what``)."""
    if not isinstance(items, list):
        errors[key] = 'must be a list of {"column", "op", "value"} (or {"or": [...]}, {"not": [...]})'
        return []
    if len(items) > MAX_PREDICATES:
        errors[key] = f"at most {MAX_PREDICATES} {what}s"
        return []
    if depth > MAX_WHERE_DEPTH:
        errors[key] = f"nested more than {MAX_WHERE_DEPTH} levels deep"
        return []
    out = []
    for i, p in enumerate(items):
        item_key = f"{key}[{i}]"
        if isinstance(p, dict) and set(p) == {"or"}:
            if not isinstance(p["or"], list) or not 2 <= len(p["or"]) <= MAX_PREDICATES:
                errors[item_key] = f'"or" must be a list of 2 to {MAX_PREDICATES} {what} lists'
                continue
            if any(isinstance(b, list) and not b for b in p["or"]):  # an empty branch holds on every row,
                errors[item_key] = f'each branch of "or" must be a non-empty {what} list'  # its NOT on none
                continue
            out.append({"or": [nested_list(b, leaf, errors, f"{item_key}.or[{j}]", depth + 1, what)
                               for j, b in enumerate(p["or"])]})
        elif isinstance(p, dict) and set(p) == {"not"}:
            if isinstance(p["not"], list) and not p["not"]:  # NOT of nothing: no row, charged for nothing
                errors[item_key] = '"not" must be a non-empty list (the NOT of an empty list holds on no row)'
                continue
            out.append({"not": nested_list(p["not"], leaf, errors, f"{item_key}.not", depth + 1, what)})
        else:
            one = leaf(i, p, item_key)
            if one:
                out.append(one)
    return out


def _exact(v: int | float) -> int | float:
    """A numeric literal as compared (``compute._compare``): an integer stays an integer,
    exact past 2**53 (as a float, 2**53 + 1 was 2**53); a float stays a float."""
    return v if isinstance(v, int) else float(v)


def _predicate(i: int, p: Any, dataset: DatasetMeta, errors: dict, key: str | None = None,
               like_work: list[int] | None = None) -> dict | None:
    key = key or f"where[{i}]"
    if not isinstance(p, dict):
        errors[key] = 'must be an object {"column", "op", "value"}'
        return None
    extra = set(p) - {"column", "op", "value"}
    if extra:
        errors[key] = f"unknown key(s): {', '.join(sorted(map(str, extra)))}"
        return None
    null_test = p.get("op") in NULL_OPS
    if not ({"column", "op"} if null_test else {"column", "op", "value"}) <= set(p):
        errors[key] = 'needs "column" and "op"' if null_test else 'needs "column", "op" and "value"'
        return None
    spec, err = _column_spec(dataset, p["column"])
    if err:
        errors[key] = err
        return None
    ctype = spec.get("type")
    if ctype not in ("numeric", "categorical"):
        errors[key] = (f"column {p['column']!r} is of type {ctype!r}: predicates apply only to declared "
                       "numeric or categorical columns")
        return None
    op = p["op"]
    if not isinstance(op, str) or op not in OPS:
        errors[key] = f"op must be one of {', '.join(OPS)}, got {op!r}"
        return None
    if ctype == "categorical" and op not in EQUALITY_OPS:
        errors[key] = (f"op {op!r} needs a numeric column; categorical columns take ==, !=, in, not_in, is_null, "
                       "is_not_null")
        return None
    if null_test:  # (a NaN is null, as in every other predicate)
        if p.get("value") is not None:
            errors[key] = f"op {op!r} takes no value"
            return None
        return {"column": p["column"], "op": op, "value": None, "type": ctype}
    if op in LIKE_OPS:
        return _like(p, spec, errors, key, like_work if like_work is not None else [MAX_LIKE_WORK])
    if isinstance(p["value"], dict):
        return _other_column(p, ctype, dataset, errors, key)
    ok = is_number if ctype == "numeric" else _scalar_ok
    what = "finite number" if ctype == "numeric" else "string (valid Unicode), number or boolean"
    value = p["value"]
    if op in ("in", "not_in"):
        if not isinstance(value, list) or not value or len(value) > MAX_IN_VALUES:
            errors[key] = f"value of {op!r} must be a list of 1 to {MAX_IN_VALUES} values"
            return None
        if not all(ok(v) for v in value):
            errors[key] = f"every value must be a {what}"
            return None
        value = [_exact(v) for v in value] if ctype == "numeric" else list(value)
    else:
        if not ok(value):
            errors[key] = f"value must be a {what}"
            return None
        value = _exact(value) if ctype == "numeric" else value
    if ctype == "categorical" and (dom := _domain(spec)) is not None:
        outside = [v for v in (value if op in ("in", "not_in") else [value]) if not in_domain(v, dom)]
        if outside:
            shown = ", ".join(repr(v) for v in outside[:5]) + (" ..." if len(outside) > 5 else "")
            listed = ", ".join(repr(v) for v in dom[:20]) + (" ..." if len(dom) > 20 else "")
            errors[key] = (f"{shown} {'is' if len(outside) == 1 else 'are'} not in the declared domain of "
                           f"{p['column']!r} ({listed}): compare with declared values only")
            return None
    return {"column": p["column"], "op": op, "value": value, "type": ctype}


COLUMN_OPS = ("==", "!=", "<", "<=", ">", ">=")
#: ``a op b`` is ``b FLIPPED[op] a``
FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _other_column(p: dict, ctype: str, dataset: DatasetMeta, errors: dict, key: str) -> dict | None:
    """``column op {"column": other}``: two declared numeric columns compared row by row
    on their raw values (``compute.compare_columns``; a null or NaN on either side: unknown)."""
    value = p["value"]
    if set(value) != {"column"}:
        errors[key] = 'a value that is an object names another column: {"column": name}'
        return None
    other, err = _column_spec(dataset, value["column"])
    if err:
        errors[key] = err
        return None
    if ctype != "numeric" or other.get("type") != "numeric" or p["op"] not in COLUMN_OPS:
        errors[key] = (f"a column is compared with another only when both are declared numeric, with one of "
                       f"{', '.join(COLUMN_OPS)}: {p['column']!r} is {ctype!r}, {value['column']!r} is "
                       f"{other.get('type')!r}")
        return None
    return {"column": p["column"], "op": p["op"], "value": {"column": value["column"]}, "type": "numeric"}


def _like(p: dict, spec: dict, errors: dict, key: str, like_work: list[int]) -> dict | None:
    """``column [I]LIKE pattern`` as ``column in`` the declared values whose text (as
    ``in_domain`` compares: ``as_text``) the pattern matches: decided on the public domain,
    so the run compares codes as for any ``in``. ``%`` is any text, ``_`` one character,
    a backslash makes the next character literal; ``ilike`` ignores case."""
    value, dom = p["value"], _domain(spec)
    if dom is None:
        errors[key] = (f"op {p['op']!r} needs a categorical column with a declared domain; "
                       f"{p['column']!r} has none: compare with == or in")
        return None
    if not isinstance(value, str) or not _valid_unicode(value) or len(value) > 1000:
        errors[key] = f"value of {p['op']!r} must be a pattern string (valid Unicode, at most 1,000 characters)"
        return None
    matcher = like_pattern(value, case=p["op"] == "like")
    if matcher is None:
        errors[key] = f"pattern {value!r} ends with an escaping backslash"
        return None
    texts = [as_text(v) for v in dom]
    work = (len(value) + 1) * sum(len(t) + 1 for t in texts)
    if work > like_work[0]:
        like_work[0] = 0  # the request is refused: no more matching for it
        errors[key] = (f"the request's LIKE patterns would compare more than {MAX_LIKE_WORK:,} pattern and value "
                       f"characters against the declared values of {p['column']!r}: use shorter or fewer patterns")
        return None
    like_work[0] -= work
    matches = [v for v, t in zip(dom, texts) if matcher.fullmatch(t)]
    if not matches:
        listed = ", ".join(repr(v) for v in dom[:20]) + (" ..." if len(dom) > 20 else "")
        errors[key] = (f"pattern {value!r} matches none of the declared values of {p['column']!r} ({listed}): "
                       "such a predicate holds on no row")
        return None
    return {"column": p["column"], "op": "in", "value": matches, "type": "categorical"}


class LikePattern:
    """A LIKE pattern (``%``, ``_``, backslash escapes) matched in linear passes: the text
    between ``%``s is a fixed-length piece (``_`` any one character) found leftmost in turn,
    the first at the start, the last at the end. A regular expression of ``.*``s backtracked:
    ten ``%`` before a letter no value holds took 62 s to plan, a hundred held the web
    process past 9 minutes, free through ``estimate`` (a probe). ``case=False`` (ILIKE)
    compares ``lower()`` of both sides, as SQL does, not Unicode case folding (which made
    ``'%σ'`` match ``σας``: 395 rows where DuckDB counts 192)."""

    def __init__(self, pieces: list[list[str]], case: bool):
        """``pieces``: the regular expressions of each piece's characters (one each)."""
        self.case = case
        self.pieces = [re.compile("".join(p), re.DOTALL) for p in pieces]
        self.last_len = len(pieces[-1])

    def fullmatch(self, text: str) -> bool:
        if not self.case:
            text = lower(text)
        first, *middle = self.pieces
        if not middle:
            return first.fullmatch(text) is not None
        *middle, last = middle
        m = first.match(text)
        if m is None:
            return False
        pos = m.end()
        for piece in middle:
            m = piece.search(text, pos)
            if m is None:
                return False
            pos = m.end()
        start = len(text) - self.last_len
        return start >= pos and last.fullmatch(text, start) is not None


def lower(text: str) -> str:
    """``text`` in lower case as SQL's ``lower`` (DuckDB's) gives it: one character each;
    Python's ``'İ'.lower()`` is two (``i`` and a combining dot), so ``'İZMİR' ILIKE 'izmir'``
    was refused as matching nothing (a probe)."""
    return text.replace("İ", "i").lower()


def like_pattern(pattern: str, case: bool = True) -> LikePattern | None:
    """``pattern`` as a ``LikePattern``; None if it ends with a lone backslash."""
    if not case:
        pattern = lower(pattern)
    pieces, i = [[]], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 == len(pattern):
                return None
            pieces[-1].append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            pieces.append([])
        else:
            pieces[-1].append("." if c == "_" else re.escape(c))
        i += 1
    return LikePattern(pieces, case)


def in_domain(value: Any, domain: list) -> bool:
    """``value`` is one of the declared ``domain`` values, compared as the run's lookup does
    (compute._lookup: the column's own type, or both sides as strings: "3" matches 3)."""
    if any(value == d and type(value) is type(d) for d in domain):
        return True
    return as_text(value) in {as_text(d) for d in domain}


def as_text(v: Any) -> str:
    """The text a value is matched by where its type and the column's differ (here and in
    ``compute._lookup``, which must agree: a probe's ``kids = 2.0`` passed this check as
    "2" and then looked for "2.0" in the rows, releasing 0 of 400)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def bin_labels(edges: list[float]) -> list[str]:
    """``[a, b)`` for every bin, the last one closed: ``[a, b]``."""
    out = [f"[{_fmt(a)}, {_fmt(b)})" for a, b in zip(edges[:-1], edges[1:])]
    out[-1] = out[-1][:-1] + "]"
    return out


def validate(kind: str, params: Any, dataset: DatasetMeta) -> Query:
    if kind not in KINDS:
        raise PlanError(f"unknown kind {kind!r}; the aggregates engine serves {', '.join(KINDS)}",
                        {"kind": "unknown kind"})
    if not isinstance(params, dict):
        raise PlanError("params must be a JSON object", {"params": "must be an object"})
    errors: dict[str, str] = {}
    allowed = COMMON_KEYS | KIND_KEYS[kind]
    unknown, n_unknown = unknown_keys(params, allowed)
    for key in unknown:  # a hostile request may send a million
        errors[key[:100]] = f"unknown parameter for {kind}; allowed: {', '.join(sorted(allowed))}"
    if n_unknown > MAX_UNKNOWN_REPORTED:
        errors["params"] = f"{n_unknown} unknown parameters in all"

    # ---- mechanism and privacy budget
    mech = params.get("mechanism")
    if kind == "quantile":
        if mech not in (None, "exponential"):
            errors["mechanism"] = "quantiles always use the exponential mechanism ('exponential')"
        mech = "exponential"
    elif mech is None:
        mech = "laplace"
    elif mech not in MECHANISMS:
        errors["mechanism"] = f"must be one of {', '.join(MECHANISMS)}, got {mech!r}"
        mech = "laplace"
    given = [k for k in ("epsilon", "rho", "accuracy") if params.get(k) is not None]
    budget = ("epsilon", 1.0)
    if not given:
        errors["epsilon"] = "give exactly one of epsilon, rho (gaussian) or accuracy"
    elif len(given) > 1:
        for k in given:
            errors[k] = f"give exactly one of {', '.join(given)}"
    else:
        which = given[0]
        v = params[which]
        if which == "accuracy":
            if kind not in ACCURACY_KINDS:
                errors["accuracy"] = (f"accuracy targets are supported for {', '.join(ACCURACY_KINDS)}; "
                                      f"give {'epsilon' if mech != 'gaussian' else 'rho'} for {kind}")
            elif not isinstance(v, dict) or set(v) != {"halfwidth"}:
                errors["accuracy"] = 'must be {"halfwidth": h} (95% confidence half-width)'
            elif (err := _positive(v["halfwidth"], MAX_HALFWIDTH)):
                errors["accuracy"] = f"halfwidth {err}"
            else:
                budget = ("halfwidth", float(v["halfwidth"]))
        elif which == "epsilon" and mech == "gaussian":
            errors["epsilon"] = "the gaussian mechanism is calibrated by rho (zCDP): give rho or accuracy"
        elif which == "rho" and mech != "gaussian":
            errors["rho"] = f"rho (zCDP) applies to the gaussian mechanism; the {mech} mechanism takes epsilon"
        elif (err := _positive(v, MAX_EPSILON)):  # rho too: rho = MAX_EPSILON is already meaningless
            errors[which] = err
        else:
            budget = (which, float(v))

    # ---- contribution bound
    k = params.get("max_rows_per_unit", 1)
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int):
        errors["max_rows_per_unit"] = f"must be an integer between 1 and {MAX_K}, got {k!r}"
        k = 1
    elif not 1 <= k <= MAX_K:
        errors["max_rows_per_unit"] = f"must be between 1 and {MAX_K}, got {k}"
        k = 1
    elif k != 1 and not dataset.unit_column:
        errors["max_rows_per_unit"] = "this dataset has no privacy-unit column: each row is a unit (k = 1)"
        k = 1

    q = Query(kind=kind, mechanism=mech, budget=budget, k=k)

    # ---- the value column
    if kind in VALUE_KINDS or kind == "histogram":
        if "column" not in params:
            errors["column"] = f"{kind} needs a column"
        else:
            spec, err = _column_spec(dataset, params["column"])
            if err:
                errors["column"] = err
            elif kind in VALUE_KINDS:
                q.bounds = _bounds(spec)
                if q.bounds is None:
                    errors["column"] = (f"{kind} needs a numeric column with declared lower and upper bounds; "
                                        f"{params['column']!r} is {spec.get('type')!r}"
                                        + (" without bounds" if spec.get("type") == "numeric" else ""))
                q.column = params["column"]
                q.integer = spec.get("integer") is True
                d = spec.get("decimals")
                q.decimals = d if isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 15 else None
            else:
                q.column = params["column"]
                _histogram(q, spec, params, errors)
    elif kind == "count" and "column" in params:  # COUNT(column): the rows where it is not null
        spec, err = _column_spec(dataset, params["column"])
        if err:
            errors["column"] = err
        elif spec.get("type") not in ("numeric", "categorical"):
            errors["column"] = (f"a count of the non-null values of a column needs a declared numeric or categorical "
                                f"column; {params['column']!r} is {spec.get('type')!r}")
        else:
            q.column = params["column"]
            q.non_null = [_predicate(0, {"column": q.column, "op": "is_not_null"}, dataset, errors, "column")]
    if kind == "quantile":
        qv = params.get("q", 0.5)
        if not is_number(qv) or not 0 < float(qv) < 1:
            errors["q"] = f"must be a number strictly between 0 and 1, got {qv!r}"
        elif not 1e-4 <= float(qv) <= 1 - 1e-4:
            # OpenDP scores q as a fraction of 10,000 (truncated): 5e-05 became 0, the minimum
            errors["q"] = f"must be from 0.0001 to 0.9999 (OpenDP scores q in 10,000ths), got {qv!r}"
        else:
            q.q = float(qv)
        m = params.get("candidates", DEFAULT_CANDIDATES)
        if isinstance(m, float) and m.is_integer():
            m = int(m)
        if isinstance(m, bool) or not isinstance(m, int) or not 2 <= m <= MAX_CANDIDATES:
            errors["candidates"] = f"must be an integer between 2 and {MAX_CANDIDATES}, got {m!r}"
        else:
            q.candidates = m

    # ---- where
    where = params.get("where")
    if where is not None:
        q.where = where_list(where, dataset, errors)

    # ---- group_by
    gb = params.get("group_by")
    if gb is not None:
        if kind == "histogram":
            errors["group_by"] = "histograms cannot be grouped; use where, or a grouped count"
        else:
            spec, err = _column_spec(dataset, gb)
            if err:
                errors["group_by"] = err
            elif (dom := group_labels(spec)) is None:
                errors["group_by"] = f"group_by needs {GROUP_HINT}; {gb!r} is {_described(spec)}"
            else:
                q.group_by, q.domain = gb, dom
                if kind == "quantile" and q.candidates and len(dom) * (q.candidates + 1) > MAX_SCORE_CELLS:
                    errors["candidates"] = (f"{len(dom)} groups x {q.candidates} candidates is too many; "
                                            f"keep groups x candidates under {MAX_SCORE_CELLS:,}")

    if errors:
        detail = "; ".join(f"{k}: {v}" for k, v in errors.items())
        raise PlanError(f"invalid {kind} request: {detail}", errors)
    return q


def _histogram(q: Query, spec: dict, params: dict, errors: dict) -> None:
    ctype = spec.get("type")
    bins = params.get("bins")
    if ctype == "categorical":
        dom = _domain(spec)
        if dom is None:
            errors["column"] = f"categorical column {q.column!r} has no declared domain"
        elif bins is not None:
            errors["bins"] = "bins apply to numeric columns; a categorical histogram's bins are its declared domain"
        else:
            q.hist = {"type": "categorical", "labels": dom}
        return
    if ctype != "numeric":
        errors["column"] = f"histogram needs a categorical or a bounded numeric column; {q.column!r} is {ctype!r}"
        return
    q.bounds = _bounds(spec)
    if q.bounds is None:
        errors["column"] = f"numeric column {q.column!r} has no declared bounds: it cannot be binned"
        return
    if bins is None:
        errors["bins"] = "a numeric histogram needs bins: a sorted list of edges inside the column's bounds"
        return
    if not isinstance(bins, list) or not 2 <= len(bins) <= MAX_BINS + 1 or not all(is_number(b) for b in bins):
        errors["bins"] = f"must be a list of 2 to {MAX_BINS + 1} finite numbers (bin edges)"
        return
    edges = [float(b) for b in bins]
    if any(a >= b for a, b in zip(edges[:-1], edges[1:])):
        errors["bins"] = "edges must be strictly increasing"
        return
    lo, hi = q.bounds
    if edges[0] < lo or edges[-1] > hi:
        errors["bins"] = f"edges must lie inside the column's bounds [{_fmt(lo)}, {_fmt(hi)}]"
        return
    q.hist = {"type": "numeric", "edges": edges, "labels": bin_labels(edges)}
