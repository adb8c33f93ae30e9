"""MST keeps every declaration of the schema and beats the independent floor (issue 24):
integer and decimal grids at any range, ``nullable: false``, the declared bounds and
domains; the private compression of measured cells; the tree partition of a skewed column;
the plan charges every one-way histogram."""

import json
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines import plugins
from engines.aggregates.noise import Noise
from engines.synthesis import encoding, mst, report
from engines.types import DatasetMeta, EngineRequest, PlanError
from tests.engines.synthesis_helpers import synthesize

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _loans(n: int, seed: int = 0) -> pd.DataFrame:
    """Loans: amounts in thousands (some not), a rate on a 0.01 grid tied to the grade,
    a skewed income, a nullable employment length."""
    rng = np.random.default_rng(seed)
    grade = rng.choice(list("ABCD"), n, p=[0.3, 0.35, 0.25, 0.1])
    g = pd.Series(grade).map({"A": 0, "B": 1, "C": 2, "D": 3}).to_numpy()
    amount = np.where(rng.random(n) < 0.8, rng.integers(1, 41, n) * 1000, rng.integers(1000, 40001, n))
    rates = np.array([6.08, 7.34, 10.9, 12.62, 15.05, 17.09, 19.42, 21.45])
    rate = rates[np.clip(2 * g + rng.integers(0, 2, n), 0, 7)]
    income = np.round(np.exp(rng.normal(11 + 0.15 * (3 - g), 0.5, n)), 2)
    emp = np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 11, n).astype(float))
    return pd.DataFrame({"amount": amount, "rate": rate, "grade": grade, "income": np.clip(income, 0, 2_000_000),
                         "emp": emp})


SCHEMA = {
    "amount": {"type": "numeric", "lower": 0, "upper": 40_000, "integer": True, "nullable": False},
    "rate": {"type": "numeric", "lower": 5, "upper": 35, "decimals": 2, "nullable": False},
    "grade": {"type": "categorical", "domain": list("ABCDEFG"), "nullable": False},
    "income": {"type": "numeric", "lower": 0, "upper": 2_000_000, "decimals": 2, "nullable": False},
    "emp": {"type": "numeric", "lower": 0, "upper": 10, "integer": True},
}


def _run(df: pd.DataFrame, schema: dict, epsilon: float, rows: int | None = None, method: str = "mst"):
    meta = DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    return synthesize(df, meta, {"method": method, "epsilon": epsilon, "rows": rows or len(df), "holdout_fraction": 0})


@pytest.fixture(scope="module")
def loans():
    df = _loans(4000)
    syn, plan, release = _run(df, SCHEMA, 2.0)
    return df, syn, plan, release


def assert_declarations_hold(syn) -> None:
    """SCHEMA's declarations, exactly: non-null, integer, the 0.01 grid, bounds, domain."""
    for c in ("amount", "rate", "grade", "income"):
        assert syn[c].notna().all(), c  # nullable: false
    assert (syn["amount"] == np.round(syn["amount"])).all()  # integer at a range of 40,001 integers
    for c in ("rate", "income"):
        assert np.allclose(np.round(syn[c], 2), syn[c], atol=1e-9, rtol=0)  # on the 0.01 grid
    e = syn["emp"].dropna()
    assert (e == np.round(e)).all()
    for c, spec in SCHEMA.items():
        if spec["type"] == "numeric":
            assert syn[c].min() >= spec["lower"] and syn[c].max() <= spec["upper"]
    assert set(syn["grade"]) <= set("ABCDEFG")


def test_every_declaration_holds_exactly(loans):
    df, syn, _, _ = loans
    assert_declarations_hold(syn)
    assert syn["emp"].isna().any()  # a nullable column with 10% nulls keeps some
    # integer columns are written as integers (a CSV reads 12000, not 12000.0), with nulls
    assert syn["amount"].dtype == "Int64" and syn["emp"].dtype == "Int64" and syn["rate"].dtype == np.float64
    assert (~syn["grade"].isin(list("ABCD"))).mean() < 0.03  # E-G declared but never seen: one merged cell, ~0


def test_values_stay_on_the_real_grid_not_invented(loans):
    df, syn, _, _ = loans
    # 80% of the real amounts are whole thousands (heavy grid values); uniform: 0.1%. The run
    # is noisy (secure randomness, not seeded): 13 runs gave 0.36-0.56, so 0.4 failed a CI run;
    # 2 more 0.43 and 0.56: mean 0.46, sd 0.055, so 0.25 sat 3.8 sd off (about 1e-4 a run);
    # 0.15 is 5.6 sd off (1e-8) and still 150 times what invented values give
    thousands = (syn["amount"] % 1000 == 0).mean()
    assert thousands > 0.15
    # 8 real rates; the grid has 3,001 values (uniform: 0.3%); 12 runs gave 0.92-0.96
    assert syn["rate"].isin(df["rate"].unique()).mean() > 0.85


def test_it_beats_the_independent_floor(loans):
    df, syn, _, _ = loans
    holdout = _loans(1000, seed=1)
    schema = {c: {k: v for k, v in s.items()} for c, s in SCHEMA.items()}
    q = report.quality_report(df, syn, holdout, schema)["summary"]
    assert q["bivariate_accuracy"] > q["bivariate_accuracy_floor"] + 0.5 * (
        q["bivariate_accuracy_ceiling"] - q["bivariate_accuracy_floor"])
    assert q["overall_accuracy_of_the_way"] > 0.5


def test_the_plan_charges_every_histogram(loans):
    _, _, plan, release = loans
    d = plan.details
    spec = d["spec"]["columns"]
    releases = sum(encoding.one_way_releases(c) for c in spec)
    assert d["mst"]["one_way_releases"] == releases > len(spec)  # the tree columns' levels
    one_way = plan.event["events"][0]
    assert one_way["count"] == releases
    fine = plan.event["events"][3]
    assert fine["count"] == sum(encoding.has_fine(c) for c in spec) == 3  # amount, rate, income (on a 100 grid)
    income = next(c for c in spec if c["column"] == "income")
    assert encoding.value_grid(income)[1:] == (100.0, 20_001, 0, 4)  # 2e8 cents -> 20,001 hundreds
    assert release.result["planned_epsilon"] == pytest.approx(2.0, abs=1e-6)
    assert release.result["planned_epsilon"] <= 2.0


def test_compression_merges_rare_categories_and_makes_private_quantile_bins():
    cat = {"column": "c", "type": "categorical", "domain": list("abcde")}
    y = np.array([500.0, 3.0, 400.0, -2.0, 1.0, 0.5])  # b, d, e and null below 3 sigma (sigma 10)
    m = mst.compress(y, 10.0, cat)
    assert m[0] != m[2] and len({m[1], m[3], m[4], m[5]}) == 1 and m.max() == 2
    num = {"column": "x", "type": "numeric", "lower": 0, "upper": 1, "bins": 4, "nullable": False}
    y = np.r_[np.full(10, 100.0), np.zeros(90)]  # all the mass in the first tenth
    m = mst.compress(y, 5.0, num, 100)
    assert len(np.unique(m[:10])) == 3 and len(np.unique(m[10:])) == 1  # the mass split; the empty tail one group
    y = np.zeros(100)
    y[[10, 90]] = 500.0  # two values carry it all: two groups, each drawn at its value
    m = mst.compress(y, 5.0, num, 100)
    assert m[10] != m[90] and m.max() == 1
    (cells0, p0), (cells1, p1) = mst._within(y, 5.0, m, 100)
    assert p0[list(cells0).index(10)] > 0.99 and p1[list(cells1).index(90)] > 0.99


def test_a_flat_numeric_columns_value_that_clears_3_sigma_keeps_a_cell_of_its_own():
    """nassCDS's injury severity (codes 0-6, a probe's table): code 4 (4% of the rows,
    killed) was merged with code 3 into one private quantile bin (each at least a 20th of
    the rows), and P(dead | 4), 0.97 in the data, came back as 0.04-0.06."""
    sev = {"column": "sev", "type": "numeric", "lower": 0, "upper": 6, "integer": True}
    assert encoding.tree_blocks(sev) == [1]
    y = np.array([4839.0, 4239, 3203, 6352, 818, 97, 2, 110])  # counts of 0-6 and null, sigma 5
    m = mst.compress(y, 5.0, sev)
    assert len(set(m[:6].tolist())) == 6  # 0-5 each its own cell
    assert m[6] == m[5]  # 6 (2 rows, under 3 sigma) joins the value before it
    assert m[7] not in m[:7]  # the null cell clears 3 sigma: apart
    y = np.array([500.0, 2, 1, 3, 400, 0, 1, 0])  # runs of rare values between the common ones
    m = mst.compress(y, 5.0, sev)
    assert m[0] != m[1] == m[2] == m[3] != m[4] and m[5] == m[6] == m[4]
    tree = {"column": "x", "type": "numeric", "lower": 0, "upper": 1, "bins": 4, "nullable": False}
    y = np.zeros(100)
    y[10:20] = 30.0  # each over 3 sigma, but a tree column's cells are pieces of a range: quantile bins as before
    assert len(set(mst.compress(y, 5.0, tree, 100)[10:20].tolist())) == 3  # 25 of mass each, groups of 75


def test_a_rare_code_that_decides_another_column_keeps_deciding_it():
    """End to end (MST at epsilon 1, 20,000 rows): the 4% of rows with code 4 are dead 97%
    of the time, the others 1%."""
    rng = np.random.default_rng(3)
    n = 20_000
    sev = rng.choice(7, n, p=[0.24, 0.22, 0.16, 0.32, 0.042, 0.008, 0.01])
    dead = np.where(sev == 4, rng.random(n) < 0.97, rng.random(n) < 0.01)
    df = pd.DataFrame({"sev": sev, "dead": np.where(dead, "yes", "no"), "age": rng.integers(16, 90, n)})
    schema = {"sev": {"type": "numeric", "lower": 0, "upper": 6, "integer": True, "nullable": False},
              "dead": {"type": "categorical", "domain": ["no", "yes"], "nullable": False},
              "age": {"type": "numeric", "lower": 0, "upper": 100, "integer": True, "nullable": False}}
    syn, _, _ = _run(df, schema, 1.0)
    share = (syn.loc[syn["sev"] == 4, "dead"] == "yes").mean()
    assert share > 0.8, share  # merged with code 3: 0.66-0.72 (MST and AIM, 3 seeds; 0.93-0.99 now)


def test_a_group_of_rare_values_is_drawn_evenly_when_their_counts_differ_by_noise_and_a_merged_null_next_to_never():
    """Twenty rare categories (all under 3 sigma: one model cell) whose noisy counts spread
    less than noise alone would spread them are drawn evenly (``shrink``); the null cell
    that joined them weighs max(y - sigma, 0)."""
    cat = {"column": "c", "type": "categorical", "domain": [f"v{i}" for i in range(20)]}
    y = np.r_[np.linspace(2.0, 40.0, 20), 8.0]  # sigma 15: every count under 45, spread under sigma
    m = mst.compress(y, 15.0, cat)
    assert m.max() == 0
    [(cells, p)] = mst._within(y, 15.0, m, 20, np.ones(21))  # a category: width 1
    share = dict(zip(cells.tolist(), p))
    assert share[20] == 0
    assert [share[i] for i in range(20)] == pytest.approx([1 / 20] * 20)


def test_a_numeric_columns_own_grid_values_keep_their_clipped_counts_and_categories_are_shrunk():
    """Five values in one group whose counts differ by less than noise: as categories
    (width 1 each) they are drawn evenly; as a numeric column's own grid values (coded
    with gaps, 0 1 2 3 7 12: no width) by their clipped counts, so the two that are not
    there (negative noisy counts) stay away."""
    y = np.array([50.0, -10.0, 40.0, -5.0, 45.0])
    m = np.zeros(5, dtype=np.int64)
    [(_, p)] = mst._within(y, 30.0, m, 5, np.ones(5))
    assert p == pytest.approx([0.2] * 5)
    [(_, p)] = mst._within(y, 30.0, m, 5)
    assert p == pytest.approx(np.clip(y, 0, None) / 135.0)


def test_counts_that_differ_by_far_more_than_noise_keep_their_shares():
    y = np.array([400.0, 0.0, 200.0, 0.0, 100.0, 0.0])
    w = mst.shrink(y, 5.0)
    assert w / w.sum() == pytest.approx(y / y.sum(), abs=0.005)
    assert mst.shrink(y, 1000.0) == pytest.approx(np.full(6, 700 / 6))  # the same counts under sd 1000: even


def test_shrinking_toward_even_follows_each_cells_width():
    """Partition cells of a numeric group cover different numbers of measured cells: pure
    noise around a flat density is spread by width, not one share per cell."""
    w = mst.shrink(np.array([40.0, 10.0, 30.0]), 50.0, width=np.array([4, 1, 3]))
    assert w == pytest.approx([40.0, 10.0, 30.0])  # exactly proportional to width: nothing to shrink
    w = mst.shrink(np.array([10.0, 40.0, 30.0]), 50.0, width=np.array([4, 1, 3]))
    assert w == pytest.approx(np.array([4, 1, 3]) * 10.0)


def test_each_group_is_shrunk_on_its_own():
    """The leaves of each partition cell of a tree column: a group whose counts differ by
    noise is spread evenly, a group that differs by far more keeps them, a cell alone
    keeps its clipped count."""
    y = np.array([30.0, -20.0, 10.0, 0.0, 900.0, 0.0, 0.0, 500.0, -7.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
    w = mst.shrink(y, 40.0, groups)
    assert w[:4] == pytest.approx([5.0] * 4)
    assert w[4:8] / w[4:8].sum() == pytest.approx(y[4:8] / y[4:8].sum(), abs=0.01)
    assert w[8] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=40), st.floats(0.01, 1e3))
def test_shrunk_weights_are_never_negative_and_keep_the_sum_of_positive_counts(y, sd):
    y = np.array(y)
    w = mst.shrink(y, sd)
    assert (w >= 0).all() and np.isfinite(w).all()
    if len(y) > 1 and (y >= 0).all():
        assert w.sum() == pytest.approx(y.sum(), rel=1e-9, abs=1e-6)  # nothing clipped: a convex mix


def test_mst_prefers_a_pair_it_can_measure_over_a_noisier_one_with_more_error():
    """Two 30-value columns drawn independently on 1,000 rows show a larger L1 error of
    independence (sparse cells) than two binary columns that agree 60% of the time, but
    measuring 900 cells at sd 10 adds far more: the scores (AIM's discount) put the
    binary pair first; without the discount the 900-cell pair would lead."""
    rng = np.random.default_rng(3)
    n = 1000
    u = rng.integers(0, 2, n)
    df = pd.DataFrame({"x": rng.integers(0, 30, n).astype(str), "y": rng.integers(0, 30, n).astype(str),
                       "u": u.astype(str), "v": np.where(rng.random(n) < 0.6, u, 1 - u).astype(str)})
    columns = [{"column": c, "type": "categorical", "domain": [str(i) for i in range(30 if c in "xy" else 2)],
                "nullable": False} for c in df]
    codes = encoding.cell_encode(df, columns)
    counts = mst.marginal_counts(codes, {c["column"]: encoding.cell_size(c) for c in columns})
    one = Noise.from_dict({"mechanism": "gaussian", "scale": 0.5, "integer": True, "vector": True,
                           "sensitivity": 1})
    ow = mst.OneWay(counts, columns, one, mst._mbi()[0])
    assert ow.csize == {"x": 30, "y": 30, "u": 2, "v": 2}
    exact = {("x", "y"): ow.pair(counts, "x", "y"), ("u", "v"): ow.pair(counts, "u", "v")}
    raw = mst.pair_scores(exact, ow, 0.0)
    assert raw["x", "y"] > raw["u", "v"] > 100
    scores = mst.pair_scores(exact, ow, 10.0)
    assert scores["u", "v"] > scores["x", "y"]
    assert scores["u", "v"] == pytest.approx(raw["u", "v"] - 4 * mst.noise_l1(10.0))


def test_a_bound_a_hair_off_the_grid_keeps_every_value_inside_it():
    """Declared bounds computed in floating point (0.1 + 0.05, 0.3 + 0.6) lie a hair off
    the 0.01 grid: the grid starts and ends inside them, and values at or past a bound
    come back on the grid and within the bounds (DoctorVisits' age, bench 2026-11-27)."""
    col = {"column": "x", "type": "numeric", "lower": 0.1 + 0.05, "upper": 0.3 + 0.6, "decimals": 2,
           "nullable": False}
    first, step, n, d = encoding.grid(col)
    values = np.round((first + np.arange(n)) * step, d)
    assert values[0] == 0.16 and values[-1] == 0.89
    out = encoding.enforce(pd.DataFrame({"x": [0.0, 0.15, col["lower"], 0.5, 0.9, 5.0]}), [col],
                           np.random.default_rng(0))["x"]
    assert list(out) == [0.16, 0.16, 0.16, 0.5, 0.89, 0.89]
    decoded = encoding.cell_decode({"x": np.arange(encoding.n_values(col))}, [col], np.random.default_rng(0))["x"]
    assert decoded.min() >= col["lower"] and decoded.max() <= col["upper"]
    assert np.array_equal(np.round(decoded, 2), decoded)
    wide = {**col, "lower": 0.1 + 0.05, "upper": 20_000.3 + 0.6}  # over MAX_GRID values: a coarser grid
    g_first, g_step, g_n, g_d, k = encoding.value_grid(wide)
    assert k >= 1 and round(g_first * g_step, g_d) >= wide["lower"]
    assert round((g_first + g_n - 1) * g_step, g_d) <= wide["upper"]


@pytest.mark.parametrize("bounds, spec, refused", [
    # a span past the largest float: the run gave 0 and 1.7e308 only, and its report crashed
    ((-1e308, 1e308), {}, "span more than the largest number"),
    ((0, 1e200), {}, None),  # a continuous column: a coarser candidate grid, no overflow
    ((-1e13, 1e13), {"decimals": 2}, None),
    ((-1e300, 1e300), {"integer": True}, r"x.*more than 2\^53 steps from zero"),  # grid indices past int64
    ((-1e15, 1e15), {"decimals": 2}, r"x.*more than 2\^53 steps from zero"),  # 1e15 + 0.01 is no float64
    # float64 holds no odd integer past 2^53: 2^53 + 1 came back as 2^53, below the bound
    ((2**53 + 1, 2**53 + 9), {"integer": True}, r"x.*\[9007199254740993, 9007199254741001\].*2\^53"),
    ((2**53 - 9, 2**53), {"integer": True}, None),
])
def test_bounds_far_from_zero_synthesize_or_are_refused_never_crash(bounds, spec, refused):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(0, 1e6, 1000).round(2), "g": rng.choice(list("ab"), 1000)})
    schema = {"x": {"type": "numeric", "lower": bounds[0], "upper": bounds[1], "nullable": False, **spec},
              "g": {"type": "categorical", "domain": ["a", "b"], "nullable": False}}
    if refused:
        with pytest.raises(PlanError, match=refused):
            _run(df, schema, 1.0, rows=200)
        return
    syn, _, _ = _run(df, schema, 1.0, rows=200)
    assert syn["x"].notna().all() and syn["x"].between(*bounds).all()
    if "decimals" in spec:
        assert np.allclose(np.round(syn["x"], 2), syn["x"], atol=1e-6, rtol=0)


def test_the_tree_partition_is_fine_where_the_rows_are():
    col = {"column": "x", "type": "numeric", "lower": 0, "upper": 256, "bins": 20, "nullable": False}
    x = np.r_[np.random.default_rng(0).uniform(0, 8, 5000), [200.0] * 3]
    exact = np.bincount(encoding.cell_encode(pd.DataFrame({"x": x}), [col])["x"], minlength=encoding.cell_size(col))
    noise = Noise.from_dict({"mechanism": "gaussian", "scale": 5.0, "integer": True, "vector": True,
                             "sensitivity": 1})
    cellmap, y, _ = mst.measure_one_way(exact, col, noise)
    assert len(np.unique(cellmap[:8])) == 8  # one cell per unit of [0, 8): 625 rows each
    assert len(np.unique(cellmap[64:])) <= 3  # [64, 256): 3 rows, coarse


def _quantile_accuracy(real: np.ndarray, fake: np.ndarray, bins: int = 10) -> float:
    edges = np.unique(np.quantile(real, np.linspace(0, 1, bins + 1)[1:-1]))
    p = np.bincount(np.searchsorted(edges, real, side="right"), minlength=len(edges) + 1) / len(real)
    q = np.bincount(np.searchsorted(edges, fake, side="right"), minlength=len(edges) + 1) / len(fake)
    return 1.0 - 0.5 * float(np.abs(p - q).sum())


def test_a_continuous_column_in_a_small_part_of_its_range_keeps_its_shape():
    """Lab values declared on [0, 15000] whose rows lie in [20, 250] (one in a thousand far
    out): a continuous column (no declared grid) is measured on a tree whose
    last level grows with the table (params.tree_cells: 16,384 cells at 40,000 rows), so
    its quantiles come back; on 256 cells the whole body was two cells, drawn uniformly
    (accuracy over 10 quantile bins about 0.6)."""
    from engines.synthesis.params import tree_cells

    assert tree_cells(2_000) == 256 and tree_cells(40_000) == 16_384
    rng = np.random.default_rng(4)
    n = 40_000
    kind = rng.choice(["hdl", "chol", "sbp"], n)
    value = np.where(kind == "sbp", rng.normal(135, 18, n), rng.lognormal(3.9, 0.3, n))
    value = np.where(rng.random(n) < 0.001, rng.uniform(1000, 14000, n), np.clip(value, 20, 250))
    df = pd.DataFrame({"test": kind, "value": value})
    schema = {"test": {"type": "categorical", "domain": ["chol", "hdl", "sbp"], "nullable": False},
              "value": {"type": "numeric", "lower": 0, "upper": 15_000, "nullable": False}}
    syn, _, _ = _run(df, schema, 1.0)
    assert _quantile_accuracy(value, syn["value"].to_numpy()) > 0.9


def test_the_values_a_continuous_column_repeats_come_back():
    """A column declared without a grid whose rows repeat values (results recorded to one
    decimal, 30% exactly zero): its fine histogram on the candidate grid finds them, so
    the synthetic values are values the column takes, and its spike at zero is there (before:
    fresh floats drawn in each cell, none equal to a real value: a discriminator on raw
    values told them apart at AUC 0.92 on nafld2's lab values)."""
    rng = np.random.default_rng(5)
    n = 30_000
    group = rng.choice(["a", "b"], n)
    value = np.where(rng.random(n) < 0.3, 0.0, np.round(rng.lognormal(np.where(group == "a", 1.2, 1.8), 0.3), 1))
    df = pd.DataFrame({"group": group, "value": value})
    schema = {"group": {"type": "categorical", "domain": ["a", "b"], "nullable": False},
              "value": {"type": "numeric", "lower": 0, "upper": 100, "nullable": False}}
    syn, plan, _ = _run(df, schema, 1.0)
    assert plan.event["events"][3]["count"] == 1  # the fine histogram of "value", charged
    v = syn["value"].to_numpy()
    assert np.isin(v, np.unique(value)).mean() > 0.7
    assert abs((v == 0).mean() - 0.3) < 0.03
    assert _quantile_accuracy(value[value > 0], v[v > 0]) > 0.9


def _unit_meta(n_rows: int, n_units: int) -> DatasetMeta:
    schema = {"pid": {"type": "unit"}, **{c: SCHEMA[c] for c in ("amount", "grade", "emp")}}
    return DatasetMeta(name="t", columns=schema, unit_column="pid", n_rows=n_rows, n_units=n_units, delta=1e-6)


@pytest.mark.parametrize("n_rows,n_units,epsilon,method,want", [
    (250_000, 10_000, 1.0, "mst", 25),  # the mean rows per unit
    (250_000, 10_000, 1.0, "aim", 25),
    (4_000_000, 50_000, 1.0, "mst", 64),  # at most 64
    (30_000, 30_000, 1.0, "mst", 1),
    # 8 is refused (one-way noise over a tenth of the units, over 3 declared columns and
    # the bucket of each unit's rows, params.model_columns): halved
    (8_000, 1_000, 1.0, "mst", 4),
    (24_000, 1_000, 1.0, "mst", 3),  # 24, 12 and 6 are refused
    (250_000, 10_000, 1.0, "vae", 4),  # the VAE keeps its fixed default
])
def test_the_default_rows_per_unit_follows_the_table(n_rows, n_units, epsilon, method, want):
    """MST and AIM's default k is the dataset's mean rows per unit (registered metadata),
    halved while the plan would be refused; an explicit k is kept (and refused if too
    large); the plan states the k it used."""
    meta = _unit_meta(n_rows, n_units)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {"method": method, "epsilon": epsilon}), meta)
    assert plan.details["spec"]["max_rows_per_unit"] == want
    if method != "vae" and want < min(64, round(n_rows / n_units)):  # halved: twice as many is refused
        with pytest.raises(Exception, match="too small"):
            plugins.plan("synthesis", EngineRequest("synthesize", {"method": method, "epsilon": epsilon,
                                                                  "max_rows_per_unit": 2 * want}), meta)
    if method != "vae":
        with pytest.raises(Exception, match="too small"):
            plugins.plan("synthesis", EngineRequest("synthesize", {"method": method, "epsilon": epsilon,
                                                                  "max_rows_per_unit": 1000}), _unit_meta(8_000, 1_000))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_a_worker_process_does_not_grow_with_every_run():
    """JAX's compiled code is dropped after each run (synthesis.release_compiled_code): the
    process's memory mappings stay level run after run; kept, they grew by 1,000-3,500 per
    run until the kernel's vm.max_map_count, where the process died by a segfault."""
    df = _loans(600, seed=3)

    def maps() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    _run(df, SCHEMA, 2.0)
    first = maps()
    for seed in (4, 5):
        _run(_loans(600, seed=seed).iloc[: 500 + seed], SCHEMA, 2.0)  # other row counts: other compiled shapes
    assert maps() - first < 300


@pytest.mark.parametrize("method", ["mst", "aim", "vae"])
def test_a_string_domain_on_a_numeric_code_column_finds_its_rows(method, monkeypatch):
    """A treatment coded 1.0 / 2.0 (and missing) declared categorical ``["1", "2"]``: the
    histogram matched it (as strings), synthesis once matched nothing and gave every row a
    null. Every engine matches as the aggregates engine does (``series_codes``)."""
    if method == "vae":
        # the VAE's randomness is ours (torch generators from os.urandom, model init from
        # torch's global one): seeded, as tests/engines/test_synthesis_vae.py does, so its
        # lean to the commonest code cannot drift past the tolerance now and then
        import torch

        from engines.synthesis import execute, vae

        seeds = iter(range(1000, 2000))
        monkeypatch.setattr(vae, "secure_generator", lambda dev: torch.Generator(device=dev).manual_seed(next(seeds)))
        monkeypatch.setattr(execute, "secure_rng", lambda: np.random.default_rng(next(seeds)))
        torch.manual_seed(0)
    rng = np.random.default_rng(3)
    n = 3000
    trt = rng.choice([1.0, 2.0, np.nan], size=n, p=[0.5, 0.25, 0.25])
    df = pd.DataFrame({"trt": trt, "age": np.where(trt == 1.0, rng.integers(20, 40, n), rng.integers(50, 80, n))})
    schema = {"trt": {"type": "categorical", "domain": ["1", "2"]},
              "age": {"type": "numeric", "lower": 0, "upper": 100, "integer": True, "nullable": False}}
    syn, _, _ = _run(df, schema, 20.0, method=method)
    share = syn["trt"].value_counts(normalize=True, dropna=False)
    assert set(syn["trt"].dropna()) <= {"1", "2"}
    # the VAE leans to the commonest code: "1" at 0.53-0.60 in 12 unseeded runs (real 0.5), so
    # 0.08 failed about one run in six; what this test is for (rows found, not all null) holds
    # (seeded above; MST's and AIM's measurements are OpenDP's, at epsilon 20: within 0.01)
    tol = 0.12 if method == "vae" else 0.08
    assert abs(share.get("1", 0) - 0.5) < tol and abs(share.get("2", 0) - 0.25) < tol, share


def _plan_errors(df: pd.DataFrame, schema: dict, params: dict) -> dict:
    from engines.types import PlanError

    meta = DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    with pytest.raises(PlanError) as e:
        plugins.plan("synthesis", EngineRequest("synthesize", params), meta)
    return e.value.errors


def test_a_refusal_says_which_columns_were_left_out_and_why():
    """A draft schema (numeric columns without bounds) once got "MST needs at least two
    columns" and nothing more; the refusal names the columns left out and the reason."""
    df = pd.DataFrame({"grade": ["A", "B"] * 50, "chol": np.arange(100.0), "age": np.arange(100.0)})
    schema = {"grade": {"type": "categorical", "domain": ["A", "B"]}, "chol": {"type": "numeric"},
              "age": {"type": "numeric"}}
    msg = _plan_errors(df, schema, {"epsilon": 1})["columns"]
    assert "at least two columns" in msg and "'chol' has no declared bounds" in msg and "'age'" in msg


def test_an_integer_column_with_decimals_is_refused_as_registration_refuses_it():
    """A probe's direct engine call with integer: true and decimals: 2 was planned (and every
    value came back whole); registration refuses the pair ("an integer column has 0 decimals")."""
    df = pd.DataFrame({"g": ["A", "B"] * 50, "x": np.arange(100.0)})
    schema = {"g": {"type": "categorical", "domain": ["A", "B"]},
              "x": {"type": "numeric", "lower": 0, "upper": 100, "integer": True, "decimals": 2}}
    msg = _plan_errors(df, schema, {"epsilon": 1, "columns": ["g", "x"]})["columns"]
    assert "an integer column has 0 decimals" in msg


def test_a_run_lists_the_columns_it_left_out():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"grade": rng.choice(["A", "B"], 2000), "age": rng.integers(20, 60, 2000),
                       "chol": rng.normal(200, 30, 2000)})
    schema = {"grade": {"type": "categorical", "domain": ["A", "B"]},
              "age": {"type": "numeric", "lower": 0, "upper": 100, "integer": True}, "chol": {"type": "numeric"}}
    syn, _, release = synthesize(df, DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=2000,
                                                 n_units=2000, delta=1e-6), {"epsilon": 4, "holdout_fraction": 0})
    assert list(syn.columns) == ["grade", "age"]
    assert list(release.result["columns_left_out"]) == ["chol"]
    assert "no declared bounds" in release.result["columns_left_out"]["chol"]


@pytest.mark.parametrize("params, fragment", [({"epsilon": 1000}, "must be a number in (0, 100], got 1000"),
                                              ({}, "required")])
def test_an_epsilon_out_of_range_is_not_called_missing(params, fragment):
    df = pd.DataFrame({"a": ["x", "y"] * 50, "b": ["u", "v"] * 50})
    schema = {"a": {"type": "categorical", "domain": ["x", "y"]}, "b": {"type": "categorical", "domain": ["u", "v"]}}
    assert fragment in _plan_errors(df, schema, params)["epsilon"]


def test_a_too_small_epsilon_names_the_noise_and_the_limit_unrounded():
    """22 units: a tenth is 2.2, and an sd of 2.4 is not written "sd 2" beside it."""
    df = pd.DataFrame({"a": ["x", "y"] * 11, "b": ["u", "v"] * 11})
    schema = {"a": {"type": "categorical", "domain": ["x", "y"]}, "b": {"type": "categorical", "domain": ["u", "v"]}}
    msg = _plan_errors(df, schema, {"epsilon": 1, "method": "mst", "holdout_fraction": 0})["epsilon"]
    assert "over 2.2)" in msg, msg


def test_a_smooth_column_is_not_drawn_as_spikes_of_noise():
    """A uniform column on [0, 1] (3,000 rows, epsilon 0.5): the tree's fine cells of one
    partition cell differ by noise only, so its rows are spread evenly over them
    (``shrink``). Soft-thresholded counts (max(y - sd, 0), before) drew them on the few
    cells where the noise happened to be large: total variation of 0.08-0.12 on 20 bins
    against 0.03-0.07 now (MST, five runs each)."""
    rng = np.random.default_rng(1)
    n = 3000
    df = pd.DataFrame({"x": rng.uniform(0, 1, n), "g": rng.choice(["a", "b"], n)})
    schema = {"x": {"type": "numeric", "lower": 0, "upper": 1, "nullable": False},
              "g": {"type": "categorical", "domain": ["a", "b"], "nullable": False}}
    meta = DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=n, n_units=n, delta=1e-6)
    real = np.histogram(df.x, 20, (0, 1))[0] / n
    tv = []
    for _ in range(3):
        syn, _, _ = synthesize(df, meta, {"method": "mst", "epsilon": 0.5, "rows": n, "holdout_fraction": 0})
        tv.append(0.5 * np.abs(real - np.histogram(syn.x, 20, (0, 1))[0] / len(syn)).sum())
    assert np.mean(tv) < 0.075, tv


@pytest.mark.parametrize("spec, fragment", [
    # a grid with no value inside the bounds gave 0 and 1 on [0.2, 0.8], 0.1510010... on [0.151, 0.159]
    ({"lower": 0.2, "upper": 0.8, "integer": True}, "no integer lies in [0.2, 0.8]"),
    ({"lower": 0.151, "upper": 0.159, "decimals": 2}, "no 2-decimal value lies"),
    # flags that are not booleans were read by truth: "no" meant integer, "false" nullable
    ({"lower": 0, "upper": 10, "integer": "no"}, "integer must be true or false"),
    ({"lower": 0, "upper": 10, "nullable": "false"}, "nullable must be true or false"),
    # every bound problem said "has no declared bounds"
    ({"lower": 5, "upper": 1}, "lower bound 5 must be below its upper bound 1"),
    ({"lower": float("nan"), "upper": 1}, "must be finite numbers"),
    ({"lower": "0", "upper": "9"}, "must be finite numbers"),
    ({"type": "categorical", "domain": ["a", "a", "b"]}, "distinct"),
    ({"type": "categorical", "domain": ["a", None]}, "distinct strings, numbers or booleans"),
])
def test_a_declaration_registration_would_refuse_is_refused_by_the_engine_too(spec, fragment):
    """A DatasetMeta built by hand reaches the engine without registration's checks: it
    refuses what would break its own declarations, naming the problem (a helper's probe)."""
    df = pd.DataFrame({"x": np.linspace(0, 1, 100), "g": ["a", "b"] * 50})
    schema = {"x": {"type": "numeric", **spec}, "g": {"type": "categorical", "domain": ["a", "b"]}}
    errors = _plan_errors(df, schema, {"epsilon": 1, "method": "mst", "holdout_fraction": 0})
    assert fragment in json.dumps(errors), errors


def test_a_table_too_many_cells_to_sample_is_refused_at_plan_time():
    """5,000,000 synthetic rows of 60 columns were admitted, charged and the worker killed
    out of memory while sampling (two int64 copies of every cell)."""
    from engines.synthesis.params import MAX_CELLS

    cols = {f"x{i}": {"type": "numeric", "lower": 0, "upper": 10, "integer": True} for i in range(60)}
    meta = DatasetMeta(name="wide", columns=cols, unit_column=None, n_rows=2_000, n_units=2_000, delta=1e-6)
    with pytest.raises(PlanError, match="cells") as e:
        plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 1.0, "rows": 5_000_000}),
                     meta)
    assert "rows" in e.value.errors and f"at most {MAX_CELLS // 60:,}" in e.value.errors["rows"]
    assert plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 1.0,
                                                                  "rows": MAX_CELLS // 60}), meta)


def test_a_cancel_sent_during_the_reports_is_seen_before_the_release():
    """The reports were the last progress report: a cancel sent while they ran was accepted
    and the table released seconds later (a probe)."""
    from engines.types import Cancelled

    phases = []

    def progress(p):
        phases.append(p["phase"])
        if "quality and privacy reports" in phases[:-1]:  # the next report after them
            raise Cancelled("cancelled by the analyst")

    df = _loans(600)
    meta = DatasetMeta(name="t", columns=SCHEMA, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    with pytest.raises(Cancelled):
        synthesize(df, meta, {"method": "mst", "epsilon": 1.0, "rows": 100, "holdout_fraction": 0.25}, progress)
    assert phases[-2:] == ["quality and privacy reports", "releasing"]



def test_reports_that_run_out_of_memory_do_not_withhold_the_table(monkeypatch):
    """A probe's MST table within every limit was made, then the officer's privacy report
    (a nearest-neighbour search over 1 GB distance blocks) ran out of memory: the run failed
    after the read, charged, and the table was dropped. The reports are the officer's, read
    after the table is made: it is released, the report says why it is missing."""
    from engines.synthesis import execute

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(execute, "reports", no_memory)
    df = _loans(600)
    meta = DatasetMeta(name="t", columns=SCHEMA, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    table, _, release = synthesize(df, meta, {"method": "mst", "epsilon": 1.0, "rows": 100,
                                              "holdout_fraction": 0.25})
    assert len(table) == release.result["rows"] == 100 and release.result["reports"] == "not computed for this run"
    assert "ran out of memory" in release.officer_report["not_computed"]


def test_the_nearest_neighbour_search_works_in_small_blocks(monkeypatch):
    from sklearn import get_config
    from sklearn.neighbors import NearestNeighbors

    from engines.synthesis import report

    seen, real = [], NearestNeighbors.kneighbors
    monkeypatch.setattr(NearestNeighbors, "kneighbors",
                        lambda self, *a, **k: seen.append(get_config()["working_memory"]) or real(self, *a, **k))
    d, idx = report._nearest(np.eye(3), np.eye(3)[[2, 0]])
    assert seen == [report.NEAREST_WORKING_MB] and list(idx) == [2, 0] and list(d) == [0.0, 0.0]


@pytest.mark.parametrize("method", ["mst", "aim"])
def test_a_cancel_while_preparing_keeps_the_whole_plan_of_a_one_shot_method(method):
    """MST and AIM are one-shot: a cancel after the read keeps the whole plan (no event
    named), where DP-SGD and the DP-VAE commit the steps taken, nothing before the first."""
    from engines.types import Cancelled

    def progress(p):
        if p["phase"] == "preparing data":
            raise Cancelled("cancelled by the analyst")

    df = _loans(600)
    meta = DatasetMeta(name="t", columns=SCHEMA, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    with pytest.raises(Cancelled) as exc:
        synthesize(df, meta, {"method": method, "epsilon": 1.0, "rows": 100}, progress)
    assert exc.value.actual_event is None

WIDE = {f"k{i}": {"type": "categorical", "domain": list(range(10_000))} for i in range(4)}
WIDE["num"] = {"type": "numeric", "lower": 0, "upper": 1}


@pytest.mark.parametrize("params, key, fragment", [
    ({"method": "mst", "epsilon": 20, "columns": ["k0", "k1", "k2", "k3"], "rows": 1000}, "columns", "cells in all"),
    ({"method": "aim", "epsilon": 10, "columns": ["k0", "k1", "k2"]}, "columns", "cells in all"),
    ({"method": "vae", "epsilon": 1, "epochs": 1, "columns": ["k0", "num"], "hidden": [8], "rows": 100},
     "columns", "encoded inputs"),
    ({"method": "vae", "epsilon": 1, "epochs": 1, "columns": ["num", "k0"], "hidden": [4096] * 8, "rows": 100},
     "hidden", "parameters"),
])
def test_a_run_too_large_for_a_worker_is_refused_at_plan_time(params, key, fragment):
    """A probe's bombs: MST and AIM over four columns of 10,000 declared values (every pair's
    counts dense: 800 MB a pair), a VAE one-hot encoding 10,000 values on 160,000 rows
    (6.4 GB) or with eight layers of 4,096 (300M parameters): each was admitted, charged,
    then killed out of memory on the worker. Each is refused before the gate, naming why."""
    meta = DatasetMeta(name="wide", columns=WIDE, unit_column=None, n_rows=200_000, n_units=200_000, delta=1e-6)
    with pytest.raises(PlanError) as e:
        plugins.plan("synthesis", EngineRequest("synthesize", params), meta)
    assert fragment in e.value.errors[key], e.value.errors
    small = {**params, "columns": ["k0", "num"], "hidden": [64]} if params["method"] == "vae" else \
        {**params, "columns": ["k0", "num"]}
    if params["method"] == "vae":
        meta = DatasetMeta(name="wide", columns=WIDE, unit_column=None, n_rows=5_000, n_units=5_000, delta=1e-6)
    assert plugins.plan("synthesis", EngineRequest("synthesize", small), meta)


def test_mst_on_more_columns_than_it_can_pair_is_refused():
    from engines.synthesis.params import MAX_MODEL_COLUMNS

    cols = {f"x{i}": {"type": "numeric", "lower": 0, "upper": 10, "integer": True} for i in range(300)}
    meta = DatasetMeta(name="manycols", columns=cols, unit_column=None, n_rows=5_000, n_units=5_000, delta=1e-6)
    with pytest.raises(PlanError, match=f"at most {MAX_MODEL_COLUMNS} columns"):
        plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 1.5, "rows": 100}), meta)


def test_the_csv_reads_back_row_for_row_with_formulas_neutralised(tmp_path):
    """A declared category with a lone CR split rows (pandas quoted only newlines: a probe's
    500 released rows read back as 631) and formula-like labels went out as formulas. The
    CSV quotes its text cells and starts formula-like ones with ``'``; the Parquet file
    keeps every value."""
    import csv

    import pyarrow as pa

    labels = ["north\rsouth", '=HYPERLINK("http://evil.example/","open")', "+1+cmd", "-2", "plain"]
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"region": rng.choice(labels, 500), "y": rng.integers(-5, 6, 500)})
    schema = {"region": {"type": "categorical", "domain": labels, "nullable": False},
              "y": {"type": "numeric", "lower": -5, "upper": 5, "integer": True, "nullable": False}}
    meta = DatasetMeta(name="t", columns=schema, unit_column=None, n_rows=500, n_units=500, delta=1e-6)
    request = EngineRequest("synthesize", {"method": "mst", "epsilon": 4.0, "rows": 300, "holdout_fraction": 0})
    plan = plugins.plan("synthesis", request, meta)
    plugins.run("synthesis", request, meta, pa.Table.from_pandas(df), plan, lambda p: None, workdir=tmp_path)
    exact = pd.read_parquet(tmp_path / "synthetic.parquet")
    with open(tmp_path / "synthetic.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["region", "y"] and len(rows) == 1 + len(exact) == 301
    safe = {"north\rsouth": "north\rsouth", labels[1]: "'" + labels[1], "+1+cmd": "'+1+cmd", "-2": "-2",
            "plain": "plain"}
    assert [r[0] for r in rows[1:]] == [safe[v] for v in exact["region"]]
    assert [int(r[1]) for r in rows[1:]] == exact["y"].tolist()
    assert len(pd.read_csv(tmp_path / "synthetic.csv")) == len(exact)


def test_a_column_name_made_safe_never_reads_as_another_s():
    from engines.synthesis.execute import for_people

    df = pd.DataFrame({"=eq": [1], "'=eq": [2], "-neg": ["x"], "ok": ["=1"]})
    out = for_people(df)
    assert len(set(out.columns)) == 4 and "'=eq" in out.columns and out["'=eq"].tolist() == [2]
    assert out.columns.tolist() == ["''=eq", "'=eq", "'-neg", "ok"] and out["ok"].tolist() == ["'=1"]


def test_a_wide_integer_column_keeps_its_shape_on_its_declared_grid():
    """A probe's ``votes`` (integer, skewed, median 30), declared [0, 199999]: every value
    is on the grid its value histogram is measured on, and the synthetic median stays
    near the real one. Declared [0, 200000] (200,001 values, past MAX_GRID) the histogram
    is measured 10 times coarser: counted only where a value lay on it, the median came
    back 370-401; now the rows between two coarse values are counted in that gap and drawn
    on the integers inside it, so the values are not all round either."""
    rng = np.random.default_rng(3)
    n = 20_000
    votes = np.minimum(np.round(np.exp(rng.normal(3.4, 1.2, n))) + 5, 150_000)
    df = pd.DataFrame({"votes": votes.astype(np.int64), "g": rng.choice(list("ab"), n)})
    for upper, k in ((199_999, 0), (200_000, 1)):
        schema = {"votes": {"type": "numeric", "lower": 0, "upper": upper, "integer": True, "nullable": False},
                  "g": {"type": "categorical", "domain": ["a", "b"], "nullable": False}}
        meta = DatasetMeta(name="v", columns=schema, unit_column=None, n_rows=n, n_units=n, delta=1e-6)
        assert encoding.value_grid({"column": "votes", **schema["votes"]})[4] == k
        syn, _, _ = synthesize(df, meta, {"epsilon": 1.0, "method": "mst"})
        real, got = float(np.median(df["votes"])), float(np.median(syn["votes"].astype(float)))
        assert 0.6 * real <= got <= 1.6 * real, (upper, real, got)
        x = syn["votes"].astype(float)
        assert (x % 1 == 0).all() and x.between(0, upper).all()
        assert (x % 10 == 0).mean() < 0.3, upper  # about 0.1 in the real column


def test_a_coarsened_value_grid_counts_each_row_at_its_value_or_in_the_gap_around_it():
    """Entries of a value histogram measured on a coarser grid than the column's own
    (``grid_encode`` / ``grid_entries``): 2i + 1 the i-th coarse value, 2i + 2 the gap above
    it, 0 the gap below the first; every row is counted once (one count per row, the
    sensitivity the plan charges for)."""
    col = {"column": "x", "type": "numeric", "lower": 5, "upper": 200_005, "integer": True}
    first, step, n, _, k = encoding.value_grid(col)
    assert (first, step, k) == (1, 10.0, 1) and encoding.grid_size(col) == 2 * n + 1
    x = np.array([5, 9, 10, 11, 19, 20, 200_000, 200_003, 200_005], dtype=float)
    e = encoding.grid_encode(pd.DataFrame({"x": x}), col)
    assert e.tolist() == [0, 0, 1, 2, 2, 3, 2 * (n - 1) + 1, 2 * n, 2 * n]
    a, b = encoding.grid_entries(col, e)
    assert ((a <= x) & (x <= b)).all()
    assert encoding._inner_span(col, a, b)[1].tolist() == [5, 5, 0, 9, 9, 0, 0, 5, 5]
    draws = encoding._draw_in_gap(col, 10.0, 20.0, 2000, np.random.default_rng(1))
    assert set(draws.tolist()) == set(range(11, 20))
    # the rest of a cell's rows: on the cell's integers outside its heavy gaps (which have
    # their own counts), evenly; a cell its gaps cover keeps the draws it had
    rest = encoding._draw_outside(col, 0.0, 100.0, np.array([30.0, 10.0, 20.0]), np.array([40.0, 20.0, 30.0]),
                                  np.zeros(20_000), np.random.default_rng(2))
    inside = (rest > 10) & (rest < 40)
    assert (rest % 1 == 0).all() and not (inside & (rest % 10 != 0)).any()
    assert abs((rest < 10).mean() - 10 / 70) < 0.02 and abs((rest > 40).mean() - 60 / 70) < 0.02
    kept = np.full(5, 7.0)
    assert (encoding._draw_outside(col, 10.0, 20.0, np.array([5.0]), np.array([25.0]), kept,
                                   np.random.default_rng(3)) == 7.0).all()
    # bounds on the coarse grid are that grid's values, not inside the gaps beside them: [0,
    # 200000]'s first gap (0, 10) held 0 too (the movies' votes were drawn from 0 up)
    col = {"column": "x", "type": "numeric", "lower": 0, "upper": 200_000, "integer": True}
    n = encoding.value_grid(col)[2]
    a, b = encoding.grid_entries(col, np.array([0, 2, 2 * n - 2, 2 * n]))
    assert encoding._inner_span(col, a, b)[0].tolist()[1:3] == [1, 199_991]
    assert encoding._inner_span(col, a, b)[1].tolist() == [0, 9, 9, 0]


def test_a_categorical_column_of_integer_codes_comes_back_as_integers_beside_nulls():
    """A probe's ``differ`` (domain [1, 2, 3], with nulls): 2.0 in a table where a null was
    drawn, 2 in one where none was. Integer codes are written as integers with nulls."""
    rng = np.random.default_rng(5)
    n = 3000
    codes = pd.array(np.where(rng.random(n) < 0.2, None, rng.choice([1, 2, 3], n)), dtype="Int64")
    df = pd.DataFrame({"differ": codes, "g": rng.choice(list("ab"), n)})
    schema = {"differ": {"type": "categorical", "domain": [1, 2, 3]},
              "g": {"type": "categorical", "domain": ["a", "b"], "nullable": False}}
    meta = DatasetMeta(name="c", columns=schema, unit_column=None, n_rows=n, n_units=n, delta=1e-6)
    syn, _, _ = synthesize(df, meta, {"epsilon": 2.0, "method": "mst"})
    assert str(syn["differ"].dtype) == "Int64" and syn["differ"].isna().any()
    assert set(syn["differ"].dropna().tolist()) <= {1, 2, 3}


def test_a_delta_above_the_datasets_is_refused():
    """A run's own delta was accepted up to 0.1 whatever the dataset's (1e-6 here): its
    certificate was stated at a delta that lets a mechanism release rows whole (a helper's
    probe, on DP-SGD's delta, which took the same range)."""
    df = pd.DataFrame({"x": np.linspace(0, 1, 100), "g": ["a", "b"] * 50})
    schema = {"x": {"type": "numeric", "lower": 0, "upper": 1}, "g": {"type": "categorical", "domain": ["a", "b"]}}
    errors = _plan_errors(df, schema, {"epsilon": 1, "method": "mst", "holdout_fraction": 0, "delta": 0.05})
    assert "at most the dataset's delta" in errors["delta"], errors


def test_the_noisy_table_size_is_not_inflated_by_empty_cells():
    """Each column's one-way counts clipped at 0 and summed (the old total) add about 0.4 sd
    per empty cell: 3,000 rows with a 20,000-value column read as about 40,000. The plain
    sums, weighed by the inverse of their cells, are unbiased."""
    rng = np.random.default_rng(7)
    n, sd = 3000, 4.0
    cols = [np.r_[np.full(10, n / 10), np.zeros(19_990)], np.full(3, n / 3), np.r_[np.full(6, n / 6), np.zeros(94)]]
    got = [mst.noisy_total([c + rng.normal(0, sd, c.size) for c in cols]) for _ in range(200)]
    old = np.mean([c.clip(0).sum() for c in [c + rng.normal(0, sd, c.size) for c in cols]])
    assert old > 1.5 * n  # what the old rule read
    assert abs(np.mean(got) - n) < 3 and np.std(got) < 12  # close to a 3-cell column's sd (4 * sqrt(3) ~ 7)


@pytest.mark.parametrize("method", ["mst", "aim"])
def test_a_column_with_a_huge_declared_domain_keeps_its_rows_on_real_values(method):
    """A probe's 3,000 rows whose ``code`` holds 10 of 20,000 declared values, epsilon 1:
    MST took the table for 40,787 rows and drew 61% of the column on values no row holds
    (AIM 71%); on a 200-value domain AIM kept 98%."""
    rng = np.random.default_rng(11)
    n = 3000
    codes = [f"c{i:05d}" for i in range(20_000)]
    real = rng.choice(codes[100:110], size=n, p=np.linspace(1, 3, 10) / np.linspace(1, 3, 10).sum())
    df = pd.DataFrame({"code": real, "x": rng.integers(0, 50, n)})
    schema = {"code": {"type": "categorical", "domain": codes, "nullable": False},
              "x": {"type": "numeric", "lower": 0, "upper": 50, "integer": True, "nullable": False}}
    syn, _, _ = _run(df, schema, 1.0, method=method)
    # after the fix, 5 runs each: MST 0.879-0.919, AIM 0.937-0.986 (before: 0.26-0.27)
    assert syn["code"].isin(set(real)).mean() > 0.8, syn["code"].value_counts().head(12)


def _spiky_wages(n: int, rng) -> tuple[pd.DataFrame, np.ndarray]:
    """Weekly wages in cents, 40% of them on ten exact amounts off the whole dollars (as
    CPS's deflated wages repeat 712.25, 474.83, ...), the rest log-normal."""
    spikes = np.array([712.25, 474.83, 593.54, 830.96, 949.67, 617.28, 522.32, 427.35, 356.13, 569.80])
    wage = np.where(rng.random(n) < 0.4, rng.choice(spikes, n), np.round(np.exp(rng.normal(6.3, 0.6, n)), 2))
    return pd.DataFrame({"wage": np.clip(wage, 0, 20_000), "g": rng.choice(list("ab"), n)}), spikes


WAGES = {"wage": {"type": "numeric", "lower": 0, "upper": 20_000, "decimals": 2, "nullable": False},
         "g": {"type": "categorical", "domain": ["a", "b"], "nullable": False}}


@pytest.mark.parametrize("method", ["mst", "aim"])
def test_a_heavy_gaps_repeated_values_come_back_as_themselves(method):
    """Cents on [0, 20000] (2M values) are measured on whole dollars, each row off them in
    the dollar's gap; a heavy gap's rows were drawn evenly on its 99 cent values, so the
    amounts a column repeats came back as their neighbours (CPS's raw-value AUC 0.79 ->
    0.80). Each heavy gap's cent values get a second measurement (planned and charged)."""
    rng = np.random.default_rng(11)
    df, spikes = _spiky_wages(20_000, rng)
    col = {"column": "wage", **WAGES["wage"]}
    assert encoding.value_grid(col)[4] == 2 and encoding.refines_gaps(col)
    meta = DatasetMeta(name="w", columns=WAGES, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    syn, plan, _ = synthesize(df, meta, {"epsilon": 1.0, "method": method, "holdout_fraction": 0})
    assert _fine_count(plan, method) == 2  # the value histogram and its heavy gaps' values
    x = syn["wage"].astype(float)
    assert np.allclose(np.round(x, 2), x, atol=1e-9, rtol=0) and x.between(0, 20_000).all() and x.notna().all()
    on_spikes = np.isin(np.round(x, 2), spikes).mean()
    assert on_spikes > 0.25, on_spikes  # real 0.40; drawn evenly within the gaps, about 0.004
    # a distributed dataset's plan measures no gaps (its counts are summed over partitions in one pass)
    dist = DatasetMeta(name="w", columns=WAGES, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6,
                       distributed=True)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {"epsilon": 1.0, "method": "mst"}), dist)
    assert _fine_count(plan, "mst") == 1



def test_a_table_too_small_for_the_second_measurement_is_not_charged_for_it():
    """The heavy gaps' second measurement shares the fine budget with the value histograms:
    on a probe's 614-row table it could find no value (its noise cut was 23% of the rows)
    and the value histograms lost their spike at 0 in 3 runs of 9. It is planned only where
    a value held by 2% of the training units would clear its noise."""
    rng = np.random.default_rng(12)
    small, _ = _spiky_wages(600, rng)
    meta = DatasetMeta(name="w", columns=WAGES, unit_column=None, n_rows=600, n_units=600, delta=1e-4)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {"epsilon": 1.0, "method": "mst"}), meta)
    assert _fine_count(plan, "mst") == 1 and plan.details["spec"]["refine_gaps"] is False
    rich = plugins.plan("synthesis", EngineRequest("synthesize", {"epsilon": 50.0, "method": "mst"}), meta)
    assert _fine_count(rich, "mst") == 2 and rich.details["spec"]["refine_gaps"] is True


def _fine_count(plan, method: str) -> int:
    """The fine measurements a synthesis plan charges for (MST's last part, AIM's second)."""
    return plan.event["events"][-1 if method == "mst" else 1]["count"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30_000), min_size=1, max_size=200), st.lists(st.integers(0, 299), max_size=12))
def test_gap_counts_count_each_row_in_its_measured_gap_once(cents, gap_dollars):
    """``gap_counts`` against a plain loop: a row counts at its cent value when that lies
    strictly inside one of the measured dollar gaps, nowhere else (the whole dollars are the
    value histogram's own entries)."""
    col = {"column": "wage", "type": "numeric", "lower": 0, "upper": 20_000, "decimals": 2, "nullable": False}
    first = encoding.value_grid(col)[0]
    gap_dollars = sorted(set(gap_dollars))
    entries = np.array([2 * (g - first) + 2 for g in gap_dollars], dtype=np.int64)
    a, b = encoding.grid_entries(col, entries)
    lo, count = encoding._inner_span(col, a, b)
    gaps = encoding.Gaps(entries[::-1].copy(), lo[::-1].copy(), count[::-1].copy())  # any order
    got = encoding.gap_counts(pd.DataFrame({"wage": np.array(cents) / 100}), col, gaps)
    want = np.zeros(int(count.sum()), dtype=np.int64)
    offsets = gaps.offsets
    for c in cents:
        for j, (f, m) in enumerate(zip(gaps.first, gaps.count)):
            if f <= c < f + m:
                want[offsets[j] + c - f] += 1
    assert got.tolist() == want.tolist()
    assert all(c % 100 for c in cents if any(f <= c < f + m for f, m in zip(gaps.first, gaps.count)))
