"""Numeric predicates compare exactly: an integer column as integers, a float column as
floats, each against the literal's exact value, as Python compares an int with a float.
Compared in float64, ``acct == 2**53 + 1`` counted the rows holding 2**53 too and
``u > 2**63`` (uint64) missed half the rows above it: wrong counts, charged, with 95%
intervals far from the truth."""

from __future__ import annotations

import math
import operator
from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from engines import plugins
from engines.aggregates.compute import predicate_mask
from engines.types import DatasetMeta, EngineRequest

OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge}
P53, P63 = 2**53, 2**63
COLUMNS = {
    "i64": (pa.int64(), [P53 - 1, P53, P53 + 1, P53 + 2, -P53 - 1, 0, -(2**63), P63 - 1, None]),
    "u64": (pa.uint64(), [P63 - 1, P63, P63 + 1, P63 + 2, 2**64 - 1, 0, P53 + 1, None]),
    "f64": (pa.float64(), [float(P53), float(P53 + 2), 2.5, -0.0, 1e300, -1e300, float("nan"), None]),
    "i8": (pa.int8(), [-128, 127, 0, 3, None]),
    "d20": (pa.decimal128(20, 0), [Decimal(P53), Decimal(P53 + 1), Decimal(-P53 - 1), Decimal(0), None]),
    "d4": (pa.decimal128(4, 2), [Decimal("1.10"), Decimal("2.25"), Decimal("-3.00"), Decimal("0.00"),
                                 Decimal("99.99"), Decimal("0.01"), None]),
}
NEAR = [P53 - 1, P53, P53 + 1, P53 + 2, P53 + 3, P63 - 1, P63, P63 + 1, 2**64 - 1, 2**64, -P53 - 1, -(2**63) - 1,
        0, 3, 127, 128, -129]
LITERALS = st.one_of(st.sampled_from(NEAR), st.sampled_from(NEAR).map(float),
                     st.sampled_from([2.5, -0.0, 0.5, 126.5, 1e300, float(P53) + 2.0, 1.1, 2.25, 0.005, 1e-300, 99.99]),
                     st.integers(-(2**65), 2**65), st.floats(allow_nan=False, allow_infinity=False))


def table(name: str, seed: int) -> tuple[pa.Table, list]:
    typ, pool = COLUMNS[name]
    rng = np.random.default_rng(seed)
    values = [pool[i] for i in rng.integers(len(pool), size=30)]
    return pa.table({"x": pa.array(values, type=typ)}), values


def known(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def as_written(v, literal):
    """A decimal column is compared with the literal as written (a float as its shortest
    decimal: 1.1, not the binary 1.100000000000000088...), as its domain values are."""
    return Decimal(repr(literal)) if isinstance(v, Decimal) and isinstance(literal, float) else literal


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(COLUMNS)), st.integers(0, 3), st.sampled_from(sorted(OPS)), LITERALS)
def test_a_comparison_is_exact_as_python_s(name, seed, op, literal):
    t, values = table(name, seed)
    got = predicate_mask(t, [{"column": "x", "type": "numeric", "op": op, "value": literal}])
    want = [known(v) and OPS[op](v, as_written(v, literal)) for v in values]
    assert got.tolist() == want, (name, op, literal)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(COLUMNS)), st.integers(0, 3), st.sampled_from(["in", "not_in"]),
       st.lists(LITERALS, min_size=1, max_size=4))
def test_membership_is_exact_as_python_s(name, seed, op, literals):
    t, values = table(name, seed)
    got = predicate_mask(t, [{"column": "x", "type": "numeric", "op": op, "value": literals}])
    want = [known(v) and (any(v == as_written(v, x) for x in literals) == (op == "in")) for v in values]
    assert got.tolist() == want, (name, op, literals)


def test_the_probe_s_counts_through_the_engine():
    """1,000 rows each of 2**53, 2**53 + 1 and 2**53 + 2 (a 64-bit id, a nanosecond epoch):
    the counts released at epsilon 100 (noise scale 0.01) are the exact ones."""
    ds = DatasetMeta(name="ids", columns={"acct": {"name": "acct", "type": "numeric", "lower": 0, "upper": 2**54,
                                                   "integer": True}},
                     unit_column=None, n_rows=3000, n_units=3000, delta=1e-6)
    t = pa.table({"acct": pa.array([P53] * 1000 + [P53 + 1] * 1000 + [P53 + 2] * 1000, type=pa.int64())})
    released = {}
    for op in OPS:
        req = EngineRequest("count", {"epsilon": 100.0, "where": [{"column": "acct", "op": op, "value": P53 + 1}]})
        plan = plugins.plan("aggregates", req, ds)
        released[op] = round(plugins.run("aggregates", req, ds, t, plan, lambda p: None).result["value"])
    assert released == {"==": 1000, "!=": 2000, "<": 1000, "<=": 2000, ">": 1000, ">=": 2000}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(COLUMNS)), st.sampled_from(sorted(COLUMNS)), st.integers(0, 3), st.integers(0, 3),
       st.sampled_from(sorted(OPS)))
def test_two_columns_compare_exactly_as_python_s(left, right, seed_l, seed_r, op):
    """``WHERE a op b`` on two numeric columns of any pair of types: as Python compares the
    two numbers (an int64 against a uint64 or a float64 past 2**53 too), a null or NaN on
    either side unknown; a decimal against a float as float64."""
    (ta, va), (tb, vb) = table(left, seed_l), table(right, seed_r)
    t = pa.table({"a": ta.column("x"), "b": tb.column("x")})
    got = predicate_mask(t, [{"column": "a", "type": "numeric", "op": op, "value": {"column": "b"}}])

    def pair(x, y):
        if isinstance(x, Decimal) and isinstance(y, float) or isinstance(y, Decimal) and isinstance(x, float):
            return float(x), float(y)
        return x, y
    want = [known(x) and known(y) and OPS[op](*pair(x, y)) for x, y in zip(va, vb)]
    assert got.tolist() == want, (left, right, op)
    # NOT (a op b) holds exactly where both are known and a op b does not
    got_not = predicate_mask(t, [{"not": [{"column": "a", "type": "numeric", "op": op, "value": {"column": "b"}}]}])
    assert got_not.tolist() == [known(x) and known(y) and not w for x, y, w in zip(va, vb, want)]
