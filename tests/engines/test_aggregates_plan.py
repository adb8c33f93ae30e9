"""The aggregates engine's plans: validation errors, events the ledger accepts, costs
taken from OpenDP's maps, sensitivities that scale with max_rows_per_unit. No data read."""

import json
import math

import jsonschema
import pytest

import engines.aggregates as agg
from engines import plugins
from engines.types import DatasetMeta, EngineRequest, PlanError
from accounting.events import parse_event

COLUMNS = {
    "pid": {"name": "pid", "type": "unit"},
    "age": {"name": "age", "type": "numeric", "lower": 18, "upper": 90, "integer": True},
    "income": {"name": "income", "type": "numeric", "lower": -1000, "upper": 200_000},
    "score": {"name": "score", "type": "numeric", "lower": None, "upper": None},  # no bounds
    "site": {"name": "site", "type": "categorical", "domain": ["north", "south", "east"]},
    "notes": {"name": "notes", "type": "text"},
}
UNITS = DatasetMeta(name="clinic", columns=COLUMNS, unit_column="pid", n_rows=10_000, n_units=2_000, delta=1e-6)
ROWS = DatasetMeta(name="rows", columns={k: v for k, v in COLUMNS.items() if k != "pid"}, unit_column=None,
                   n_rows=10_000, n_units=10_000, delta=1e-6)


def plan(kind, params, ds=UNITS):
    return plugins.plan("aggregates", EngineRequest(kind, params), ds)


def errors_of(kind, params, ds=UNITS) -> dict:
    with pytest.raises(PlanError) as info:
        plan(kind, params, ds)
    assert info.value.errors, info.value.message
    return info.value.errors


# --------------------------------------------------------------------------- engine_info


def test_engine_info_lists_kinds_queue_and_a_schema_per_kind():
    info = agg.engine_info()
    assert info["name"] == "aggregates" and info["queue"] == "cpu" and info["description"]
    assert info["kinds"] == ["count", "sum", "mean", "variance", "histogram", "quantile", "query"]
    assert set(info["params_schema"]) == set(info["kinds"])
    for schema in info["params_schema"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("kind, params", [
    ("count", {"epsilon": 0.5, "where": [{"column": "site", "op": "in", "value": ["north"]}]}),
    ("count", {"epsilon": 0.5, "where": [{"column": "site", "op": "is_null"},
                                         {"not": [{"column": "age", "op": "is_not_null", "value": None}]}]}),
    ("sum", {"column": "income", "rho": 0.1, "mechanism": "gaussian", "group_by": "site"}),
    ("histogram", {"column": "age", "bins": [18, 40, 90], "accuracy": {"halfwidth": 10}}),
    ("quantile", {"column": "age", "q": 0.9, "candidates": 200, "epsilon": 1}),
    ("query", {"select": [{"name": "site", "group": 0}, {"name": "n", "agg": "count"},
                          {"name": "m", "agg": "quantile", "column": "age", "q": 0.5}],
               "group_by": [{"column": "site"}], "epsilon": 1,
               "where": [{"or": [[{"column": "age", "op": "<", "value": 30}], [{"not": [
                   {"column": "site", "op": "==", "value": "north"}]}]]}]}),
])
def test_valid_params_match_the_published_schema_and_plan(kind, params):
    jsonschema.validate(params, agg.engine_info()["params_schema"][kind])
    parse_event(plan(kind, params).event)


def test_other_engines_get_none_from_every_hook():
    assert agg.plan("other", EngineRequest("count", {"epsilon": 1}), UNITS) is None
    assert agg.run("other", EngineRequest("count", {"epsilon": 1}), UNITS, None, None, None) is None


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kind, params, key", [
    ("sum", {"column": "nope", "epsilon": 1}, "column"),
    ("sum", {"epsilon": 1}, "column"),
    ("sum", {"column": "score", "epsilon": 1}, "column"),  # numeric without bounds
    ("sum", {"column": "site", "epsilon": 1}, "column"),  # categorical
    ("quantile", {"column": "score", "epsilon": 1}, "column"),
    ("sum", {"column": "pid", "epsilon": 1}, "column"),  # the unit column
    ("count", {"epsilon": 1, "where": [{"column": "notes", "op": "==", "value": "x"}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "pid", "op": "==", "value": 3}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "ghost", "op": "==", "value": 3}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "~", "value": 3}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "<", "value": "old"}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "<", "value": True}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "in", "value": list(range(1001))}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "in", "value": []}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "in", "value": 3}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "site", "op": "<", "value": "n"}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "site", "op": "==", "value": None}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "==", "value": 3, "x": 1}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "=="}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": {"column": "age"}}, "where"),
    ("count", {"epsilon": 0}, "epsilon"),
    ("count", {"epsilon": -1}, "epsilon"),
    ("count", {"epsilon": float("nan")}, "epsilon"),
    ("count", {"epsilon": float("inf")}, "epsilon"),
    ("count", {"epsilon": "1"}, "epsilon"),
    ("count", {"epsilon": True}, "epsilon"),
    ("count", {"epsilon": 10**400}, "epsilon"),
    ("count", {}, "epsilon"),
    ("count", {"epsilon": 1, "rho": 1}, "rho"),
    ("count", {"epsilon": 1, "accuracy": {"halfwidth": 3}}, "accuracy"),
    ("count", {"rho": 0.5}, "rho"),  # rho without the gaussian mechanism
    ("count", {"epsilon": 1, "mechanism": "gaussian"}, "epsilon"),
    ("count", {"rho": 0, "mechanism": "gaussian"}, "rho"),
    ("count", {"epsilon": 1, "mechanism": "exponential"}, "mechanism"),
    ("count", {"epsilon": 1, "mechanism": "staircase"}, "mechanism"),
    ("count", {"accuracy": {"halfwidth": 0}}, "accuracy"),
    ("count", {"accuracy": 5}, "accuracy"),
    ("count", {"accuracy": {"halfwidth": 5, "alpha": 0.1}}, "accuracy"),
    ("mean", {"column": "age", "accuracy": {"halfwidth": 1}}, "accuracy"),
    ("variance", {"column": "age", "accuracy": {"halfwidth": 1}}, "accuracy"),
    ("quantile", {"column": "age", "accuracy": {"halfwidth": 1}}, "accuracy"),
    ("quantile", {"column": "age", "q": 0, "epsilon": 1}, "q"),
    ("quantile", {"column": "age", "q": 1, "epsilon": 1}, "q"),
    ("quantile", {"column": "age", "q": 1.5, "epsilon": 1}, "q"),
    ("quantile", {"column": "age", "q": 5e-5, "epsilon": 1}, "q"),  # OpenDP's 10,000ths: it was the minimum
    ("quantile", {"column": "age", "q": 0.99995, "epsilon": 1}, "q"),
    ("quantile", {"column": "age", "q": "half", "epsilon": 1}, "q"),
    ("quantile", {"column": "age", "candidates": 1, "epsilon": 1}, "candidates"),
    ("quantile", {"column": "age", "candidates": 100_001, "epsilon": 1}, "candidates"),
    ("quantile", {"column": "age", "epsilon": 1, "mechanism": "laplace"}, "mechanism"),
    ("quantile", {"column": "age", "rho": 1, "mechanism": "gaussian"}, "mechanism"),
    ("count", {"epsilon": 1, "group_by": "income"}, "group_by"),  # no declared domain, not integer
    ("count", {"epsilon": 1, "group_by": "score"}, "group_by"),  # no bounds
    ("count", {"epsilon": 1, "group_by": "notes"}, "group_by"),
    ("count", {"epsilon": 1, "group_by": "ghost"}, "group_by"),
    ("histogram", {"column": "age", "bins": [18, 60, 40], "epsilon": 1}, "bins"),  # unsorted
    ("histogram", {"column": "age", "bins": [18, 40, 40], "epsilon": 1}, "bins"),  # repeated edge
    ("histogram", {"column": "age", "bins": [10, 40, 90], "epsilon": 1}, "bins"),  # below lower
    ("histogram", {"column": "age", "bins": [18, 40, 95], "epsilon": 1}, "bins"),  # above upper
    ("histogram", {"column": "age", "bins": [18], "epsilon": 1}, "bins"),
    ("histogram", {"column": "age", "bins": [18, "x"], "epsilon": 1}, "bins"),
    ("histogram", {"column": "age", "epsilon": 1}, "bins"),
    ("histogram", {"column": "site", "bins": [0, 1], "epsilon": 1}, "bins"),
    ("histogram", {"column": "score", "bins": [0, 1], "epsilon": 1}, "column"),
    ("histogram", {"column": "site", "epsilon": 1, "group_by": "site"}, "group_by"),
    ("count", {"epsilon": 1, "max_rows_per_unit": 0}, "max_rows_per_unit"),
    ("count", {"epsilon": 1, "max_rows_per_unit": 1001}, "max_rows_per_unit"),
    ("count", {"epsilon": 1, "max_rows_per_unit": 2.5}, "max_rows_per_unit"),
    ("count", {"epsilon": 1, "max_rows_per_unit": True}, "max_rows_per_unit"),
    ("count", {"epsilon": 1, "colour": "blue"}, "colour"),  # unknown key
    ("count", {"epsilon": 1, "where": [{"not": []}]}, "where[0]"),  # no row: charged for nothing
    ("count", {"epsilon": 1, "where": [{"not": [{"or": [[], []]}]}]}, "where[0].not[0]"),  # nor is an empty branch
    ("count", {"epsilon": 1, "column": "notes"}, "column"),  # COUNT(column): a declared numeric/categorical
    ("count", {"epsilon": 1, "column": "pid"}, "column"),  # not the unit column
    ("count", {"epsilon": 1, "column": "nope"}, "column"),
    ("sum", {"column": "age", "epsilon": 1, "q": 0.5}, "q"),
    ("count", {"epsilon": 1, "where": [{"column": "site", "op": "==", "value": "atlantis"}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "site", "op": "not_in", "value": ["north", "x"]}]}, "where[0]"),
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "is_null", "value": 3}]}, "where[0]"),  # no value
    ("count", {"epsilon": 1, "where": [{"column": "notes", "op": "is_null"}]}, "where[0]"),  # a text column
    ("count", {"epsilon": 1, "where": [{"column": "age", "op": "<"}]}, "where[0]"),  # a value is needed
])
def test_bad_input_is_a_plan_error_naming_the_parameter(kind, params, key):
    assert key in errors_of(kind, params)


def test_k_above_one_needs_a_unit_column():
    assert "max_rows_per_unit" in errors_of("count", {"epsilon": 1, "max_rows_per_unit": 2}, ROWS)
    assert plan("count", {"epsilon": 1, "max_rows_per_unit": 1}, ROWS)


def test_every_problem_is_reported_at_once():
    errs = errors_of("sum", {"column": "ghost", "epsilon": -1, "max_rows_per_unit": 0, "junk": 1})
    assert {"column", "epsilon", "max_rows_per_unit", "junk"} <= set(errs)


def test_params_must_be_an_object():
    with pytest.raises(PlanError):
        plan("count", ["epsilon", 1])


def test_columns_read_are_exactly_the_ones_used():
    p = plan("mean", {"column": "income", "group_by": "site", "epsilon": 1,
                      "where": [{"column": "age", "op": ">", "value": 30}, {"column": "income", "op": "<", "value": 5}]})
    assert p.columns == ["income", "site", "age"]
    assert plan("count", {"epsilon": 1}).columns == []


# --------------------------------------------------------------------------- events and costs


def test_count_epsilon_is_openDP_map_of_the_laplace_it_runs():
    p = plan("count", {"epsilon": 0.5})
    ev = parse_event(p.event)
    assert p.event["kind"] == "laplace" and ev.epsilon == pytest.approx(0.5, rel=1e-9) and ev.epsilon <= 0.5
    comp = p.details["components"]["count"]
    assert comp["sensitivity"] == 1 and comp["scale"] == pytest.approx(2.0) and comp["integer"] is True
    json.dumps(p.details)  # stored with the request


@pytest.mark.parametrize("eps", [1e-3, 0.1, 0.3, 1 / 3, 0.7, 2.0, 9.99, 1e4])
def test_charged_epsilon_never_exceeds_the_request(eps):
    for kind, extra in [("count", {}), ("sum", {"column": "income"}), ("mean", {"column": "income"}),
                        ("variance", {"column": "age"}), ("quantile", {"column": "age", "q": 0.3})]:
        ev = parse_event(plan(kind, {"epsilon": eps, **extra}).event)
        total = sum(leaf.epsilon for leaf in ev.leaves())
        assert eps * (1 - 1e-9) <= total <= eps, (kind, eps, total)


def test_gaussian_event_has_the_noise_multiplier_of_openDPs_rho():
    p = plan("sum", {"column": "income", "mechanism": "gaussian", "rho": 0.5})
    ev = parse_event(p.event)
    assert p.event["kind"] == "gaussian" and set(p.event) == {"kind", "noise_multiplier"}
    assert ev.noise_multiplier == pytest.approx(1.0, rel=1e-9) and ev.noise_multiplier <= 1.0
    comp = p.details["components"]["sum"]
    # noise std = multiplier x L2 sensitivity (to OpenDP's rounding)
    assert comp["scale"] == pytest.approx(ev.noise_multiplier * comp["sensitivity"], rel=1e-9)
    assert p.details["cost"]["rho"] == pytest.approx(0.5, rel=1e-9)


def test_mean_and_variance_split_the_budget_into_composed_events():
    mean = plan("mean", {"column": "age", "epsilon": 1.0}).event
    assert mean["kind"] == "composed" and [e["kind"] for e in mean["events"]] == ["laplace", "laplace"]
    assert [e["epsilon"] for e in mean["events"]] == pytest.approx([0.5, 0.5])
    var = plan("variance", {"column": "age", "rho": 0.3, "mechanism": "gaussian"}).event
    parse_event(var)
    assert [e["kind"] for e in var["events"]] == ["gaussian"] * 3
    assert [e["noise_multiplier"] for e in var["events"]] == pytest.approx([1 / math.sqrt(0.2)] * 3)


def test_quantile_is_an_exponential_mechanism_epsilon_delta_event():
    p = plan("quantile", {"column": "age", "q": 0.5, "epsilon": 0.8})
    assert p.event == {"kind": "epsilon_delta", "epsilon": pytest.approx(0.8), "delta": 0.0}
    parse_event(p.event)
    qd = p.details["quantile"]
    assert qd["grid"] == {"lower": 18.0, "upper": 90.0, "count": 73}  # age is declared integer: each whole year
    assert (qd["alpha_num"], qd["alpha_den"]) == (1, 2)
    # report-noisy-max on scores of sensitivity 1 (q = 1/2): epsilon = 2 * 1 / scale; 7/16 of
    # the budget for the answer, 7/32 for each end of its interval and 1/16 for each end's
    # check, a discrete Laplace of sensitivity k max(num, den - num) = 1: epsilon = 1 / scale
    assert qd["scale"] == pytest.approx(2 / 0.35) and qd["interval"]["scale"] == pytest.approx(2 / 0.175)
    check = qd["interval"]["check"]
    assert (check["mechanism"], check["integer"], check["sensitivity"]) == ("laplace", True, 1)
    assert check["scale"] == pytest.approx(1 / 0.05) and check["epsilon"] == pytest.approx(0.05)
    assert qd["epsilon"] + 2 * qd["interval"]["epsilon"] + 2 * check["epsilon"] == pytest.approx(0.8)


@pytest.mark.parametrize("kind, extra, name, per_row", [
    ("count", {}, "count", 1),
    ("histogram", {"column": "site"}, "count", 1),
    ("sum", {"column": "income"}, "sum", 200_000),  # max(|lower|, |upper|)
    ("sum", {"column": "income", "group_by": "site"}, "sum", 200_000),
    ("mean", {"column": "age"}, "sum", 36),  # centred: (upper - lower) / 2
    ("variance", {"column": "age"}, "sum_of_squares", 36**2),
])
@pytest.mark.parametrize("k", [1, 3, 1000])
def test_sensitivity_and_scale_grow_with_k_at_equal_cost(kind, extra, name, per_row, k):
    base = plan(kind, {"epsilon": 1.0, **extra})
    p = plan(kind, {"epsilon": 1.0, "max_rows_per_unit": k, **extra})
    comp, comp1 = p.details["components"][name], base.details["components"][name]
    assert comp["sensitivity"] == k * per_row
    assert comp["scale"] == pytest.approx(k * comp1["scale"], rel=1e-9)
    assert p.details["max_rows_per_unit"] == k
    assert p.details["cost"] == pytest.approx(base.details["cost"])


def test_quantile_sensitivity_grows_with_k():
    one = plan("quantile", {"column": "age", "epsilon": 1.0})
    five = plan("quantile", {"column": "age", "epsilon": 1.0, "max_rows_per_unit": 5})
    assert five.details["quantile"]["score_sensitivity"] == 5 * one.details["quantile"]["score_sensitivity"]
    assert five.details["quantile"]["scale"] == pytest.approx(5 * one.details["quantile"]["scale"])
    assert five.event["epsilon"] == pytest.approx(1.0)


def test_quantile_with_a_non_dyadic_q_uses_openDPs_integer_alpha():
    qd = plan("quantile", {"column": "age", "q": 0.3, "epsilon": 1}).details["quantile"]
    assert (qd["alpha_num"], qd["alpha_den"]) == (3000, 10_000)
    assert qd["score_sensitivity"] == 7000


@pytest.mark.parametrize("mechanism, budget, kind, extra", [
    ("laplace", "epsilon", "count", {}),
    ("gaussian", "rho", "count", {}),
    ("laplace", "epsilon", "sum", {"column": "income"}),
    ("gaussian", "rho", "sum", {"column": "income"}),
    ("laplace", "epsilon", "histogram", {"column": "site"}),
])
def test_accuracy_is_converted_to_the_cost_that_gives_that_interval(mechanism, budget, kind, extra):
    from engines.aggregates.noise import Noise

    costs = []
    for h in (10.0, 100.0, 10_000.0):
        p = plan(kind, {"mechanism": mechanism, "accuracy": {"halfwidth": h}, **extra})
        parse_event(p.event)
        (comp,) = p.details["components"].values()
        assert Noise.from_dict(comp).halfwidth() == pytest.approx(h, rel=0.01)
        costs.append(p.details["cost"][budget])
    assert costs[0] > costs[1] > costs[2] > 0


def test_grouped_and_histogram_plans_use_vector_measurements_with_one_event():
    p = plan("count", {"epsilon": 1.0, "group_by": "site"})
    assert p.details["components"]["count"]["vector"] is True and p.event["kind"] == "laplace"
    h = plan("histogram", {"column": "age", "bins": [18, 30, 50, 90], "epsilon": 1.0})
    assert h.details["histogram"]["labels"] == ["[18, 30)", "[30, 50)", "[50, 90]"]


@pytest.mark.parametrize("kind, params, key", [
    ("sum", {"column": "income", "epsilon": 1e-320}, "epsilon"),
    ("count", {"epsilon": 1e-300}, "epsilon"),  # count noise beyond any count
    ("count", {"rho": 1e-300, "mechanism": "gaussian"}, "rho"),
    ("histogram", {"column": "site", "accuracy": {"halfwidth": 1e300}}, "accuracy"),
])
def test_absurd_budgets_are_plan_errors_not_crashes(kind, params, key):
    assert key in errors_of(kind, params)


def test_a_plan_never_needs_data():
    # plan() receives no data at all; its details are plain JSON
    p = plan("variance", {"column": "income", "group_by": "site", "epsilon": 1, "max_rows_per_unit": 4})
    assert json.loads(json.dumps(p.details)) == p.details


def test_a_literal_outside_the_declared_domain_is_refused_before_any_data():
    err = errors_of("count", {"epsilon": 1, "where": [{"column": "site", "op": "==", "value": "atlantis"}]})
    assert "'atlantis' is not in the declared domain of 'site'" in err["where[0]"]
    # declared values pass; numbers outside a numeric column's bounds are allowed (raw values are compared)
    plan("count", {"epsilon": 1, "where": [{"column": "site", "op": "in", "value": ["north", "east"]},
                                           {"column": "age", "op": ">", "value": 200}]})


def test_a_quantile_on_bounds_too_wide_for_its_grid_says_so():
    wide = {**COLUMNS, "income": {**COLUMNS["income"], "lower": -1e308, "upper": 1e308}}
    ds = DatasetMeta(name="wide", columns=wide, unit_column="pid", n_rows=10_000, n_units=2_000, delta=1e-6)
    errors = errors_of("quantile", {"column": "income", "q": 0.5, "epsilon": 0.1}, ds)
    assert "too wide" in json.dumps(errors)


@pytest.mark.parametrize("kind, bounds, epsilon, says", [
    ("mean", (-0.0, 5e-324), 1.0, "bounds this narrow"),
    ("variance", (0.0, 1e-300), 1.0, "bounds this narrow"),
    ("quantile", (0.0, 100.0), 5e-324, "is not a positive number"),
])
def test_a_budget_or_bounds_that_cannot_be_calibrated_say_why(kind, bounds, epsilon, says):
    """Bounds of 5e-324 were refused as a budget problem ("cannot calibrate the noise to
    epsilon=1.0"), and a quantile at epsilon 5e-324 said "float division by zero"."""
    ds = DatasetMeta("t", {"x": {"type": "numeric", "lower": bounds[0], "upper": bounds[1]}}, None, 1000, 1000, 1e-6)
    with pytest.raises(PlanError) as e:
        plugins.plan("aggregates", EngineRequest(kind, {"column": "x", "epsilon": epsilon,
                                                        **({"q": 0.5} if kind == "quantile" else {})}), ds)
    assert says in str(e.value) and "division" not in str(e.value)


def test_a_group_by_on_too_many_integers_says_how_many():
    """A probe's integer column on [0, 10**12] was refused with "'big' is 'numeric' declared
    integer", which it was: the count of its values is what stands in the way."""
    cols = {"big": {"type": "numeric", "lower": 0, "upper": 10**12, "integer": True},
            "none": {"type": "numeric", "lower": 0.2, "upper": 0.8, "integer": True}}
    ds = DatasetMeta("t", cols, None, 1000, 1000, 1e-6)
    assert "[0, 1e+12]: 1,000,000,000,001 values" in errors_of("count", {"group_by": "big", "epsilon": 1}, ds)["group_by"]
    assert "no integer in its bounds" in errors_of("count", {"group_by": "none", "epsilon": 1}, ds)["group_by"]
