"""Fuzzing the two parsers that take analysts' JSON apart: the mechanism-event parser
(``accounting.events``) and the aggregates engine's parameter and ``where``
predicate parser (``engines.aggregates.params``), with Hypothesis.

The contract: a value comes back, or the documented error (``EventError``; ``PlanError``)
is raised. Never another exception, never a hang: every call is timed. What the parsers
accept must then work downstream, since anything else would be a 500 or a failed request
that keeps its charge: accepted events compose under every accountant (what
``/api/compose/`` does) and round-trip through JSON; accepted aggregates parameters plan
(the event parses, the plan is strict JSON, as the database stores it) and run on a real
table with nulls, NaN and mixed types, without an exception.

tests/accounting/test_events.py already fuzzes ``parse_event`` with small arbitrary JSON;
these add the hostile values (strategies.py), nesting thousands deep, lists past the
2,000-event limit and the downstream checks.

Settings: ``CI_EXAMPLES`` derandomized examples per test by default; ``HOSTILE_FULL=1``
runs ``FULL_EXAMPLES`` random ones.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from engines.aggregates import execute as agg_execute
from engines.aggregates import params as agg_params
from engines.aggregates.planner import make_plan
from engines.types import DatasetMeta, EngineRequest, PlanError
from accounting import ACCOUNTANTS
from accounting import events as ev
from accounting.events import EventError, parse_event, parse_events

from .conftest import fuzz_settings
from .strategies import (
    EVENT_FIELDS,
    deeply_nested,
    events,
    floats,
    integers,
    json_trees,
    plausible_events,
    plausible_params,
    scalars,
    texts,
)

CI_EXAMPLES = 150
FULL_EXAMPLES = 5_000
FUZZ = fuzz_settings(CI_EXAMPLES, FULL_EXAMPLES)
FEW = fuzz_settings(60, 3_000)  # the slower end-to-end properties
SLOW = 2.0  # CPU seconds: a parse or validation slower than this is a hang in waiting


class timed:
    """A hang guard in this process's CPU time (not the wall clock a shared machine stretches)."""

    def __enter__(self):
        self.start = time.process_time()
        return self

    def __exit__(self, *exc):
        cpu = time.process_time() - self.start
        assert cpu < SLOW, f"took {cpu:.2f} CPU s"


# --------------------------------------------------------------------------- events

def big_lists():
    """Lists of valid events around and past MAX_NODES, with one hostile event somewhere."""
    @st.composite
    def build(draw):
        n = draw(st.sampled_from([ev.MAX_NODES - 1, ev.MAX_NODES, ev.MAX_NODES + 1, 10_000]) | st.integers(0, 50))
        items = [{"kind": "laplace", "epsilon": 0.001}] * n
        if n and draw(st.booleans()):
            items = list(items)
            items[draw(st.integers(0, n - 1))] = draw(events())
        return items if draw(st.booleans()) else {"kind": "composed", "events": items}
    return build()


any_event_json = events() | plausible_events() | json_trees(keys=st.sampled_from(["kind", *EVENT_FIELDS]) | texts) \
    | deeply_nested(events() | scalars) | big_lists()


def check_parsed(event: ev.Event) -> None:
    """An accepted event is a real one: it round-trips through strict JSON and every
    accountant composes it (what /api/compose/ does) without an unexpected exception."""
    assert isinstance(event, ev.Event)
    data = event.to_dict()
    assert parse_event(json.loads(json.dumps(data, allow_nan=False))) == event
    for name, accountant in ACCOUNTANTS.items():
        try:
            spent = accountant.compose([event], 1e-6)
        except EventError:
            continue  # e.g. a Gaussian without a delta the accountant cannot resolve: a 400
        assert not math.isnan(spent.epsilon), (name, data)


@FUZZ
@given(any_event_json)
def test_parse_event_returns_an_event_or_raises_event_error(data):
    with timed():
        try:
            event = parse_event(data)
        except EventError as e:
            assert e.path.startswith("event") and e.message
            return
    with timed():
        check_parsed(event)


@FUZZ
@given(st.lists(any_event_json, max_size=5) | any_event_json)
def test_parse_events_returns_events_or_raises_event_error(data):
    with timed():
        try:
            parsed = parse_events(data)
        except EventError as e:
            assert e.path.startswith("events") and e.message
            return
    assert len(parsed) <= ev.MAX_NODES
    assert all(isinstance(e, ev.Event) for e in parsed)


@pytest.mark.parametrize("depth", [ev.MAX_DEPTH + 1, 1_000, 100_000])
def test_nesting_far_past_the_limit_is_refused_without_recursion(depth):
    data = {"kind": "no_op"}
    for _ in range(depth):
        data = {"kind": "composed", "events": [data]}
    with timed(), pytest.raises(EventError, match="nested too deeply"):
        parse_event(data)


def test_a_million_events_are_refused_quickly():
    with timed(), pytest.raises(EventError, match="too many events"):
        parse_events([{"kind": "no_op"}] * 1_000_000)
    with timed(), pytest.raises(EventError, match="too many events"):
        parse_event({"kind": "composed", "events": [{"kind": "no_op"}] * 1_000_000})


# ------------------------------------------------------------- aggregates parameters

UNIT = "pid"
COLUMNS = {
    "pid": {"name": "pid", "type": "unit"},
    "age": {"name": "age", "type": "numeric", "lower": 18, "upper": 90, "integer": True},
    "income": {"name": "income", "type": "numeric", "lower": -1e6, "upper": 1e9},
    "score": {"name": "score", "type": "numeric", "lower": None, "upper": None},
    "huge": {"name": "huge", "type": "numeric", "lower": -1e300, "upper": 1.7976931348623157e308},
    "tiny": {"name": "tiny", "type": "numeric", "lower": 0, "upper": 5e-324},
    "site": {"name": "site", "type": "categorical", "domain": ["north", "south", "east", "é", ""]},
    "code": {"name": "code", "type": "categorical", "domain": [1, 2, 3, 10]},
    "flag": {"name": "flag", "type": "categorical", "domain": [False, True]},
    "mixed": {"name": "mixed", "type": "categorical", "domain": ["1", 1.5, True, "x"]},
    "notes": {"name": "notes", "type": "text"},
}
DATASET = DatasetMeta(name="fuzz", columns=COLUMNS, unit_column=UNIT, n_rows=12, n_units=5, delta=1e-6)


def table() -> pa.Table:
    """Rows matching COLUMNS' types, with nulls, NaN, infinities and out-of-domain values."""
    return pa.table({
        "pid": pa.array([1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 5], pa.int64()),
        "age": pa.array([18, 25, None, 40, 90, 95, 17, 33, 60, 61, 70, 80], pa.int64()),
        "income": pa.array([0.0, -5.0, math.nan, None, 1e12, -math.inf, math.inf, 3.5, 2.0, 1e-300, -0.0, 7.0]),
        "score": pa.array([1.0] * 12),
        "huge": pa.array([1e308, -1e308, 1e300, None, math.inf, 0.0, 1.0, -1.0, 5e-324, 2.0, 1e300, 1e299]),
        "tiny": pa.array([0.0, 5e-324, 1e-320, None, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, math.nan]),
        "site": pa.array(["north", "south", None, "east", "west", "é", "", "north", "NORTH", "south", "x", None]),
        "code": pa.array([1, 2, 3, 10, 11, None, 1, 2, 3, 4, 5, 6], pa.int64()),
        "flag": pa.array([True, False, None, True, True, False, False, True, None, True, False, True]),
        "mixed": pa.array(["1", "1.5", "true", "x", None, "y", "1", "1", "x", "x", "1.5", "z"]),
        "notes": pa.array(["a"] * 12),
    })


OPS = list(agg_params.OPS)
column_names = st.sampled_from(sorted(COLUMNS)) | texts | scalars
values = scalars | st.lists(scalars, max_size=5) | st.lists(st.sampled_from(["north", 1, 2, True, 1.5, "1"]),
                                                            min_size=1, max_size=5)


@st.composite
def predicates(draw):
    p = {"column": draw(column_names), "op": draw(st.sampled_from(OPS) | texts | scalars), "value": draw(values)}
    if not draw(st.integers(0, 9)):
        p.pop(draw(st.sampled_from(sorted(p))))
    if not draw(st.integers(0, 9)):
        p[draw(texts)] = draw(scalars)
    return p


@st.composite
def aggregate_params(draw):
    """Parameters with the right keys and hostile values (or the wrong shapes altogether)."""
    kind = draw(st.sampled_from(agg_params.KINDS))
    keys = sorted(agg_params.COMMON_KEYS | agg_params.KIND_KEYS[kind])
    params = {}
    budget = draw(st.sampled_from(["epsilon", "rho", "accuracy", None, "two"]))
    if budget in ("epsilon", "rho", "two"):
        params["rho" if budget == "rho" else "epsilon"] = draw(st.sampled_from([0.1, 1.0, 1e-3]) | floats | scalars)
    if budget in ("accuracy", "two"):
        params["accuracy"] = draw(st.fixed_dictionaries({"halfwidth": floats | scalars}) | scalars)
    if budget == "rho" or draw(st.integers(0, 3)) == 0:
        params["mechanism"] = draw(st.sampled_from(["laplace", "gaussian", "exponential"]) | texts)
    if draw(st.booleans()):
        params["where"] = draw(st.lists(predicates(), max_size=4) | st.lists(predicates(), min_size=49, max_size=52)
                               | scalars)
    if "column" in keys and draw(st.integers(0, 5)):
        params["column"] = draw(column_names)
    if draw(st.integers(0, 2)) == 0:
        params["group_by"] = draw(column_names)
    if kind == "histogram" and draw(st.booleans()):
        params["bins"] = draw(st.lists(st.sampled_from([18, 30, 50, 90]) | floats | scalars, max_size=6)
                              | st.just(list(range(18, 91))) | scalars)
    if kind == "quantile":
        for key in ("q", "candidates"):
            if draw(st.booleans()):
                params[key] = draw(st.sampled_from([0.5, 0.25, 2, 100]) | floats | integers | scalars)
    if draw(st.integers(0, 3)) == 0:
        params["max_rows_per_unit"] = draw(st.sampled_from([1, 2, 3]) | integers | floats | scalars)
    if not draw(st.integers(0, 9)):
        params[draw(st.sampled_from(keys) | texts)] = draw(scalars)
    return kind, params


any_params = aggregate_params() | st.tuples(st.sampled_from(agg_params.KINDS) | texts,
                                             json_trees(keys=st.sampled_from(sorted(agg_params.COMMON_KEYS)) | texts))


def validated(kind, params):
    with timed():
        try:
            return agg_params.validate(kind, params, DATASET)
        except PlanError as e:
            assert e.message and isinstance(e.errors, dict) and e.errors
            # bounded: a few unknown keys, one entry per predicate, one per parameter
            assert len(e.errors) <= agg_params.MAX_UNKNOWN_REPORTED + agg_params.MAX_PREDICATES + 20
            return None


@FUZZ
@given(any_params)
def test_validate_returns_a_query_or_raises_plan_error(kind_params):
    kind, params = kind_params
    q = validated(kind, params)
    if q is None:
        return
    assert q.kind == kind
    for p in q.where:
        assert p["op"] in agg_params.OPS and p["column"] in COLUMNS and p["type"] in ("numeric", "categorical")


@FUZZ
@given(st.lists(predicates(), max_size=6))
def test_where_predicates_alone(where):
    q = validated("count", {"epsilon": 1.0, "where": where})
    if q is not None:
        mask = agg_execute.compute.predicate_mask(table(), q.where)
        assert mask.dtype == np.bool_ and mask.shape == (12,)


NUMERIC = ["age", "income", "huge", "tiny"]
CATEGORICAL = ["site", "code", "flag", "mixed"]
@FEW
@given(st.one_of(*[plausible_params(NUMERIC, CATEGORICAL)] * 3, aggregate_params()))
def test_accepted_params_plan_and_run_on_hostile_rows(kind_params):
    """Validated parameters plan (a parseable event, strict JSON details) and the run over
    rows with nulls, NaN, infinities and out-of-domain values raises nothing: a crash
    after the data is read would keep the analyst's charge."""
    kind, params = kind_params
    if validated(kind, params) is None:
        event("refused by validate")
        return
    request = EngineRequest(kind=kind, params=params)
    try:
        plan = make_plan(request, DATASET)
    except PlanError:
        event("refused by the planner")
        return  # e.g. an epsilon too small to calibrate: a 400
    event(f"ran {kind}")
    parse_event(plan.event)
    json.dumps({"event": plan.event, "details": plan.details, "columns": plan.columns}, allow_nan=False)
    data = table().select(sorted(set(plan.columns) | {UNIT}))
    release = agg_execute.execute(request, DATASET, data, plan, lambda update: None)
    json.dumps(release.result, allow_nan=False)


def test_an_accuracy_needing_a_noise_past_what_an_event_may_state_is_a_plan_error():
    """The fuzzer's case (CI, stop 56): a Gaussian sum over bounds [0, 5e-324] at a halfwidth
    of 0.5 planned a noise 3e161 times its sensitivity, an event the ledger refuses (a 500
    where a 400 is due)."""
    request = EngineRequest(kind="sum", params={"mechanism": "gaussian", "accuracy": {"halfwidth": 0.5},
                                                "column": "tiny"})
    with pytest.raises(PlanError, match="times the sensitivity"):
        make_plan(request, DATASET)
