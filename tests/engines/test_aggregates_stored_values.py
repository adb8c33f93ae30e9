"""The aggregates engine's exact answers on values as other writers store them (found by a
probe on tables nobody tuned for): integers past 2**53, NaN in a float column declared
categorical, and width bins that must agree with SQL's FLOOR(col / w) for any width."""

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines import plugins
from engines.aggregates import compute, sql
from engines.aggregates import execute as local
from engines.types import DatasetMeta, EngineRequest


def exact(kind, params, table, columns):
    ds = DatasetMeta("t", columns, None, table.num_rows, table.num_rows, 1e-6)
    d = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), ds).details
    return local.exact_parts(d, table, table.num_rows, np.random.default_rng(0))


@pytest.mark.parametrize("arrow_type, big", [(pa.int64(), 2**53 + 1), (pa.int64(), -(2**63)),
                                             (pa.uint64(), 2**64 - 1)])
def test_integers_past_2_53_are_clamped_not_a_crash(arrow_type, big):
    """Arrow's safe cast to float64 refused them (an ArrowInvalid after the read: a failed,
    charged request); every bound is far below, so rounding first changes nothing."""
    table = pa.table({"v": pa.array([1, 2, big], arrow_type)})
    cols = {"v": {"type": "numeric", "lower": 0, "upper": 10, "integer": True}}
    top = 0 if big < 0 else 10
    assert exact("count", {"where": [{"column": "v", "op": "in", "value": [1, 2]}]}, table, cols) == {"count": 2}
    assert exact("count", {"where": [{"column": "v", "op": "not_in", "value": [1]}]}, table, cols) == {"count": 2}
    parts = exact("sum", {"column": "v"}, table, cols)
    assert parts == exact("sum", {"column": "v"}, pa.table({"v": pa.array([1, 2, top], pa.int64())}), cols)
    for kind, extra in (("mean", {}), ("histogram", {"bins": [0, 5, 10]}), ("quantile", {"q": 0.5})):
        exact(kind, {"column": "v", **extra}, table, cols)  # runs


@pytest.mark.parametrize("where", [[{"column": "c", "op": "!=", "value": 1.0}],
                                   [{"column": "c", "op": "not_in", "value": [1.0]}],
                                   [{"not": [{"column": "c", "op": "==", "value": 1.0}]}]])
def test_nan_in_a_float_column_declared_categorical_never_matches(where):
    """A NaN (as numpy or Spark writes it; pandas' Arrow conversion makes it null) is not
    "!= 1" any more than a null is: each form counts the one row of 2.0."""
    table = pa.table({"c": pa.array([1.0, 2.0, float("nan"), None])})
    cols = {"c": {"type": "categorical", "domain": [1.0, 2.0]}}
    assert exact("count", {"where": where}, table, cols) == {"count": 1}


def test_sql_floor_bins_of_a_tenth_agree_with_sql():
    """ggplot2's diamonds, FLOOR(carat / 0.1) * 0.1: 215 diamonds of carat 1.7 fell in the
    group of 1.6 (edges j * w: 17 * 0.1 is 1.7000000000000002)."""
    table = pa.table({"carat": [1.7, 1.7, 1.65, 0.3, 0.29999999999999993]})
    cols = {"carat": {"type": "numeric", "lower": 0, "upper": 6}}
    r = sql.translate("SELECT FLOOR(carat / 0.1) * 0.1 AS c, COUNT(*) AS n FROM t GROUP BY c", {"epsilon": 1.0})
    parts = exact(r.kind, {k: v for k, v in r.params.items() if k != "epsilon"}, table, cols)
    ds = DatasetMeta("t", cols, None, 5, 5, 1e-6)
    labels = plugins.plan("aggregates", EngineRequest(r.kind, r.params), ds).details["group_keys"][0]["labels"]
    got = {round(labels[i], 6): int(c) for i, c in enumerate(parts["0:count"]) if c}
    want: dict = {}
    for x in table.column("carat").to_pylist():
        key = round(math.floor(x / 0.1) * 0.1, 6)
        want[key] = want.get(key, 0) + 1
    assert got == want == {1.7: 2, 1.6: 1, 0.2: 2}  # (0.3 / 0.1 is 2.9999999999999996 in SQL too)


@settings(max_examples=300, deadline=None)
@given(w=st.sampled_from([0.1, 0.2, 0.05, 1.1, 0.3, 1 / 3, 2.5, 0.07, 7.0, 0.01]),
       xs=st.lists(st.floats(0, 50, allow_nan=False), min_size=1, max_size=40),
       ticks=st.lists(st.integers(0, 500), max_size=20))
def test_width_bins_are_sqls_floor_of_x_over_w(w, xs, ticks):
    """Every value lands in the bin whose label SQL's FLOOR(x / w) gives, also values at
    and one float either side of j * w."""
    from engines.aggregates import query

    xs = xs + [v for j in ticks for v in (j * w, math.nextafter(j * w, 0), math.nextafter(j * w, 99)) if 0 <= v <= 50]
    errors: dict = {}
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 0, "upper": 50}}, None, 1, 1, 1e-6)
    key = query._group_key(0, {"column": "x", "width": w}, ds, errors)
    assert not errors
    x = np.asarray(xs)
    codes = compute.bin_codes(x, key["edges"])
    first = math.floor(0 / w)
    want = np.array([math.floor(v / w) - first for v in xs])
    last = len(key["edges"]) - 2  # the last bin is closed: the upper bound itself is in it
    np.testing.assert_array_equal(codes, np.minimum(want, last))


@pytest.mark.parametrize("key", [2**64, 2**53 + 2, -(2**70)])
def test_an_integer_domain_value_past_2_53_matches_its_float_in_a_float_column(key):
    """A float column holding 2**64 with the value declared as the integer 18446744073709551616:
    Arrow refused the integer as a float and the text fallback compared
    "18446744073709551616" with "1.8446744073709552e+19" (the key counted 0 rows of 20).
    Numbers are compared as 64-bit floats, as the schema checks them."""
    table = pa.table({"b": pa.array([float(key)] * 20 + [1.0] * 3, pa.float64())})
    cols = {"b": {"type": "categorical", "domain": [1, key]}}
    assert exact("histogram", {"column": "b"}, table, cols)["count"].tolist() == [3, 20]
    assert exact("count", {"where": [{"column": "b", "op": "in", "value": [key]}]}, table, cols) == {"count": 20}


class _Width(float):
    """A bin width that counts the divisions by it, and stops a search that would run on."""

    def __new__(cls, w):
        out = super().__new__(cls, w)
        out.divisions = 0
        return out

    def __rtruediv__(self, x):
        self.divisions += 1
        assert self.divisions < 1_000, "the edge search went on past 1,000 divisions"
        return float(x) / float(self)


@settings(max_examples=300, deadline=None)
@given(w=st.one_of(st.sampled_from([1e12, 1e308, 1e-300, 5e-324, 0.1, 1 / 3, 3e7]),
                   st.floats(1e-300, 1e300, allow_nan=False, allow_infinity=False)),
       j=st.integers(-(2**40), 2**40))
def test_a_width_bins_edge_is_found_in_a_few_steps_for_any_width(w, j):
    """A probe's FLOOR(wage / 1e12) (bounds [0, 5000]) held a web thread for good: the edge
    of bin 0 was searched one float at a time from 0 down, and x / 1e12 is -0.0 for every
    negative x of magnitude under about 2.5e-312. The edge is the least float x with
    x / w >= j, found by bisection, whatever the width."""
    from engines.aggregates import query

    if not math.isfinite(j * w):
        return
    width = _Width(w)
    edge = query._floor_edge(j, width)
    assert edge / w >= j and math.nextafter(edge, -math.inf) / w < j
    assert width.divisions <= 300


def test_a_huge_width_on_a_small_range_is_one_bin_planned_at_once():
    """The probe's query end to end: planned (in a thread, so that a search that runs on
    fails the test instead of holding it) into one bin holding every value."""
    import threading

    from engines.aggregates import query

    ds = DatasetMeta("t", {"wage": {"type": "numeric", "lower": 0, "upper": 5000}}, None, 1, 1, 1e-6)
    keys: list = []
    planner = threading.Thread(target=lambda: keys.extend(
        query._group_key(0, {"column": "wage", "width": w}, ds, {}) for w in (1e12, 1e308)), daemon=True)
    planner.start()
    planner.join(60)
    assert not planner.is_alive(), "planning a width of 1e12 ran on"
    for key in keys:
        assert key["labels"] == [0] and len(key["edges"]) == 2
        assert compute.bin_codes(np.array([0.0, 1.0, 4999.5, 5000.0]), key["edges"]).tolist() == [0, 0, 0, 0]


def test_a_boolean_column_declared_integer_0_1_groups_and_counts_its_values():
    """A probe's table: stored as booleans, declared numeric, integer in [0, 1]. A sum and a
    WHERE read 0 / 1, but GROUP BY and COUNT(DISTINCT) compared "true" with "1" and found no
    row: [[0, 0], [1, 0]] and 0 released (and charged) where 200 / 100 and 2 were true."""
    table = pa.table({"f": pa.array([i % 3 == 0 for i in range(300)] + [None])})
    cols = {"f": {"type": "numeric", "lower": 0, "upper": 1, "integer": True}}
    ds = DatasetMeta("t", cols, None, table.num_rows, table.num_rows, 1e-6)
    for text, want in [("SELECT f, COUNT(*) AS c FROM t GROUP BY f", [[0, 200], [1, 100]]),
                       ("SELECT COUNT(DISTINCT f) AS d FROM t", [[2]]),
                       ("SELECT f, SUM(f) AS s FROM t WHERE f = 1 GROUP BY f", [[0, 0], [1, 100]])]:
        r = sql.translate(text, {"epsilon": 1e6})
        req = EngineRequest(r.kind, r.params)
        res = plugins.run("aggregates", req, ds, table, plugins.plan("aggregates", req, ds), lambda u: None).result
        got = [[*row[:-1], round(row[-1])] for row in res["rows"]]
        assert got == want, (text, res["rows"])


def test_a_number_literal_on_a_text_column_matches_the_rows_its_check_accepted():
    """A probe's CSV column ``kids`` (domain "0", "1", "2", "3+"): ``kids = 2.0`` passed the
    domain check as "2", then the run looked for "2.0" and released 0 where 400 rows hold
    "2" (``<> 2.0``: 1,000 of 600); a domain declared as floats on text grouped nothing."""
    kids = ["2"] * 400 + ["0"] * 300 + ["1"] * 200 + ["3+"] * 100
    table = pa.table({"kids": pa.array(kids), "g": pa.array(["1", "2", "3", "2"] * 250)})
    cols = {"kids": {"type": "categorical", "domain": ["0", "1", "2", "3+"]},
            "g": {"type": "categorical", "domain": [1.0, 2.0, 3.0]}}
    count = lambda where: exact("count", {"where": where}, table, cols)["count"]  # noqa: E731
    assert count([{"column": "kids", "op": "==", "value": 2.0}]) == 400
    assert count([{"column": "kids", "op": "!=", "value": 2.0}]) == 600
    assert count([{"column": "kids", "op": "in", "value": [1.0, 2.0]}]) == 600
    assert exact("count", {"group_by": "g"}, table, cols)["count"].tolist() == [250, 500, 250]
