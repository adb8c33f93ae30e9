"""Running the aggregates engine on synthetic tables: answers near the truth, where /
group_by / histogram correctness, declared domains never leak other keys, clamping and
per-unit contribution bounds hold, progress and cancellation, a pandas reference."""

import json
from dataclasses import asdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines import plugins
from engines.aggregates import units as unit_rules
from engines.types import Cancelled, DatasetMeta, EngineError, EngineRequest, Plan, PlanError

HUGE = 1e6  # epsilon (or rho) at which the noise is negligible
N = 20_000
DOMAIN = ["north", "south", "east"]


def make_frame(n=N, seed=1):
    rng = np.random.default_rng(seed)
    income = rng.normal(50_000, 15_000, n)
    income[rng.random(n) < 0.05] = np.nan  # nulls
    return pd.DataFrame({
        "pid": rng.integers(0, n // 4, n),
        "age": rng.integers(18, 91, n),
        "income": income,
        "site": rng.choice(DOMAIN + ["secret-site"], n, p=[0.3, 0.3, 0.3, 0.1]),
        "code": rng.integers(1, 5, n),  # categorical with an int domain [1, 2, 3]; 4 is outside
        "flag": rng.random(n) < 0.3,
    })


COLUMNS = {
    "pid": {"type": "unit"},
    "age": {"type": "numeric", "lower": 18, "upper": 90},
    "income": {"type": "numeric", "lower": 0, "upper": 100_000},
    "site": {"type": "categorical", "domain": DOMAIN},
    "code": {"type": "categorical", "domain": [3, 1, 2]},
    "flag": {"type": "categorical", "domain": [False, True]},
}


def meta(frame, unit=True):
    cols = COLUMNS if unit else {k: v for k, v in COLUMNS.items() if k != "pid"}
    n_units = frame["pid"].nunique() if unit else len(frame)
    return DatasetMeta(name="t", columns=cols, unit_column="pid" if unit else None, n_rows=len(frame),
                       n_units=n_units, delta=1e-6)


@pytest.fixture(scope="module")
def frame():
    return make_frame()


@pytest.fixture(scope="module")
def table(frame):
    return pa.Table.from_pandas(frame, preserve_index=False)


def jsonb_round_trip(value):
    """A JSON round trip as PostgreSQL's jsonb does it: object keys come back shorter
    first, then in byte order, not in the order they were written."""
    def ordered(pairs):
        return dict(sorted(pairs, key=lambda kv: (len(kv[0].encode()), kv[0].encode())))

    return json.loads(json.dumps(value), object_pairs_hook=ordered)


def run(kind, params, frame_or_table, ds, progress=None):
    """plan -> JSON round trip (as the service stores it, in jsonb's key order) -> run on the
    planned columns."""
    table = frame_or_table if isinstance(frame_or_table, pa.Table) else pa.Table.from_pandas(
        frame_or_table, preserve_index=False)
    req = EngineRequest(kind, params)
    plan = plugins.plan("aggregates", req, ds)
    plan = Plan(**jsonb_round_trip(asdict(plan)))
    cols = list(dict.fromkeys(plan.columns + ([ds.unit_column] if ds.unit_column else [])))
    release = plugins.run("aggregates", req, ds, table.select(cols), plan, progress or (lambda p: None))
    json.dumps(release.result)  # always JSON
    return release.result


def groups(result):
    return {g["key"]: g["value"] for g in result["groups"]}


def assert_quantile(rows, value, q, tol=0.02):
    """``value`` is a q-quantile of ``rows`` up to ``tol`` in rank (ties make any value
    between two data points equally right)."""
    rows = np.asarray(rows, dtype=float)
    assert (rows < value).mean() <= q + tol and (rows <= value).mean() >= q - tol, (value, q)


# --------------------------------------------------------------------------- near the truth


def test_ungrouped_answers_are_near_the_truth(frame, table):
    ds = meta(frame, unit=False)
    inc = frame["income"].dropna().clip(0, 100_000)
    r = run("count", {"epsilon": 5.0}, table, ds)
    assert r["kind"] == "count" and r["mechanism"] == "laplace" and r["epsilon"] == pytest.approx(5.0)
    assert isinstance(r["value"], int) and abs(r["value"] - N) <= 20
    assert r["ci95"][0] <= r["value"] <= r["ci95"][1] and r["max_rows_per_unit"] == 1
    r = run("sum", {"column": "income", "epsilon": 50.0}, table, ds)
    assert r["value"] == pytest.approx(inc.sum(), abs=30_000)
    r = run("mean", {"column": "income", "epsilon": 50.0}, table, ds)
    assert r["value"] == pytest.approx(inc.mean(), abs=50) and r["ci95"][0] < r["value"] < r["ci95"][1]
    r = run("variance", {"column": "age", "epsilon": 50.0}, table, ds)
    assert r["value"] == pytest.approx(frame["age"].var(ddof=0), rel=0.02)
    r = run("quantile", {"column": "age", "q": 0.25, "epsilon": 20.0}, table, ds)
    assert_quantile(frame["age"], r["value"], 0.25)
    assert r["ci95"][0] <= r["value"] <= r["ci95"][1] and r["rank_error95"] > 0 and r["mechanism"] == "exponential"


def test_gaussian_answers_are_near_the_truth(frame, table):
    ds = meta(frame, unit=False)
    r = run("count", {"rho": 10.0, "mechanism": "gaussian"}, table, ds)
    assert r["mechanism"] == "gaussian" and r["rho"] == pytest.approx(10.0) and abs(r["value"] - N) < 10
    r = run("mean", {"column": "age", "rho": 100.0, "mechanism": "gaussian", "group_by": "site"}, table, ds)
    truth = frame[frame.site.isin(DOMAIN)].groupby("site")["age"].mean()
    for key, value in groups(r).items():
        assert value == pytest.approx(truth[key], abs=0.5)


def test_exact_at_huge_epsilon(frame, table):
    ds = meta(frame, unit=False)
    inc = frame["income"].dropna().clip(0, 100_000)
    assert run("count", {"epsilon": HUGE}, table, ds)["value"] == N
    assert run("sum", {"column": "income", "epsilon": HUGE}, table, ds)["value"] == pytest.approx(inc.sum(), abs=1)
    centred = inc - 50_000
    assert run("variance", {"column": "income", "epsilon": HUGE}, table, ds)["value"] == pytest.approx(
        centred.var(ddof=0), rel=1e-6)


# --------------------------------------------------------------------------- where / group_by


WHERES = [
    [{"column": "age", "op": ">=", "value": 40}],
    [{"column": "age", "op": "<", "value": 30}, {"column": "site", "op": "==", "value": "north"}],
    [{"column": "income", "op": "!=", "value": 3}],  # nulls never match, not even !=
    [{"column": "income", "op": "<=", "value": 40_000}],
    [{"column": "age", "op": "in", "value": [20, 21, 22.0]}],
    [{"column": "age", "op": "not_in", "value": [20, 21]}],
    [{"column": "site", "op": "!=", "value": "east"}],
    [{"column": "site", "op": "not_in", "value": ["east", "north"]}],
    [{"column": "site", "op": "not_in", "value": ["south"]}],  # rows outside the domain ("secret-site") pass
    [{"column": "code", "op": "in", "value": [1, "2"]}],  # JSON "2" matches the int 2
    [{"column": "flag", "op": "==", "value": True}],
]


def pandas_where(frame, where):
    keep = pd.Series(True, index=frame.index)
    for p in where:
        col, op, v = frame[p["column"]], p["op"], p["value"]
        valid = col.notna()
        if op in ("in", "not_in"):
            vals = set(v) | {int(x) for x in v if isinstance(x, str) and x.isdigit()}
            hit = col.isin(vals)
            m = hit if op == "in" else ~hit & valid
        else:
            m = {"==": col == v, "!=": (col != v) & valid, "<": col < v, "<=": col <= v, ">": col > v,
                 ">=": col >= v}[op]
        keep &= m.fillna(False).astype(bool)
    return frame[keep]


@pytest.mark.parametrize("where", WHERES)
def test_where_matches_pandas(frame, table, where):
    ds = meta(frame, unit=False)
    ref = pandas_where(frame, where)
    assert run("count", {"epsilon": HUGE, "where": where}, table, ds)["value"] == len(ref)
    r = run("sum", {"column": "age", "epsilon": HUGE, "where": where}, table, ds)
    assert r["value"] == pytest.approx(ref["age"].sum(), abs=0.01)


@pytest.mark.parametrize("by", ["site", "code", "flag"])
def test_group_by_matches_pandas_in_domain_order_and_never_reveals_other_keys(frame, table, by):
    ds = meta(frame, unit=False)
    where = [{"column": "age", "op": ">", "value": 50}]
    ref = pandas_where(frame, where)
    domain = COLUMNS[by]["domain"]
    for kind in ("count", "sum", "mean", "quantile"):
        params = {"epsilon": HUGE if kind != "quantile" else 1e4, "group_by": by, "where": where}
        if kind != "count":
            params["column"] = "age"
        r = run(kind, params, table, ds)
        assert [g["key"] for g in r["groups"]] == domain, kind
        assert "secret" not in json.dumps(r) and "4" not in [str(g["key"]) for g in r["groups"]]
        got = groups(r)
        for key in domain:
            rows = ref[ref[by] == key]["age"]
            if kind == "quantile":
                assert_quantile(rows, got[key], 0.5)
                continue
            expected = {"count": len(rows), "sum": rows.sum(), "mean": rows.mean()}[kind]
            assert got[key] == pytest.approx(expected, abs=1e-3), (kind, key)


@pytest.mark.parametrize("values", [[18, 18, 19, 17, 91, 5, 18], [18.0, 18.0, 19.0, 17.0, 91.0, 20.5, None]])
def test_an_integer_column_groups_by_every_integer_in_its_bounds(values):
    """Its labels are the integers of the declared bounds (public); a value outside them, a
    fraction or a null is in no group, as a category outside its domain."""
    cols = {"x": {"type": "numeric", "lower": 18, "upper": 20, "integer": True}}
    ds = DatasetMeta(name="t", columns=cols, unit_column=None, n_rows=len(values), n_units=len(values), delta=1e-6)
    r = run("count", {"group_by": "x", "epsilon": HUGE}, pd.DataFrame({"x": values}), ds)
    assert [(g["key"], g["value"]) for g in r["groups"]] == [(18, 2 + (values[-1] == 18)), (19, 1), (20, 0)]


def test_a_domain_value_absent_from_the_data_still_gets_its_entry(frame, table):
    ds = meta(frame, unit=False)
    cols = dict(ds.columns, site={"type": "categorical", "domain": ["east", "atlantis", "north"]})
    ds = DatasetMeta(**{**asdict(ds), "columns": cols})
    r = run("count", {"epsilon": HUGE, "group_by": "site"}, table, ds)
    assert groups(r) == {"east": (frame.site == "east").sum(), "atlantis": 0, "north": (frame.site == "north").sum()}


def test_categorical_histogram_uses_the_declared_domain_only(frame, table):
    ds = meta(frame, unit=False)
    r = run("histogram", {"column": "site", "epsilon": HUGE}, table, ds)
    assert groups(r) == {k: (frame.site == k).sum() for k in DOMAIN}
    assert "secret" not in json.dumps(r)
    dict_table = table.set_column(table.schema.get_field_index("site"), "site",
                                  table.column("site").dictionary_encode())
    assert groups(run("histogram", {"column": "site", "epsilon": HUGE}, dict_table, ds)) == groups(r)


def test_numeric_histogram_clamps_then_bins_with_a_closed_last_bin():
    frame = pd.DataFrame({"age": [18, 19, 29.99, 30, 60, 89, 90, 150, -5, None]})
    ds = DatasetMeta("h", {"age": {"type": "numeric", "lower": 0, "upper": 90}}, None, 10, 10, 1e-6)
    r = run("histogram", {"column": "age", "bins": [0, 30, 60, 90], "epsilon": HUGE}, frame, ds)
    # -5 -> 0 and 150 -> 90 by clamping; 90 falls in the closed last bin; None is dropped
    assert groups(r) == {"[0, 30)": 4, "[30, 60)": 1, "[60, 90]": 4}
    r = run("histogram", {"column": "age", "bins": [20, 40], "epsilon": HUGE}, frame, ds)
    assert groups(r) == {"[20, 40]": 2}  # values outside the edges are not counted


# --------------------------------------------------------------------------- clamping and nulls


def test_clamping_holds_whatever_the_values():
    frame = pd.DataFrame({"x": [1e12, -1e12, 5.0, 1e300, np.inf, -np.inf]})
    ds = DatasetMeta("c", {"x": {"type": "numeric", "lower": -10, "upper": 10}}, None, 6, 6, 1e-6)
    assert run("sum", {"column": "x", "epsilon": HUGE}, frame, ds)["value"] == pytest.approx(10 - 10 + 5 + 10 + 10 - 10, abs=0.01)
    assert -10 <= run("mean", {"column": "x", "epsilon": HUGE}, frame, ds)["value"] <= 10
    assert run("quantile", {"column": "x", "q": 0.99, "epsilon": 1e3}, frame, ds)["value"] <= 10


def test_nulls_are_excluded_from_values_but_rows_still_count(frame, table):
    ds = meta(frame, unit=False)
    assert run("count", {"epsilon": HUGE}, table, ds)["value"] == N
    r = run("mean", {"column": "income", "epsilon": HUGE}, table, ds)
    assert r["value"] == pytest.approx(frame["income"].dropna().clip(0, 100_000).mean(), rel=1e-6)
    assert r["noisy_count"] == frame["income"].notna().sum()
    # COUNT(column): the rows where it is not null, grouped too, and not the where's rows only
    assert 0 < frame["income"].notna().sum() < N
    assert run("count", {"column": "income", "epsilon": HUGE}, table, ds)["value"] == frame["income"].notna().sum()
    grouped = run("count", {"column": "income", "group_by": "site", "epsilon": HUGE}, table, ds)["groups"]
    assert {g["key"]: g["value"] for g in grouped} == {
        key: int(frame.loc[frame["site"] == key, "income"].notna().sum()) for key in [g["key"] for g in grouped]}


# --------------------------------------------------------------------------- contribution bounding


def heavy_unit_frame(k_rows=1000, others=200):
    return pd.DataFrame({
        "pid": [0] * k_rows + list(range(1, others + 1)),
        "x": [100.0] * k_rows + [0.0] * others,
        "site": ["north"] * k_rows + ["south"] * others,
    })


HEAVY_META = DatasetMeta("u", {"pid": {"type": "unit"}, "x": {"type": "numeric", "lower": 0, "upper": 100},
                               "site": {"type": "categorical", "domain": ["north", "south"]}},
                         "pid", 1200, 201, 1e-6)


@pytest.mark.parametrize("k", [1, 3, 1000])
def test_a_unit_with_1000_rows_contributes_at_most_k(k):
    frame = heavy_unit_frame()
    assert run("count", {"epsilon": HUGE, "max_rows_per_unit": k}, frame, HEAVY_META)["value"] == 200 + k
    assert run("sum", {"column": "x", "epsilon": HUGE, "max_rows_per_unit": k}, frame, HEAVY_META)[
        "value"] == pytest.approx(100 * k, rel=1e-4)  # noise at epsilon 1e6 (the cap): ~3e-6 of it
    r = run("count", {"epsilon": HUGE, "max_rows_per_unit": k, "group_by": "site"}, frame, HEAVY_META)
    assert groups(r) == {"north": k, "south": 200}


def test_bounding_applies_after_where_and_chooses_rows_at_random():
    frame = pd.DataFrame({"pid": [7, 7, 7], "x": [0.0, 100.0, 50.0], "site": ["north", "north", "east"]})
    where = [{"column": "site", "op": "==", "value": "north"}]
    seen = {run("sum", {"column": "x", "epsilon": HUGE, "where": where}, frame, HEAVY_META)["value"]
            for _ in range(60)}
    assert {round(v) for v in seen} == {0, 100}  # either north row, never the filtered-out one


@pytest.mark.parametrize("k", [1, 2, 7])
def test_bound_contributions_keeps_min_of_count_and_k_per_unit(k):
    rng = np.random.default_rng(3)
    units = rng.integers(0, 500, 50_000).astype(np.int32)
    mask = rng.random(50_000) < 0.7
    kept, dropped = unit_rules.bound_contributions(mask, units, 500, k, np.random.default_rng())
    assert not (kept & ~mask).any()
    per_unit = np.bincount(units[kept], minlength=500)
    assert np.array_equal(per_unit, np.minimum(np.bincount(units[mask], minlength=500), k))
    assert dropped == mask.sum() - kept.sum()


def test_string_and_sparse_unit_ids_are_bounded_too():
    frame = heavy_unit_frame(50, 10)
    for ids in (frame["pid"].map(lambda i: f"patient-{i}"), frame["pid"] * 10**12):
        assert run("count", {"epsilon": HUGE, "max_rows_per_unit": 2}, frame.assign(pid=ids), HEAVY_META)[
            "value"] == 12


# --------------------------------------------------------------------------- the run contract


def test_progress_is_reported_in_phases_and_cancellation_propagates(frame, table):
    ds = meta(frame)
    seen = []
    run("mean", {"column": "age", "epsilon": 1.0}, table, ds, seen.append)
    fractions = [p["fraction"] for p in seen]
    assert len(seen) >= 4 and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert all(isinstance(p["phase"], str) for p in seen)

    def cancel(p):
        if p["fraction"] >= 0.05:  # heard while the exact answer is computed, no noise drawn yet
            raise Cancelled("stop")
    with pytest.raises(Cancelled) as exc:
        run("count", {"epsilon": 1.0}, table, ds, cancel)
    # a one-shot mechanism keeps the whole plan (no event named): a free cancel would time
    # the data-dependent computation at no cost (engines/types.before_the_first_step)
    assert exc.value.actual_event is None


def test_a_run_refuses_noise_weaker_than_the_plan_paid_for(frame, table):
    ds = meta(frame, unit=False)
    req = EngineRequest("count", {"epsilon": 1.0})
    plan = plugins.plan("aggregates", req, ds)
    plan.details["components"]["count"]["scale"] /= 2
    with pytest.raises(EngineError):
        plugins.run("aggregates", req, ds, table, plan, lambda p: None)


def test_results_never_hold_rows(frame, table):
    ds = meta(frame)
    for kind, extra in [("count", {}), ("sum", {"column": "income"}), ("histogram", {"column": "code"}),
                        ("variance", {"column": "age", "group_by": "site"})]:
        r = run(kind, {"epsilon": 1.0, **extra}, table, ds)
        assert len(json.dumps(r)) < 2_000


# --------------------------------------------------------------------------- a pandas reference


small_frames = st.integers(0, 40).flatmap(lambda n: st.fixed_dictionaries({
    "x": st.lists(st.one_of(st.none(), st.floats(-50, 150, allow_nan=False)), min_size=n, max_size=n),
    "c": st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "z"])), min_size=n, max_size=n),
}))
predicates = st.one_of(
    st.fixed_dictionaries({"column": st.just("x"), "op": st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
                           "value": st.sampled_from([-10.0, 0.0, 25.5, 50.0, 120.0])}),
    st.fixed_dictionaries({"column": st.just("x"), "op": st.sampled_from(["in", "not_in"]),
                           "value": st.lists(st.sampled_from([0.0, 50.0, 1.5]), min_size=1, max_size=3)}),
    # literals from the declared domain only (others are refused: test_a_literal_outside_the_domain_...);
    # the rows hold "z", outside it
    st.fixed_dictionaries({"column": st.just("c"), "op": st.sampled_from(["==", "!="]),
                           "value": st.sampled_from(["a", "b", "c"])}),
    st.fixed_dictionaries({"column": st.just("c"), "op": st.sampled_from(["in", "not_in"]),
                           "value": st.lists(st.sampled_from(["a", "c"]), min_size=1, max_size=3)}),
)
SMALL_META = DatasetMeta("s", {"x": {"type": "numeric", "lower": 0, "upper": 100},
                               "c": {"type": "categorical", "domain": ["a", "b", "c"]}}, None, 40, 40, 1e-6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=small_frames, where=st.lists(predicates, max_size=3), grouped=st.booleans(),
       kind=st.sampled_from(["count", "sum"]))
def test_predicates_and_grouping_equal_a_pandas_reference(data, where, grouped, kind):
    frame = pd.DataFrame({"x": pd.array(data["x"], dtype="Float64"), "c": pd.array(data["c"], dtype="string")})
    table = pa.table({"x": pa.array(data["x"], pa.float64()), "c": pa.array(data["c"], pa.string())})
    params = {"epsilon": HUGE, "where": where}
    if kind == "sum":
        params["column"] = "x"
    if grouped:
        params["group_by"] = "c"
    r = run(kind, params, table, SMALL_META)

    ref = pandas_where(frame, where)
    if kind == "sum":
        ref = ref[ref["x"].notna()]
    value = (lambda rows: len(rows)) if kind == "count" else (lambda rows: float(rows["x"].clip(0, 100).sum()))
    if grouped:
        assert [g["key"] for g in r["groups"]] == ["a", "b", "c"]
        for g in r["groups"]:
            assert g["value"] == pytest.approx(value(ref[ref["c"] == g["key"]]), abs=1e-3)
    else:
        assert r["value"] == pytest.approx(value(ref), abs=1e-3)


@pytest.mark.parametrize("q,epsilon", [(0.5, 1.0), (0.9, 0.3), (0.01, 2.0)])
def test_a_quantiles_interval_holds_the_true_quantile_about_95_percent_of_the_time(frame, table, q, epsilon):
    ds = meta(frame, unit=False)
    inc = frame["income"].dropna().clip(0, 100_000)
    truth = float(np.quantile(inc, q))
    params = {"column": "income", "q": q, "epsilon": epsilon}
    req = EngineRequest("quantile", params)
    plan = plugins.plan("aggregates", req, ds)
    hits, widths = 0, []
    for _ in range(60):
        r = plugins.run("aggregates", req, ds, table, plan, lambda u: None).result
        lo, hi = r["ci95"]
        hits += lo <= truth <= hi
        widths.append(hi - lo)
    assert hits >= 52  # 95% nominal: P(at most 51 of 60) < 1e-3 at 95%
    assert np.median(widths) < 10_000  # and informative: a tenth of the declared range at most


def test_a_counts_interval_does_not_reach_below_zero_and_holds_its_value():
    """A probe at epsilon 0.05: an empty group's count released as -12 with [-72, 48], and
    333 of 400 count intervals started below 0. No count is below 0 (post-processing); the
    value is left as drawn (unbiased) and stays inside its interval."""
    frame = pd.DataFrame({"c": ["a"] * 30})
    ds = DatasetMeta("t", {"c": {"type": "categorical", "domain": ["a", "b"]}}, None, 30, 30, 1e-6)
    seen_negative = False
    for _ in range(40):
        for g in run("count", {"group_by": "c", "epsilon": 0.05}, frame, ds)["groups"]:
            lo, hi = g["ci95"]
            assert lo <= g["value"] <= hi and lo >= min(0, g["value"])
            seen_negative |= g["value"] < 0
    assert seen_negative  # the values themselves are not clipped


def test_a_quantiles_interval_on_tied_values_holds_when_the_columns_decimals_are_declared():
    """A probe's weather table: precipitation mostly 0, wind on steps of 1.15 mph: between
    two values every candidate has the same score, the ends landed anywhere on that flat
    run below the quantile, and the interval held it in 50-57% of runs. Declared with its
    decimals, the ends are rounded out to them, as a declared-integer column's are (and
    the interval is narrow); undeclared, an end not confirmed on its side is the bound."""
    rng = np.random.default_rng(11)
    x = np.where(rng.random(5000) < 0.45, 1.2, rng.integers(0, 50, 5000) / 10)  # 45% tied at 1.2
    table = pa.table({"x": x})
    q = float(np.mean(x < 1.2)) + 0.2  # inside the tie block: the quantile is 1.2
    truth = float(np.quantile(x, q, method="lower"))
    assert truth == 1.2

    def coverage(spec):
        ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 0, "upper": 5, **spec}}, None, 5000, 5000, 1e-6)
        req = EngineRequest("quantile", {"column": "x", "q": q, "epsilon": 1.0})
        plan = plugins.plan("aggregates", req, ds)
        cis = [plugins.run("aggregates", req, ds, table, plan, lambda u: None).result["ci95"] for _ in range(60)]
        return sum(lo <= truth <= hi for lo, hi in cis)

    assert coverage({"decimals": 1}) >= 52
    # undeclared, each end is confirmed on its side by a noisy count, else is the bound
    assert coverage({"integer": False}) >= 52


def test_a_quantile_of_a_declared_integer_column_is_the_whole_number_sql_gives():
    """A probe: the candidates were 1,024 points spaced evenly between the bounds, no whole
    number among them; on tied integer data every one between two integers scores alike, so
    the median of children came out 1.10-1.97 at epsilon 1e5 where SQL says 2. On a column
    declared integer every candidate is a whole number: all of them here."""
    from engines.aggregates.planner import grid_span

    rng = np.random.default_rng(5)
    x = rng.binomial(8, 0.3, size=3000)  # every whole number between the quartiles held
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 0, "upper": 8, "integer": True}}, None, 3000, 3000, 1e-6)
    for q in (0.25, 0.5, 0.9):
        # the best whole numbers by OpenDP's score, |(1 - q) #(x < c) - q #(x > c)|
        scores = {c: abs((1 - q) * np.sum(x < c) - q * np.sum(x > c)) for c in range(9)}
        best = {c for c, v in scores.items() if v == min(scores.values())}
        r = run("quantile", {"column": "x", "q": q, "epsilon": 1e5}, pa.table({"x": x}), ds)
        assert r["value"] in best, (q, r["value"], best)
    assert r["value"] == np.quantile(x, 0.9, method="lower")  # here as SQL's too
    # wider than the candidates: whole steps, inside the bounds, as many as allowed at most
    for lo, hi, n in [(0, 8, 1024), (0, 100_000, 1024), (-3.5, 2_000.2, 100), (1, 2, 1024)]:
        a, b, count = grid_span(lo, hi, n, True)
        grid = np.linspace(a, b, count)
        assert lo <= a and b <= hi and count <= n and np.all(grid == np.round(grid)), (lo, hi, n)
    assert grid_span(0.5, 99.5, 1024, False) == (0.5, 99.5, 1024)
    # a second probe: bounds holding one whole number got a grid of fractions (2.02 on [2, 2.9]):
    # refused; whole steps short of the upper bound (0, 4, 8 on [0, 10]) gave a column all 10
    # the interval [0, 8]: the ends reach the declared bounds
    for lo, hi in [(7, 7), (2, 2.9), (0.2, 0.8)]:
        with pytest.raises(PlanError, match="at most one whole number"):
            grid_span(lo, hi, 100, True)
    tens = pa.table({"x": np.full(300, 10)})
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 0, "upper": 10, "integer": True}}, None, 300, 300, 1e-6)
    for _ in range(5):
        r = run("quantile", {"column": "x", "q": 0.5, "epsilon": 5.0, "candidates": 4}, tens, ds)
        assert r["candidates"] == {"lower": 0.0, "upper": 8.0, "count": 3} and r["ci95"][1] == 10.0, r


def test_a_quantile_on_decimals_with_bounds_near_the_float_limit_runs_and_says_the_q_it_used():
    """A probe: decimals 9 on bounds [0, 1e300] made the ends' rounding overflow (inf) after
    the read, a charged failure in 18 of 20 runs; and q = 0.123457 ran as OpenDP's 0.1234
    while the result said 0.123457."""
    x = pa.table({"x": np.linspace(0, 1e300, 500)})
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 0, "upper": 1e300, "decimals": 9}}, None, 500, 500,
                     1e-6)
    for _ in range(5):
        r = run("quantile", {"column": "x", "q": 0.123457, "epsilon": 1.0}, x, ds)
        assert 0 <= r["ci95"][0] <= r["ci95"][1] <= 1e300
    assert r["q"] == 0.123457 and r["q_used"] == 0.1234


def test_an_empty_groups_quantile_interval_says_it_knows_nothing():
    """A probe: a declared group with no rows got a median with a confident interval
    (under half the range in 31% of runs); its ends' checks now find no rows past them."""
    rng = np.random.default_rng(1)
    table = pa.table({"x": rng.uniform(40000, 160000, 400), "g": rng.choice(["M", "F"], 400)})
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": 40000, "upper": 160000},
                           "g": {"type": "categorical", "domain": ["M", "F", "Other"]}}, None, 400, 400, 1e-6)
    narrow = 0
    for _ in range(40):
        groups = {g["key"]: g for g in run("quantile", {"column": "x", "q": 0.5, "epsilon": 1.0, "group_by": "g"},
                                           table, ds)["groups"]}
        lo, hi = groups["Other"]["ci95"]
        narrow += hi - lo < 60_000  # (an end's check passes on no rows with probability 2.5%)
    # narrow in 3 of 400 runs (0.75%; the ends' 2.5% at most): 7 or more of 40 with probability
    # 2e-8 (6e-5 at 2.5%), where "at most 2 of 20" failed one run in 2,000 (1 in 80 at 2.5%).
    # The probe's 31% gives 6 or fewer of 40 with probability 0.02
    assert narrow <= 6
    # at a very large epsilon the checks' margin is 0, and a group with no rows scores 0 on
    # every candidate: both ends were confirmed in 32 of 100 runs at epsilon 1000
    wide = [run("quantile", {"column": "x", "q": 0.5, "epsilon": 1000.0, "group_by": "g"}, table, ds)
            for _ in range(10)]
    assert all({g["key"]: g for g in r["groups"]}["Other"]["ci95"] == [40000.0, 160000.0] for r in wide)


def test_a_variance_whose_sum_of_squares_was_drawn_below_zero_has_an_interval_not_a_point():
    """The CI once caught [0, 0] at epsilon 0.01 (about once in 300 runs): the noisy sum of
    squares far below zero clipped every simulation at 0. The simulations now start from the
    nearest values a table could give, so the interval reaches above 0; the released value
    is the variance of those parts (0 here)."""
    from engines.aggregates import report
    from engines.aggregates.noise import Noise

    details = {"kind": "variance", "mechanism": "laplace", "bounds": [0.0, 10.0], "center": 5.0,
               "radius": 5.0, "group_by": None, "cost": {"epsilon": 0.01}, "max_rows_per_unit": 1}
    nz = {"count": Noise("laplace", 30.0, 1.0, True, False), "sum": Noise("laplace", 1500.0, 5.0, False, False),
          "sum_of_squares": Noise("laplace", 7500.0, 25.0, False, False)}
    noisy = {"count": 310.0, "sum": 40.0, "sum_of_squares": -30_000.0}
    out = report.ratio(details, noisy, nz, np.random.default_rng(3))
    assert out["value"] == 0.0
    lo, hi = out["ci95"]
    assert lo == 0.0 and hi > 1.0


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["mean", "variance"]), count=st.floats(-50, 5000), sum_=st.floats(-1e5, 1e5),
       sos=st.floats(-1e6, 1e6), scale=st.floats(0.01, 3000))
def test_a_mean_or_variance_lies_inside_its_interval_whatever_the_noise_drew(kind, count, sum_, sos, scale):
    """A probe: 0.5% of variances (a column at a bound, epsilon 0.1-0.3) were released outside
    their own interval, e.g. 21.99 with [0, 19.42]: the value came from the raw noisy parts,
    the interval from the feasible ones."""
    from engines.aggregates import report
    from engines.aggregates.noise import Noise

    details = {"kind": kind, "mechanism": "laplace", "bounds": [0.0, 10.0], "center": 5.0, "radius": 5.0,
               "group_by": None, "cost": {"epsilon": 0.1}, "max_rows_per_unit": 1}
    nz = {"count": Noise("laplace", scale / 10, 1.0, True, False), "sum": Noise("laplace", scale, 5.0, False, False)}
    noisy = {"count": float(round(count)), "sum": sum_}
    if kind == "variance":
        nz["sum_of_squares"] = Noise("laplace", scale * 5, 25.0, False, False)
        noisy["sum_of_squares"] = sos
    out = report.ratio(details, noisy, nz, np.random.default_rng(0))
    lo, hi = out["ci95"]
    assert lo <= out["value"] <= hi
    top = 10.0 if kind == "mean" else 25.0
    assert 0.0 <= lo and hi <= top


def test_intervals_at_a_small_epsilon_are_the_whole_range_never_a_point():
    """A probe at epsilon 0.01 on 300 rows: a variance's interval was [0, 0] in 9 of 40 runs
    and missed the value in 11, a median's collapsed to its pick or missed in 10. There the
    count could be under one row (the estimate says nothing) and the quantile's ends cannot
    reach their shift (every candidate's score is within q n of 0): the whole range; a
    variance's interval is never a point (its simulations clipped at 0 or the top)."""
    rng = np.random.default_rng(7)
    x = pd.DataFrame({"x": rng.uniform(0, 10, 300).round(3)})
    ds = DatasetMeta("ci", {"x": {"type": "numeric", "lower": 0, "upper": 10}}, None, 300, 300, 1e-6)
    for _ in range(5):
        lo, hi = run("variance", {"column": "x", "epsilon": 0.01}, x, ds)["ci95"]
        assert hi - lo > 1.0  # ([0, 0] was released; the true variance is about 8.3)
        assert run("quantile", {"column": "x", "q": 0.5, "epsilon": 0.01}, x, ds)["ci95"] == [0.0, 10.0]
        lo, hi = run("mean", {"column": "x", "epsilon": 0.01}, x, ds)["ci95"]
        assert lo < hi
    # where the ends can be told, an interval (an end its noisy check does not confirm is
    # the bound: 5.3% of the intervals here, 159 of 3,000 runs, so "3 of 5" failed one call
    # in 700; "5 of 10" one in 250,000). None of the 3,000 missed the median: an end stopped
    # 25 ranks from it at the median, 18 at the 1st percentile, 10 at the nearest, a tail of
    # about 2 ranks for each factor e: a miss about 5e-6 an interval, so one miss of 10 is
    # let pass (two: 1e-9), as often as "none of 5" lets pass a quarter of them missing
    cis = [run("quantile", {"column": "x", "q": 0.5, "epsilon": 2.0}, x, ds)["ci95"] for _ in range(10)]
    assert sum(not lo <= np.median(x["x"]) <= hi for lo, hi in cis) <= 1
    assert sum(0 < lo and hi < 10 for lo, hi in cis) >= 5
