"""Hypothesis properties of the accountants (STYLE.md, "Tests"): epsilon never falls as
events are added; composition is order-independent; a no-op changes nothing; repetition
costs what the copies cost; cost vectors add and subtract exactly; the privacy filter is
never looser than non-adaptive reporting.
"""

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting import ACCOUNTANTS, Cost, cost_of
from accounting import costs as costs_module
from accounting import events as ev
from accounting.costs import N_FIELDS, resolve
from accounting.rdp_math import subsampled_gaussian_curve

# Opacus is slow on large orders: no deadline, modest example counts. The autouse
# ``_data_dirs`` fixture in tests/conftest.py is function-scoped but only sets paths, so it
# is safe to share across examples.
PROPS = settings(max_examples=50, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

ACCS = sorted(ACCOUNTANTS.items())
DELTA = 1e-5
LEDGER_DELTA = 1e-7  # the delta the "ledger" below stamps on each Gaussian-type event


@pytest.fixture(autouse=True, scope="module")
def _memoised_opacus():
    """The same pure function, memoised: the strategies reuse a few (q, z, steps)."""
    cached = functools.lru_cache(maxsize=None)(subsampled_gaussian_curve)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(costs_module, "subsampled_gaussian_curve", lambda q, z, t: cached(q, z, t).copy())
        yield


# ------------------------------------------------------------------------ strategies

epsilons = st.floats(0.01, 3.0)
# Stated deltas stay small enough that together (at most ~320 leaves after repetition)
# they never use up the smallest target's pool: see test_rdp_compose_when_stated_deltas_
# use_up_the_target for what happens when they do.
stated_deltas = st.floats(1e-12, 1e-9)

laplace = st.builds(ev.LaplaceEvent, epsilons)
gaussian = st.builds(ev.GaussianEvent, st.floats(0.5, 50.0), st.none() | stated_deltas)
subsampled = st.builds(ev.SubsampledGaussianEvent, st.sampled_from([0.001, 0.01, 0.1]),
                       st.sampled_from([0.8, 1.0, 2.0, 5.0]), st.integers(1, 20),
                       st.none() | stated_deltas)
epsilon_delta = st.builds(ev.EpsilonDeltaEvent, epsilons, st.just(0.0) | stated_deltas)
leaves = st.one_of(laplace, gaussian, subsampled, epsilon_delta)
events = st.recursive(
    leaves,
    lambda inner: st.builds(ev.SelfComposedEvent, inner, st.integers(1, 4))
    | st.lists(inner, min_size=1, max_size=3).map(lambda xs: ev.ComposedEvent(tuple(xs))),
    max_leaves=4,
)
event_lists = st.lists(events, max_size=4)
added = st.one_of(events, st.just(ev.NoOpEvent()), st.just(ev.NonPrivateEvent()))
budget_deltas = st.sampled_from([1e-6, 1e-5, 1e-3])


def ledger_state(evs):
    """The running cost of a ledger: each event stamped with a delta when admitted."""
    total = Cost.zero()
    for e in evs:
        total = total + cost_of(resolve(e, LEDGER_DELTA))
    return total


def close(a, b, rel=1e-9):
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)))


# ---------------------------------------------------------------------- monotonicity


@PROPS
@given(event_lists, added)
def test_reported_epsilon_never_falls_when_an_event_is_added(evs, extra):
    for name, acc in ACCS:
        before = acc.compose(evs, DELTA).epsilon
        after = acc.compose(evs + [extra], DELTA).epsilon
        assert after >= before, name


@PROPS
@given(event_lists, added, budget_deltas)
def test_filter_epsilon_never_falls_when_an_event_is_added(evs, extra, budget_delta):
    state = ledger_state(evs)
    more = state + ledger_state([extra])
    for name, acc in ACCS:
        assert acc.filter_epsilon(more, budget_delta) >= acc.filter_epsilon(state, budget_delta), name
        assert acc.spent(more, budget_delta).epsilon >= acc.spent(state, budget_delta).epsilon, name


# ----------------------------------------------------------------- order independence


@PROPS
@given(event_lists, st.data())
def test_composition_is_order_independent(evs, data):
    shuffled = data.draw(st.permutations(evs))
    state, state2 = ledger_state(evs), ledger_state(shuffled)
    for name, acc in ACCS:
        assert close(acc.compose(shuffled, DELTA).epsilon, acc.compose(evs, DELTA).epsilon), name
        assert close(acc.filter_epsilon(state2, DELTA), acc.filter_epsilon(state, DELTA)), name


# ----------------------------------------------------------------------------- no-op


@PROPS
@given(event_lists, st.data())
def test_a_no_op_changes_nothing(evs, data):
    at = data.draw(st.integers(0, len(evs)))
    with_noop = evs[:at] + [ev.NoOpEvent()] + evs[at:]
    state = ledger_state(evs)
    assert np.array_equal(ledger_state(with_noop).values, state.values)
    for name, acc in ACCS:
        assert acc.compose(with_noop, DELTA) == acc.compose(evs, DELTA), name
        assert acc.filter_epsilon(state + cost_of(ev.NoOpEvent()), DELTA) == acc.filter_epsilon(state, DELTA)


# ------------------------------------------------------------------------ repetition


@PROPS
@given(st.one_of(laplace, epsilon_delta), st.integers(1, 50), budget_deltas)
def test_self_composed_costs_the_same_as_k_copies(event, k, delta):
    # Mathematically exact; in floats k * x and x + ... + x differ by a few ulps (1e-12).
    rep, copies = cost_of(ev.SelfComposedEvent(event, k)), cost_of(ev.ComposedEvent((event,) * k))
    assert np.array_equal(rep.infs, copies.infs)
    np.testing.assert_allclose(rep.values, copies.values, rtol=1e-12, atol=0)
    for name, acc in ACCS:
        a = acc.compose([ev.SelfComposedEvent(event, k)], delta).epsilon
        b = acc.compose([event] * k, delta).epsilon
        assert close(a, b, rel=1e-12), name


@PROPS
@given(st.floats(0.3, 50.0), st.none() | stated_deltas, st.integers(1, 10_000), budget_deltas)
def test_self_composed_gaussian_is_the_gaussian_with_z_over_root_k(z, delta, k, target):
    rep = ev.SelfComposedEvent(ev.GaussianEvent(z, delta), k)
    one = ev.GaussianEvent(z / math.sqrt(k), delta)
    for name, acc in ACCS:
        assert acc.compose([rep], target) == acc.compose([one], target), name
    # And its RDP curve is that of k copies (Gaussians compose to a Gaussian).
    if k <= 200:
        copies = cost_of(ev.ComposedEvent((ev.GaussianEvent(z, 1e-7),) * k)).rdp
        np.testing.assert_allclose(cost_of(resolve(rep, 1e-7)).rdp, copies, rtol=1e-9)


@PROPS
@given(subsampled, st.integers(1, 5))
def test_self_composed_subsampled_gaussian_is_k_times_the_steps(event, k):
    rep = resolve(ev.SelfComposedEvent(event, k), 1e-7)
    longer = resolve(ev.SubsampledGaussianEvent(event.sample_rate, event.noise_multiplier,
                                                event.steps * k, event.delta), 1e-7)
    assert np.array_equal(cost_of(rep).values, cost_of(longer).values)
    copies = cost_of(ev.ComposedEvent((resolve(event, 1e-7),) * k)).rdp
    np.testing.assert_allclose(cost_of(rep).rdp, copies, rtol=1e-9)


# ------------------------------------------------------------------------ Cost algebra

cost_values = st.lists(st.floats(0.0, 1e3) | st.just(math.inf), min_size=N_FIELDS, max_size=N_FIELDS)


@PROPS
@given(cost_values, cost_values)
def test_cost_add_then_subtract_round_trips(a_vals, b_vals):
    a, b = Cost.from_values(a_vals), Cost.from_values(b_vals)
    back = (a + b) - b
    assert np.array_equal(back.infs, a.infs)  # infinities are counted, so exact
    assert not np.isnan(back.values).any()
    assert not np.isnan((a - a).values).any()
    finite = np.isfinite(a.values)
    np.testing.assert_allclose(back.values[finite], a.values[finite], rtol=0, atol=1e-12)
    assert np.array_equal(np.isinf(back.values), np.isinf(a.values))
    assert np.array_equal((a - a).values, np.zeros(N_FIELDS))
    assert np.array_equal(Cost.from_json(a.to_json()).values, a.values)


@PROPS
@given(event_lists, added)
def test_refunding_an_event_restores_the_ledger(evs, extra):
    state = ledger_state(evs)
    c = ledger_state([extra])
    back = (state + c) - c
    assert np.array_equal(back.infs, state.infs)
    assert not np.isnan(back.values).any()
    # Float addition loses the low bits of ``state`` below the size of ``c`` (RDP at order
    # 4096 can be ~1e4), so the round trip is exact to 1e-12 of the operands' size.
    scale = np.maximum(1.0, np.abs(state.finite) + np.abs(c.finite))
    assert np.all(np.abs(back.finite - state.finite) <= 1e-12 * scale)


# --------------------------------------------------------------- filter vs reporting


@PROPS
@given(event_lists, budget_deltas)
def test_rdp_filter_is_never_looser_than_reporting(evs, budget_delta):
    # The filter (valid under adaptive choice) must charge at least what the
    # non-adaptive report gives at the same delta.
    state = ledger_state(evs)
    for name, acc in ACCS:
        assert acc.filter_epsilon(state, budget_delta) >= acc.spent(state, budget_delta).epsilon, name


@PROPS
@given(event_lists, budget_deltas)
def test_rdp_report_never_exceeds_basic_where_basic_is_valid(evs, delta):
    b = ACCOUNTANTS["basic"].compose(evs, delta)
    if b.delta <= delta:
        assert ACCOUNTANTS["rdp"].compose(evs, delta).epsilon <= b.epsilon


def test_rdp_compose_when_stated_deltas_use_up_the_target():
    # RDP of two Gaussians is well defined whatever delta the first one states; stating a
    # tiny delta on the second gives the answer, leaving it unstated should too.
    stated = ACCOUNTANTS["rdp"].compose([ev.GaussianEvent(1.0, 2e-5), ev.GaussianEvent(1.0, 1e-12)], 1e-5)
    assert math.isfinite(stated.epsilon)
    assert ACCOUNTANTS["rdp"].compose([ev.GaussianEvent(1.0, 2e-5), ev.GaussianEvent(1.0)], 1e-5) == stated


def test_cost_never_meets_inf_minus_inf_after_overflow():
    with np.errstate(all="ignore"):
        huge = cost_of(ev.SelfComposedEvent(ev.LaplaceEvent(1e300), 10**9))  # 1e309: overflows
        assert not np.isnan((huge - huge).values).any()
