"""Hypothesis strategies for hostile JSON: every value a JSON parser can hand the service
(and a few it cannot, but Python callers can), biased towards the values that break code:
huge and tiny numbers, integers past float range, NaN and infinity (1e999 parses to inf),
their spellings as strings, NUL, lone surrogates (``"\\ud800"`` is legal JSON), unicode,
deep nesting, long lists."""

from __future__ import annotations

import math

from hypothesis import strategies as st

FLOAT_EDGES = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-12, 1e-9, 0.5, 1.0, 1.5, 2.0, 1e9, 1e12,
               1e300, 1.7976931348623157e308, -1.0, -1e300, math.inf, -math.inf, math.nan]
INT_EDGES = [0, 1, -1, 2, 1000, 1001, 2**31, 2**53 + 1, 2**63, 2**64, 10**9, 10**9 + 1, 10**30, 10**400,
             -(10**400)]
STRING_EDGES = ["", " ", "NaN", "nan", "Infinity", "-Infinity", "inf", "1e999", "-0", "0x10", "1_000", "1e-400",
                "\x00", "a\x00b", "\ud800", "\udfff", "\ud83d\ude00", "é", "\u202e", "=1+1", "@SUM(A1)", "-2+3",
                "../../etc/passwd", "null", "true", "[]", "{}"]

floats = st.sampled_from(FLOAT_EDGES) | st.floats()
integers = st.sampled_from(INT_EDGES) | st.integers()
# st.text() leaves out surrogates: add them (the JSON escape \udXXX produces one).
texts = (st.sampled_from(STRING_EDGES)
         | st.text(max_size=12)
         | st.text(st.characters(codec=None, categories=["Cs", "Cc", "Zs", "Lo", "So"]), max_size=6))
scalars = st.none() | st.booleans() | floats | integers | texts


def json_trees(keys=texts, leaves=scalars, max_leaves: int = 40):
    """Arbitrary JSON (plus non-finite floats) with the given dict keys and leaves."""
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6),
        max_leaves=max_leaves,
    )


def deeply_nested(inner, max_depth: int = 300):
    """``inner`` wrapped in 1..max_depth lists or one-key dicts (far past any sane limit).
    Deeper values (tests do 100,000 levels by hand) would break Hypothesis's own printer
    of examples, which recurses."""
    @st.composite
    def build(draw):
        value = draw(inner)
        depth = draw(st.integers(1, max_depth))
        as_list = draw(st.booleans())
        key = draw(st.sampled_from(["event", "events", "kind", "where", "a"]))
        for _ in range(depth):
            value = [value] if as_list else {key: value}
        return value
    return build()


# ------------------------------------------------------------------ aggregates parameters

hostile_numbers = st.sampled_from([0, 18, 90, 50.5, -0.0, 5e-324, -1e308, 1e308, 2**63, 10**30, -(2**53) - 1]) | floats
hostile_categories = st.sampled_from(["north", "é", "", "1", "1.5", "true", "\x00", "\ud800", "NaN", 1, 1.5, 10,
                                       True, False, 0, -0.0, 2**63]) | texts


@st.composite
def valid_predicates(draw, numeric: list[str], categorical: list[str]):
    from engines.aggregates import params as agg

    if draw(st.booleans()):
        column, op = draw(st.sampled_from(numeric)), draw(st.sampled_from(agg.OPS))
        scalar = hostile_numbers
    else:
        column, op = draw(st.sampled_from(categorical)), draw(st.sampled_from(agg.EQUALITY_OPS))
        scalar = hostile_categories
    value = draw(st.lists(scalar, min_size=1, max_size=6)) if op in ("in", "not_in") else draw(scalar)
    return {"column": column, "op": op, "value": value}


@st.composite
def plausible_params(draw, numeric: list[str], categorical: list[str], histogram_numeric=("age", 18, 90)):
    """(kind, params) for the aggregates engine that mostly pass validation, with hostile
    values where values are allowed (predicate values, bins, q, budgets, accuracy), so
    that the planner and the run get fuzzed, not only the validation.
    ``histogram_numeric`` is a bounded numeric column (name, lower, upper) to bin."""
    from engines.aggregates import params as agg

    kind = draw(st.sampled_from(agg.KINDS))
    params = {}
    gaussian = kind != "quantile" and draw(st.integers(0, 3)) == 0
    if gaussian:
        params["mechanism"] = "gaussian"
    if kind in agg.ACCURACY_KINDS and draw(st.integers(0, 3)) == 0:
        params["accuracy"] = {"halfwidth": draw(st.sampled_from([0.5, 10.0, 1e-9, 1e12]) | floats)}
    else:
        params["rho" if gaussian else "epsilon"] = draw(st.sampled_from([0.1, 1.0, 1e-3, 5.0, 1e-12, 1e6]) | floats)
    if kind in agg.VALUE_KINDS:
        params["column"] = draw(st.sampled_from(numeric))
    elif kind == "histogram":
        name, lo, hi = histogram_numeric
        params["column"] = draw(st.sampled_from([name, *categorical]))
        if params["column"] == name:
            edges = draw(st.lists(st.floats(lo, hi) | st.sampled_from([lo, hi]), min_size=2, max_size=8))
            params["bins"] = sorted(set(edges))
    if kind == "quantile":
        params["q"] = draw(st.sampled_from([0.5, 0.01, 0.99, 1e-300, 1 - 1e-16]) | st.floats(0, 1))
        params["candidates"] = draw(st.sampled_from([2, 3, 1024]) | st.integers(2, 2000))
    if draw(st.booleans()):
        params["where"] = draw(st.lists(valid_predicates(numeric, categorical), max_size=4))
    if kind != "histogram" and draw(st.booleans()):
        params["group_by"] = draw(st.sampled_from(categorical))
    if draw(st.integers(0, 2)) == 0:
        params["max_rows_per_unit"] = draw(st.integers(1, 5))
    return kind, params


# ------------------------------------------------------------------------------ events

def _event_fields():
    from accounting import events as ev

    return ev.KINDS, ev._FIELDS


EVENT_KINDS, _FIELDS = _event_fields()
EVENT_FIELDS = sorted({f for fs in _FIELDS.values() for f in fs})
numbers = floats | integers


def mostly(likely, rarely, odds: int = 4):
    """``likely`` (odds - 1 in odds), else ``rarely``: one_of would drop repeated branches."""
    return st.integers(0, odds - 1).flatmap(lambda i: likely if i else rarely)


sane_numbers = mostly(st.sampled_from([0.01, 0.1, 0.5, 1, 2, 3, 10, 1e-6, 1e-9, 0.999, 1000]), numbers)


@st.composite
def events(draw, depth=0, values=None, kinds=None, junk=10):
    """Event-shaped JSON: mostly the right keys, hostile values, sometimes nested up to 40
    deep (MAX_DEPTH is 16), sometimes (1 in ``junk``) with an extra or a missing field."""
    values = numbers | scalars if values is None else values
    kinds = st.sampled_from(EVENT_KINDS) | texts if kinds is None else kinds
    kind = draw(kinds)
    if kind in ("self_composed", "composed") and depth < 40 and not rarely(draw, 4):
        if kind == "self_composed":
            out = {"kind": kind, "event": draw(events(depth + 1, values, kinds, junk)), "count": draw(values)}
        else:
            out = {"kind": kind, "events": draw(st.lists(events(depth + 1, values, kinds, junk), max_size=3))}
    else:
        fields = _FIELDS.get(kind, set()) if isinstance(kind, str) else set()
        out = {"kind": kind, **{f: draw(values) for f in sorted(fields) if not rarely(draw, 5)}}
    if rarely(draw, junk):
        out[draw(st.sampled_from(EVENT_FIELDS) | texts)] = draw(scalars)
    if rarely(draw, 2 * junk):
        out.pop("kind", None)
    return out


def rarely(draw, odds: int) -> bool:
    """True about once in ``odds`` draws (a middle value: Hypothesis favours the ends of a range)."""
    return draw(st.integers(0, odds - 1)) == odds // 2


def plausible_events():
    """Events that often parse (sane numbers and real kinds first), to get past the parser
    to the gate, the ledger and the audit trail."""
    return events(values=sane_numbers, kinds=mostly(st.sampled_from(EVENT_KINDS), texts, 10), junk=40)
