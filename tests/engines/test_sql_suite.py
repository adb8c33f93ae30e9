"""The SQL query suite (tests/engines/sql_suite.py) at the engine level: every query's
documented outcome holds: at a high epsilon an answer whose 95% intervals hold the true
values (DuckDB on the raw table), or a named 400."""

from __future__ import annotations

import functools
import math

import pyarrow as pa
import pytest

from engines import plugins
from engines.aggregates import sql as sqlplan
from engines.types import DatasetMeta, EngineRequest, PlanError

from .sql_suite import ANSWER, CASES

duckdb = pytest.importorskip("duckdb")

EPSILON = 1e5  # high: the noise is far below the values, the intervals still honest


@functools.cache
def _tables():
    from .sql_suite import tables

    out = {}
    for name, (frame, schema, unit) in tables().items():
        meta = DatasetMeta(name, schema, unit, len(frame), len(frame), 1e-6)
        out[name] = (frame, pa.Table.from_pandas(frame, preserve_index=False), meta)
    return out


def run_query(case, epsilon=EPSILON):
    """(columns, rows, ci95 rows) of the engine's answer, in one shape for every kind."""
    frame, table, meta = _tables()[case.table]
    req = sqlplan.translate(case.sql, {"epsilon": epsilon})
    request = EngineRequest(req.kind, req.params)
    plan = plugins.plan("aggregates", request, meta)
    result = plugins.run("aggregates", request, meta, table, plan, lambda u: None).result
    return table_of(result), plan


def table_of(result: dict):
    if result["kind"] == "query":
        return result["columns"], result["rows"], result["ci95"]
    if "groups" in result:
        return ([result["group_by"], "value"], [[g["key"], g["value"]] for g in result["groups"]],
                [[None, g["ci95"]] for g in result["groups"]])
    return ["value"], [[result["value"]]], [[result["ci95"]]]


def truth_of(case):
    frame, _, _ = _tables()[case.table]
    con = duckdb.connect()
    con.register(case.table, frame)
    return [list(r) for r in con.execute(case.truth or case.sql).fetchall()]


WIDEN = 4  # each 95% interval misses 5% of the time by design: the per-cell check widens it


def _close(value, lo, hi, truth, widen=WIDEN) -> bool:
    """``truth`` in the interval ``[lo, hi]`` stretched ``widen`` times around the answer: for
    Laplace noise P(|noise| > 4 b ln 20) = 0.05^4, so the suite's ~200 cells never miss by chance;
    ``coverage`` below counts the plain 95% intervals."""
    tol = 1e-6 * max(1.0, abs(truth))
    return value - widen * (value - lo) - tol <= truth <= value + widen * (hi - value) + tol


COVERAGE: list[bool] = []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_query_has_its_documented_outcome(case):
    if case.expect != ANSWER:
        where, name = case.expect
        if where == "sql":
            with pytest.raises(sqlplan.SqlError) as e:
                run_query(case)
            assert e.value.part == name, e.value.message
            assert e.value.message  # says what would work
        else:
            with pytest.raises(PlanError) as e:
                run_query(case)
            assert name in e.value.errors, e.value.errors
        return
    (columns, rows, cis), plan = run_query(case)
    assert plan.details["cost"]["epsilon"] <= EPSILON * (1 + 1e-12)  # one request: the costs composed
    truth = truth_of(case)
    n_keys = sum(1 for ci in (cis[0] if cis else []) if ci is None)
    ordered = "ORDER BY" in case.sql.upper()
    if n_keys == 0:  # one row
        assert len(rows) == 1 and len(truth) == 1
        pairs = [(rows[0], cis[0], truth[0])]
    else:
        got = {tuple(_key(v) for v in r[:n_keys]): (r, ci) for r, ci in zip(rows, cis)}
        want = [t for t in truth if all(v is not None for v in t[:n_keys])]
        if ordered or "HAVING" in case.sql.upper() or "LIMIT" in case.sql.upper():
            assert [tuple(_key(v) for v in r[:n_keys]) for r in rows] == [tuple(_key(v) for v in t[:n_keys])
                                                                          for t in want], (rows, want)
        pairs = [(*got[tuple(_key(v) for v in t[:n_keys])], t) for t in want]
    for row, ci, t in pairs:
        for j in range(n_keys, len(columns)):
            assert ci[j] is not None, f"{columns[j]} has no interval"
            COVERAGE.append(_close(row[j], ci[j][0], ci[j][1], float(t[j]), widen=1))
            assert _close(row[j], ci[j][0], ci[j][1], float(t[j])), (columns[j], row[j], ci[j], t[j])


def _key(v):
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def test_the_suite_is_big_enough():
    assert len(CASES) >= 60
    assert sum(c.expect == ANSWER for c in CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def test_several_aggregates_cost_what_one_request_of_that_epsilon_does():
    case = next(c for c in CASES if c.id == "multi-grouped")
    _, plan = run_query(case, epsilon=1.0)
    assert plan.event["kind"] == "composed" and len(plan.event["events"]) == 3
    assert math.isclose(plan.details["cost"]["epsilon"], 1.0, rel_tol=1e-9)


def test_the_plain_95_percent_intervals_hold_the_truth_about_as_often_as_they_say():
    """Runs after the suite (same module): of its answered cells, at least 85% inside the plain
    interval (95% nominal; intervals of noise this small are a few units of the last digit)."""
    if len(COVERAGE) < 50:
        pytest.skip("run with the whole suite")
    assert sum(COVERAGE) / len(COVERAGE) >= 0.85, f"{sum(COVERAGE)}/{len(COVERAGE)}"
