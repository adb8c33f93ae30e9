"""One contract every accountant passes (STYLE.md: "one contract test suite for all
accountants"; after dp_accounting's ``privacy_accountant_test.py``). Subclass
``AccountantContract`` once per accountant and set ``accountant``.
"""

import math

import pytest

from accounting import ACCOUNTANTS, Cost, Spent, cost_of
from accounting import events as ev
from accounting.costs import resolve, stated_delta

MIXED = [
    ev.LaplaceEvent(0.3),
    ev.GaussianEvent(4.0),
    ev.EpsilonDeltaEvent(0.2, 1e-8),
    ev.SubsampledGaussianEvent(0.01, 1.1, 100),
    ev.SelfComposedEvent(ev.LaplaceEvent(0.05), 20),
    ev.GaussianEvent(10.0, 1e-9),
    ev.ComposedEvent((ev.LaplaceEvent(0.1), ev.EpsilonDeltaEvent(0.1, 0.0))),
]
BUDGET = (1.0, 1e-5)  # (epsilon, delta) of a dataset


def state_of(events):
    """A ledger's running cost: each event stamped with a per-release delta when admitted."""
    total = Cost.zero()
    for e in events:
        total = total + cost_of(resolve(e, 1e-7))
    return total


class AccountantContract:
    accountant = None  # the accountant module under test

    @property
    def acc(self):
        return self.accountant

    # ---------------------------------------------------------------- identity

    def test_it_is_registered_under_its_name(self):
        assert ACCOUNTANTS[self.acc.NAME] is self.acc
        assert isinstance(self.acc.THEOREM, str) and self.acc.THEOREM

    # ---------------------------------------------------------------- reporting

    @pytest.mark.parametrize("delta", [0.0, 1e-5, 0.5])
    def test_it_charges_nothing_for_no_events(self, delta):
        spent = self.acc.compose([], delta)
        assert isinstance(spent, Spent)
        assert spent.epsilon == 0.0
        assert self.acc.spent(Cost.zero(), delta).epsilon == 0.0

    def test_it_never_charges_less_as_events_are_added(self):
        previous = 0.0
        for i in range(1, len(MIXED) + 1):
            eps = self.acc.compose(MIXED[:i], 1e-5).epsilon
            assert eps >= previous, MIXED[i - 1]
            previous = eps

    def test_it_charges_nothing_for_a_no_op(self):
        assert self.acc.compose([ev.NoOpEvent()], 1e-5).epsilon == 0.0
        assert self.acc.compose(MIXED + [ev.NoOpEvent()], 1e-5) == self.acc.compose(MIXED, 1e-5)
        noop_repeated = ev.SelfComposedEvent(ev.NoOpEvent(), 1000)
        assert self.acc.compose([noop_repeated], 1e-5).epsilon == 0.0

    def test_a_non_private_release_costs_infinite_epsilon(self):
        for events in ([ev.NonPrivateEvent()], MIXED + [ev.NonPrivateEvent()]):
            spent = self.acc.compose(events, 1e-5)
            assert spent.epsilon == math.inf
            assert spent.as_dict()["epsilon"] == "inf"
        assert self.acc.filter_epsilon(cost_of(ev.NonPrivateEvent()), 1e-5) == math.inf

    @pytest.mark.parametrize("delta", [-1e-12, -1.0, 1.0, 1.5, math.nan, math.inf])
    def test_it_refuses_a_target_delta_outside_zero_one(self, delta):
        with pytest.raises(ev.EventError, match="delta"):
            self.acc.compose([ev.LaplaceEvent(0.1)], delta)

    def test_it_refuses_events_whose_own_deltas_add_up_to_one(self):
        with pytest.raises(ev.EventError, match="add up to 1"):
            self.acc.compose([ev.EpsilonDeltaEvent(0.5, 0.5)] * 2, 1e-5)
        assert self.acc.compose([ev.EpsilonDeltaEvent(0.5, 0.45)] * 2, 1e-5).delta < 1

    @pytest.mark.parametrize("eps", [0.01, 0.1, 1.0, 3.0])
    def test_one_laplace_release_costs_its_epsilon(self, eps):
        # Tolerance 1e-3 absolute: a single eps-DP release composes to eps.
        assert self.acc.compose([ev.LaplaceEvent(eps)], 1e-5).epsilon == pytest.approx(eps, abs=1e-3)

    def test_it_is_a_pure_function_of_the_events(self):
        assert self.acc.compose(MIXED, 1e-5) == self.acc.compose(list(MIXED), 1e-5)
        # compose() is spent() of the events' summed cost, unstated deltas taking the pool.
        event = ev.compose(MIXED)
        pool = self.acc.report_pool(1e-5) - stated_delta(event)
        got, on_grid = self.acc.compose(MIXED, 1e-5), self.acc.spent(cost_of(resolve(event, pool)), 1e-5)
        if self.acc.NAME == "rdp":  # the best order is refined off the grid (accounting.refine)
            assert 0.9 * on_grid.epsilon <= got.epsilon <= on_grid.epsilon
            assert got.delta == on_grid.delta
        else:
            assert got == on_grid

    @pytest.mark.parametrize("event", [
        ev.GaussianEvent(5e-324), ev.GaussianEvent(1e-200), ev.GaussianEvent(1.34e154), ev.GaussianEvent(1e300),
        ev.SubsampledGaussianEvent(0.01, 1e-200, 5), ev.SubsampledGaussianEvent(0.01, 1.34e154, 1),
        ev.SubsampledGaussianEvent(0.01, 1e300, 10**9), ev.SubsampledGaussianEvent(5e-324, 5e-324, 1),
        ev.LaplaceEvent(1e300), ev.LaplaceEvent(5e-324), ev.EpsilonDeltaEvent(1e300, 0.999999),
        ev.SelfComposedEvent(ev.LaplaceEvent(1e300), 10**9),
    ], ids=repr)
    @pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's divide-by-zero / overflow notes
    def test_any_valid_event_composes_without_an_arithmetic_error(self, event):
        # Extreme but valid parameters: a Spent (possibly infinite), never OverflowError,
        # ZeroDivisionError or NaN.
        spent = self.acc.compose([event], 1e-5)
        assert spent.epsilon >= 0 and not math.isnan(spent.epsilon)
        assert not math.isnan(self.acc.filter_epsilon(state_of([event]), 1e-5))

    def test_gaussians_without_a_delta_share_the_target(self):
        spent = self.acc.compose([ev.GaussianEvent(5.0), ev.GaussianEvent(5.0)], 1e-5)
        assert 0 < spent.epsilon < math.inf
        assert spent.delta <= 1e-5 * (1 + 1e-12)

    # ------------------------------------------------------------------- filter

    def test_the_filter_admits_a_state_within_budget(self):
        eps_g, delta_g = BUDGET
        assert self.acc.filter_epsilon(Cost.zero(), delta_g) == 0.0
        assert self.acc.filter_epsilon(state_of([ev.LaplaceEvent(0.01)]), delta_g) <= eps_g
        assert self.acc.filter_epsilon(state_of([ev.GaussianEvent(100.0)]), delta_g) <= eps_g

    def test_the_filter_refuses_a_state_beyond_budget(self):
        eps_g, delta_g = BUDGET
        assert self.acc.filter_epsilon(state_of([ev.LaplaceEvent(1.5)]), delta_g) > eps_g
        assert self.acc.filter_epsilon(state_of([ev.LaplaceEvent(0.5)] * 100), delta_g) > eps_g
        assert self.acc.filter_epsilon(state_of([ev.NonPrivateEvent()]), delta_g) > eps_g
        # A release whose own delta is the whole budget's delta cannot be admitted.
        assert self.acc.filter_epsilon(state_of([ev.EpsilonDeltaEvent(0.01, delta_g * 2)]), delta_g) == math.inf

    def test_the_filter_never_falls_as_events_are_added(self):
        previous = 0.0
        for i in range(1, len(MIXED) + 1):
            eps = self.acc.filter_epsilon(state_of(MIXED[:i]), BUDGET[1])
            assert eps >= previous, MIXED[i - 1]
            previous = eps

    def test_the_filter_is_no_looser_with_less_budget_delta(self):
        state = state_of(MIXED[:2] + MIXED[3:5])
        assert self.acc.filter_epsilon(state, 1e-3) <= self.acc.filter_epsilon(state, 1e-5)

    def test_the_filter_is_never_looser_than_the_report(self):
        for i in range(len(MIXED) + 1):
            state = state_of(MIXED[:i])
            assert self.acc.filter_epsilon(state, 1e-5) >= self.acc.spent(state, 1e-5).epsilon

    def test_the_gate_pool_shrinks_as_delta_is_used(self):
        delta_g = BUDGET[1]
        free = self.acc.gate_pool(Cost.zero(), delta_g)
        assert 0 < free <= delta_g
        used = self.acc.gate_pool(state_of([ev.EpsilonDeltaEvent(0.1, delta_g / 100)]), delta_g)
        assert used < free


class TestBasic(AccountantContract):
    accountant = ACCOUNTANTS["basic"]

    def test_the_filter_is_the_sum_of_epsilons(self):
        assert self.acc.filter_epsilon(state_of([ev.LaplaceEvent(0.25)] * 4), 1e-5) == 1.0


class TestAdvanced(AccountantContract):
    accountant = ACCOUNTANTS["advanced"]

    def test_the_filter_is_the_whitehouse_et_al_bound(self):
        # Whitehouse, Ramdas, Rogers, Wu 2023 with delta' = delta_g / 2:
        # sqrt(2 log(2 / delta_g) sum eps^2) + sum eps^2 / 2.
        sq = 50 * 0.01**2
        expected = math.sqrt(2 * math.log(2 / 1e-5) * sq) + sq / 2
        got = self.acc.filter_epsilon(state_of([ev.LaplaceEvent(0.01)] * 50), 1e-5)
        assert got == pytest.approx(expected, rel=1e-12)


class TestRdp(AccountantContract):
    accountant = ACCOUNTANTS["rdp"]

    @pytest.mark.parametrize("eps", [0.1, 1.0])
    def test_the_filter_charges_one_pure_release_its_epsilon(self, eps):
        # At alpha = inf the RDP filter is the pure-DP filter.
        assert self.acc.filter_epsilon(state_of([ev.LaplaceEvent(eps)]), 1e-5) == pytest.approx(eps)
