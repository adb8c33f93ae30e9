"""Events: JSON round trips, and every malformed input refused with a useful EventError."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting import events as ev
from accounting.events import MAX_COUNT, MAX_DEPTH, MAX_NODES, EventError, parse_event, parse_events

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

EXAMPLES = {
    "laplace": [{"kind": "laplace", "epsilon": 0.1},
                {"kind": "laplace", "scale": 10.0, "sensitivity": 2.0}],
    "gaussian": [{"kind": "gaussian", "noise_multiplier": 4.0},
                 {"kind": "gaussian", "noise_multiplier": 4.0, "delta": 1e-7}],
    "subsampled_gaussian": [{"kind": "subsampled_gaussian", "sample_rate": 0.004, "noise_multiplier": 1.1,
                             "steps": 3000},
                            {"kind": "subsampled_gaussian", "sample_rate": 1.0, "noise_multiplier": 1.1,
                             "steps": 1, "delta": 1e-6}],
    "epsilon_delta": [{"kind": "epsilon_delta", "epsilon": 0.5, "delta": 1e-6},
                      {"kind": "epsilon_delta", "epsilon": 0.5, "delta": 0.0}],
    "self_composed": [{"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.1}, "count": 10}],
    "composed": [{"kind": "composed", "events": []},
                 {"kind": "composed", "events": [{"kind": "no_op"}, {"kind": "gaussian", "noise_multiplier": 2.0},
                                                 {"kind": "self_composed", "count": 3,
                                                  "event": {"kind": "composed", "events": [
                                                      {"kind": "non_private"}]}}]}],
    "no_op": [{"kind": "no_op"}],
    "non_private": [{"kind": "non_private"}],
}
ROUND_TRIPS = [pytest.param(d, id=f"{kind}-{i}") for kind, ds in EXAMPLES.items() for i, d in enumerate(ds)]


def test_every_kind_has_a_round_trip_example():
    assert set(EXAMPLES) == set(ev.KINDS)


@pytest.mark.parametrize("data", ROUND_TRIPS)
def test_it_round_trips_through_json(data):
    event = parse_event(data)
    assert isinstance(event, ev.Event)
    assert event.kind == data["kind"]
    assert event.to_dict() == data
    assert parse_event(event.to_dict()) == event
    assert parse_event(json.loads(json.dumps(event.to_dict()))) == event


def test_laplace_by_scale_has_epsilon_sensitivity_over_scale():
    assert parse_event({"kind": "laplace", "scale": 10, "sensitivity": 2}).epsilon == 0.2


def test_integral_floats_are_accepted_as_counts():
    event = parse_event({"kind": "subsampled_gaussian", "sample_rate": 0.1, "noise_multiplier": 1, "steps": 3.0})
    assert event.steps == 3 and isinstance(event.steps, int)


def test_parse_events_takes_one_event_or_a_list():
    assert parse_events({"kind": "no_op"}) == [ev.NoOpEvent()]
    assert parse_events([{"kind": "no_op"}, {"kind": "laplace", "epsilon": 1}]) == [
        ev.NoOpEvent(), ev.LaplaceEvent(1.0)]
    assert parse_events([]) == []


# ---------------------------------------------------------------------------- refusals

LAP = {"kind": "laplace"}
SG = {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.0}

MALFORMED = [
    ({"kind": "exponential", "epsilon": 1}, "unknown kind 'exponential'; known kinds: laplace"),
    ({"epsilon": 1}, "unknown kind None"),
    ({"kind": ["laplace"]}, "unknown kind"),
    ({"kind": {"a": 1}}, "unknown kind"),
    ({"kind": 3}, "unknown kind"),
    ({"kind": "gaussian"}, "'noise_multiplier' is required"),
    ({"kind": "epsilon_delta", "delta": 1e-5}, "'epsilon' is required"),
    ({"kind": "self_composed", "count": 2}, "'event' is required"),
    ({"kind": "self_composed", "event": {"kind": "no_op"}}, "'count' is required"),
    ({**SG}, "'steps' is required"),
    ({**LAP, "epsilon": -1.0}, "'epsilon' must be > 0, got -1.0"),
    ({**LAP, "epsilon": 0}, "'epsilon' must be > 0, got 0.0"),
    ({"kind": "epsilon_delta", "epsilon": 0.0, "delta": 0.0}, "'epsilon' must be > 0"),
    ({"kind": "gaussian", "noise_multiplier": 0}, "'noise_multiplier' must be > 0"),
    ({"kind": "gaussian", "noise_multiplier": -2}, "'noise_multiplier' must be > 0"),
    ({"kind": "epsilon_delta", "epsilon": 1, "delta": 1.0}, "'delta' must be < 1.0, got 1.0"),
    ({"kind": "epsilon_delta", "epsilon": 1, "delta": 1.5}, "'delta' must be < 1.0"),
    ({"kind": "epsilon_delta", "epsilon": 1, "delta": -1e-9}, "'delta' must be >= 0"),
    ({"kind": "gaussian", "noise_multiplier": 1, "delta": 1}, "'delta' must be < 1.0"),
    ({"kind": "gaussian", "noise_multiplier": 1, "delta": 0}, "'delta' must be > 0"),
    ({**SG, "steps": 1, "delta": 2.0}, "'delta' must be < 1.0"),
    ({**LAP, "epsilon": math.nan}, "'epsilon' must be finite, got nan"),
    ({**LAP, "epsilon": math.inf}, "'epsilon' must be finite, got inf"),
    ({**LAP, "epsilon": -math.inf}, "'epsilon' must be finite"),
    ({"kind": "epsilon_delta", "epsilon": 1, "delta": math.nan}, "'delta' must be finite"),
    ({"kind": "gaussian", "noise_multiplier": math.inf}, "'noise_multiplier' must be finite"),
    ({**LAP, "epsilon": 10**400}, "'epsilon' must be finite"),
    ({**LAP, "epsilon": True}, "'epsilon' must be a number, got bool"),
    ({"kind": "gaussian", "noise_multiplier": False}, "'noise_multiplier' must be a number, got bool"),
    ({**LAP, "epsilon": "0.1"}, "'epsilon' must be a number, got str"),
    ({**LAP, "epsilon": [0.1]}, "'epsilon' must be a number, got list"),
    ({**LAP, "epsilon": {"value": 0.1}}, "'epsilon' must be a number, got dict"),
    ({**LAP, "epsilon": 0.1, "seed": 1}, "unknown field(s) for laplace: seed"),
    ({"kind": "no_op", "epsilon": 0}, "unknown field(s) for no_op: epsilon"),
    ({"kind": "non_private", "reason": "x", "also": 1}, "unknown field(s) for non_private: also, reason"),
    ({**LAP, "epsilon": 0.1, "scale": 1.0, "sensitivity": 1.0}, "either 'epsilon' or 'scale' and 'sensitivity', not both"),
    ({**LAP, "epsilon": 0.1, "scale": 1.0}, "not both"),
    ({**LAP, "scale": 1.0}, "give 'epsilon', or both 'scale' and 'sensitivity'"),
    ({**LAP}, "give 'epsilon', or both"),
    ({**LAP, "scale": 1e-320, "sensitivity": 1e308}, "sensitivity / scale must be a finite positive epsilon"),
    ({**SG, "steps": 0}, "'steps' must be between 1 and 1000000000, got 0"),
    ({**SG, "steps": -5}, "'steps' must be between 1"),
    ({**SG, "steps": MAX_COUNT + 1}, "'steps' must be between 1"),
    ({**SG, "steps": 1.5}, "'steps' must be an integer, got 1.5"),
    ({**SG, "steps": "3"}, "'steps' must be an integer, got '3'"),
    ({**SG, "steps": True}, "'steps' must be an integer, got True"),
    ({**SG, "steps": math.nan}, "'steps' must be an integer"),
    ({**SG, "steps": None}, "'steps' must be an integer, got None"),
    ({"kind": "self_composed", "event": {"kind": "no_op"}, "count": 0}, "'count' must be between 1"),
    ({"kind": "self_composed", "event": {"kind": "no_op"}, "count": 2.5}, "'count' must be an integer"),
    ({**SG, "sample_rate": 1.0000001, "steps": 1}, "'sample_rate' must be <= 1.0"),
    ({**SG, "sample_rate": 0, "steps": 1}, "'sample_rate' must be > 0"),
    ({"kind": "composed", "events": {"kind": "no_op"}}, "'events' must be a list"),
    ({"kind": "composed"}, "'events' must be a list"),
    ([{"kind": "no_op"}], "an event must be a JSON object, got list"),
    ("laplace", "an event must be a JSON object, got str"),
    (None, "an event must be a JSON object, got NoneType"),
    (1.0, "an event must be a JSON object, got float"),
]


@pytest.mark.parametrize("data, message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_it_refuses_malformed_events_with_a_useful_message(data, message):
    with pytest.raises(EventError) as e:
        parse_event(data)
    assert message in str(e.value)
    assert e.value.code == "event.invalid"
    assert isinstance(e.value, ValueError)


def test_the_error_says_where_in_the_json():
    data = {"kind": "composed", "events": [{"kind": "no_op"}, {"kind": "self_composed", "count": 2,
                                                                 "event": {"kind": "laplace", "epsilon": -1}}]}
    with pytest.raises(EventError) as e:
        parse_event(data)
    assert e.value.path == "event.events[1].event"
    assert str(e.value).startswith("event.events[1].event: 'epsilon' must be > 0")
    with pytest.raises(EventError) as e:
        parse_events([{"kind": "no_op"}, {"kind": "no_op"}, {"kind": "bogus"}])
    assert e.value.path == "events[2]"
    with pytest.raises(EventError, match="expected an event object or a list of events"):
        parse_events("no_op")


def nested(levels):
    """``levels`` self_composed wrappers around a no-op: nesting depth ``levels``."""
    data = {"kind": "no_op"}
    for _ in range(levels):
        data = {"kind": "self_composed", "event": data, "count": 1}
    return data


def test_nesting_up_to_max_depth_is_accepted_and_deeper_refused():
    assert isinstance(parse_event(nested(MAX_DEPTH)), ev.SelfComposedEvent)
    with pytest.raises(EventError, match=f"nested too deeply \\(at most {MAX_DEPTH}\\)"):
        parse_event(nested(MAX_DEPTH + 1))
    with pytest.raises(EventError, match="nested too deeply"):
        parse_event(nested(10_000))  # and no RecursionError


def test_up_to_max_nodes_is_accepted_and_more_refused():
    ok = {"kind": "composed", "events": [{"kind": "no_op"}] * (MAX_NODES - 1)}
    assert len(parse_event(ok).events) == MAX_NODES - 1
    with pytest.raises(EventError, match=f"too many events \\(at most {MAX_NODES}\\)"):
        parse_event({"kind": "composed", "events": [{"kind": "no_op"}] * MAX_NODES})
    # The count is over the whole list given to parse_events, not per item.
    with pytest.raises(EventError, match="too many events"):
        parse_events([{"kind": "no_op"}] * (MAX_NODES + 1))


def test_nan_and_infinity_from_json_text_are_refused():
    for text in ('{"kind": "laplace", "epsilon": NaN}', '{"kind": "laplace", "epsilon": Infinity}',
                 '{"kind": "laplace", "epsilon": 1e999}'):
        with pytest.raises(EventError, match="finite"):
            parse_event(json.loads(text))


# ------------------------------------------------------------------------------- fuzz

FIELD_NAMES = sorted({f for fs in ev._FIELDS.values() for f in fs} | {"kind"})
scalars = (st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8)
           | st.sampled_from(ev.KINDS) | st.just(10**400) | st.just(-(10**400)))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=5)
    | st.fixed_dictionaries({"kind": st.sampled_from(ev.KINDS)},
                            optional={f: inner for f in FIELD_NAMES if f != "kind"}),
    max_leaves=20,
)


@FUZZ
@given(json_values)
def test_arbitrary_json_parses_or_raises_event_error(data):
    try:
        event = parse_event(data)
    except EventError as e:
        assert str(e)
        return
    assert isinstance(event, ev.Event)
    assert parse_event(event.to_dict()) == event


@FUZZ
@given(json_values)
def test_arbitrary_json_lists_parse_or_raise_event_error(data):
    try:
        parse_events(data)
    except EventError:
        pass
