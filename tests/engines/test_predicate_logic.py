"""The aggregates engine's WHERE in SQL's three-valued logic, against sqlite3 on the same
rows: random nested AND / OR / NOT over numeric and text columns with nulls. A null made
every predicate under a NOT unknown, so ``NOT (age > 3 AND site = 'north')`` dropped the
rows where age is 1 and site is null (SQL keeps them: FALSE AND UNKNOWN is FALSE). IS [NOT]
NULL among them."""

from __future__ import annotations

import sqlite3

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from engines.aggregates.compute import predicate_mask

AGE = [None, 1.0, 3.0, 5.0, float("nan")]  # NaN: no value either (the engine's and the import's rule)
SITE = [None, "north", "south"]
N = 40


def rows(seed: int):
    rng = np.random.default_rng(seed)
    return [(AGE[rng.integers(len(AGE))], SITE[rng.integers(len(SITE))]) for _ in range(N)]


atoms = st.one_of(
    st.builds(lambda op, v: ({"column": "age", "type": "numeric", "op": op, "value": v}, f"age {op} {v}"),
              st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), st.sampled_from([1.0, 3.0, 4.0])),
    st.builds(lambda op, v: ({"column": "site", "type": "categorical", "op": op, "value": v},
                             f"site {'=' if op == '==' else '!='} '{v}'"),
              st.sampled_from(["==", "!="]), st.sampled_from(["north", "south"])),
    st.builds(lambda op, vs: ({"column": "age", "type": "numeric", "op": op, "value": vs},
                              f"age {'IN' if op == 'in' else 'NOT IN'} ({', '.join(map(str, vs))})"),
              st.sampled_from(["in", "not_in"]), st.lists(st.sampled_from([1.0, 3.0, 5.0]), min_size=1, max_size=2)),
    # IS [NOT] NULL: true or false, never unknown (a NaN is null, as sqlite stores it)
    st.builds(lambda col, op: ({"column": col, "type": "numeric" if col == "age" else "categorical", "op": op,
                                "value": None}, f"{col} IS {'NOT ' if op == 'is_not_null' else ''}NULL"),
              st.sampled_from(["age", "site"]), st.sampled_from(["is_null", "is_not_null"])),
)


def _and(parts):
    return [p for part, _ in parts for p in part], " AND ".join(f"({s})" for _, s in parts)


def extend(inner):
    return st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(_and),
        st.lists(inner, min_size=2, max_size=3).map(
            lambda parts: ([{"or": [part for part, _ in parts]}], " OR ".join(f"({s})" for _, s in parts))),
        inner.map(lambda part: ([{"not": part[0]}], f"NOT ({part[1]})")),
    )


wheres = st.recursive(atoms.map(lambda a: ([a[0]], a[1])), extend, max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(wheres, st.integers(0, 10))
def test_where_matches_sqlite(where, seed):
    plan, sql = where
    data = rows(seed)
    table = pa.table({"age": pa.array([a for a, _ in data], pa.float64(), from_pandas=False),
                      "site": pa.array([s for _, s in data], pa.string())})
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (i INTEGER, age REAL, site TEXT)")
    # NaN is no value: sqlite3 stores it as NULL, as the engine reads it
    db.executemany("INSERT INTO t VALUES (?, ?, ?)",
                   [(i, None if a is None or a != a else a, s) for i, (a, s) in enumerate(data)])
    expected = sorted(i for (i,) in db.execute(f"SELECT i FROM t WHERE {sql}"))
    got = np.flatnonzero(predicate_mask(table, plan)).tolist()
    assert got == expected, sql


def test_not_of_a_false_and_an_unknown_holds():
    table = pa.table({"age": pa.array([1.0, 5.0, None]), "site": pa.array([None, None, "north"])})
    where = [{"not": [{"column": "age", "type": "numeric", "op": ">", "value": 3.0},
                      {"column": "site", "type": "categorical", "op": "==", "value": "north"}]}]
    assert predicate_mask(table, where).tolist() == [True, False, False]


def test_a_value_is_matched_in_what_the_column_holds_not_truncated_or_respelled():
    """A probe's silent wrong answers: 2.5 against an integer column was made 2 by Arrow and
    counted the 2s; 1.5 against a decimal column was compared as text ("1.50" vs "1.5") and
    matched nothing; a date written "1970-01-01 00:00:00" matched none of its timestamps."""
    from decimal import Decimal

    from engines.aggregates.compute import category_codes

    table = pa.table({"r": pa.array([1, 2, 2, 3], pa.int64()),
                      "d": pa.array([Decimal("1.50"), Decimal("2.50"), Decimal("2.50"), Decimal("3.00")],
                                    pa.decimal128(10, 2)),
                      "t": pa.array([0, 0, 10**6, 10**6], pa.timestamp("us"))})

    def rows(column, op, value, typ="categorical"):
        return np.flatnonzero(predicate_mask(table, [{"column": column, "type": typ, "op": op, "value": value}])).tolist()

    assert rows("r", "==", 2.5) == [] and rows("r", "!=", 2.5) == [0, 1, 2, 3] and rows("r", "in", [2.5, 3]) == [3]
    assert rows("r", "==", 2.0) == [1, 2]
    assert rows("d", "==", 1.5) == [0] and rows("d", "==", 2.5) == [1, 2] and rows("d", "in", [3, 1.505]) == [3]
    assert rows("t", "==", "1970-01-01 00:00:00") == [0, 1] and rows("t", "==", "1970-01-01 00:00:01.000000") == [2, 3]
    assert category_codes(table, "r", [1, 2.5, 3]).tolist() == [0, -1, -1, 2]
    assert category_codes(table, "d", [1.5, 2.5, 3]).tolist() == [0, 1, 1, 2]
