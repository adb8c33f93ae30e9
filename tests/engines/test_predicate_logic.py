"""The aggregates engine's WHERE in SQL's three-valued logic, against sqlite3 on the same
rows: random nested AND / OR / NOT over numeric and text columns with nulls. A null made
every predicate under a NOT unknown, so ``NOT (age > 3 AND site = 'north')`` dropped the
rows where age is 1 and site is null (SQL keeps them: FALSE AND UNKNOWN is FALSE)."""

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
