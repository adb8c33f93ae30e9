"""A sum's exact value moves by at most its sensitivity k * B between a table and its
neighbour, also where the neighbour's row count crosses a power of two (found by a probe:
the truncation grid was scaled to the rows the run found, so one more row coarsened every
other row's value; 8 x the sensitivity over at 4M rows, growing as n^2)."""

import math

import numpy as np
import pyarrow as pa
import pytest

from engines import plugins
from engines.aggregates import compute
from engines.aggregates import execute as local
from engines.types import DatasetMeta, EngineRequest

B = 1000.0


def _plan(kind, n_rows, unit_column=None, k=None):
    cols = {"x": {"type": "numeric", "lower": -B, "upper": B}}
    if unit_column:
        cols[unit_column] = {"type": "numeric", "lower": 0, "upper": 2**40, "integer": True}
    params = {"epsilon": 1.0, "column": "x", **({"max_rows_per_unit": k} if k else {})}
    ds = DatasetMeta("t", cols, unit_column, n_rows, n_rows, 1e-6)
    return local.as_planned(plugins.plan("aggregates", EngineRequest(kind, params), ds).details)


def _exact(d, table):
    n = local.grid_rows(d)
    return local.exact_values(d, local.exact_parts(d, table, n, np.random.default_rng(0)), n)["sum"]


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("log_rows", [12, 16, 18])
def test_one_more_row_across_a_power_of_two_moves_a_sum_by_at_most_its_sensitivity(kind, log_rows):
    """The probe's table: 2^L rows of -(0.5 + one grid step of the old, finer grid), the
    neighbour one row of B more. Every row's value sits just past a point of the coarser
    grid, so re-truncating all of them moved the sum by n / 2^(e+1)."""
    n = 2**log_rows
    d = _plan(kind, n)
    old_e = compute.grid_exponent(n, d["radius"] if kind == "mean" else B)
    v = -(0.5 + 2.0**-old_e) if kind == "sum" else d["center"] - (0.5 + 2.0**-old_e)
    table = pa.table({"x": np.full(n, v)})
    neighbour = pa.concat_tables([table, pa.table({"x": [B]})])
    sensitivity = d["components"]["sum"]["sensitivity"]
    assert abs(_exact(d, neighbour) - _exact(d, table)) <= sensitivity
    # the plan, not the rows, sets the grid: a neighbour with a unit fewer sums on it too
    assert abs(_exact(d, table.slice(1)) - _exact(d, table)) <= sensitivity


def test_the_grid_is_the_plans_whatever_rows_the_run_finds():
    d = _plan("sum", 1000)
    assert local.grid_rows(d) == 1001
    values = np.full(10, 0.1)
    assert compute.grid_sum(values.copy(), B, local.grid_rows(d)) == compute.grid_sum(values.copy(), B, 1001)
    assert math.isclose(compute.exact_sum(values.copy(), B, 1001), 1.0, rel_tol=1e-7)


def test_a_unit_of_k_rows_more_fits_the_plans_grid_and_more_rows_are_refused():
    d = _plan("sum", 100, unit_column="u", k=3)
    assert local.grid_rows(d) == 103
    ok = pa.table({"x": np.full(103, 1.0), "u": np.arange(103)})
    assert _exact(d, ok) == 103.0
    too_many = pa.table({"x": np.full(104, 1.0), "u": np.arange(104)})
    with pytest.raises(ValueError, match="more than the plan's bound"):
        _exact(d, too_many)
