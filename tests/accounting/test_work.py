"""Work units (accounting.work): counted before the work, equal to the work, and the
caches that save it change no number."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting import ACCOUNTANTS, work
from accounting import rdp_math as rm
from accounting.events import SubsampledGaussianEvent, parse_events


class SeriesCounter:
    """Counts the terms Opacus's series really sums (its _log_erfc is called twice per
    fractional term; _log_add once per integer term, twice per fractional term and once
    at its end) and how many orders it is asked for."""

    def __init__(self, monkeypatch):
        g = rm.opacus_compute_rdp().__globals__
        self.erfc = self.add = self.sub = self.orders = self.int_terms = 0
        for name in ("_log_erfc", "_log_add", "_log_sub", "_compute_rdp"):
            monkeypatch.setitem(g, name, self._wrap(name, g[name]))
        real = rm._log_a_int

        def exact_sum(q, z, alpha):  # integer orders: rdp_math's own sum of alpha - 1 terms
            self.orders += 1
            self.int_terms += alpha - 1
            return real(q, z, alpha)
        monkeypatch.setattr(rm, "_log_a_int", exact_sum)

    def _wrap(self, name, f):
        attr = {"_log_erfc": "erfc", "_log_add": "add", "_log_sub": "sub", "_compute_rdp": "orders"}[name]

        def counted(*args):
            setattr(self, attr, getattr(self, attr) + 1)
            if name == "_compute_rdp" and not float(args[2]).is_integer():
                self.frac_orders += 1
            return f(*args)
        return counted

    frac_orders = 0

    @property
    def frac_terms(self):
        return self.erfc // 2

    @property
    def units(self):
        """The series run, in work units (as accounting.work prices it, without PER_ORDER)."""
        int_terms = self.add + self.sub - 2 * self.frac_terms - self.frac_orders  # a frac order adds once at its end
        return self.frac_terms * work.FRAC_TERM + int_terms + self.int_terms


@pytest.fixture
def cold(monkeypatch):
    """No cached curve: every order runs Opacus's series."""
    rm._one_step_curve.cache_clear()
    rm._SERIES.clear()
    yield
    rm._one_step_curve.cache_clear()
    rm._SERIES.clear()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=st.floats(1e-6, 0.399), z=st.floats(0.05, 50), alpha=st.floats(1.001, 400))
def test_the_count_of_a_fractional_series_is_its_length(monkeypatch, q, z, alpha):
    if alpha.is_integer():
        alpha += 0.5
    counter = SeriesCounter(monkeypatch)
    rm.opacus_compute_rdp()(q=q, noise_multiplier=z, steps=1, orders=[alpha])
    assert work._frac_terms(q, z, alpha, None) == counter.frac_terms


@pytest.mark.parametrize("q,z", [(0.01, 1.1), (0.3, 0.6), (1e-4, 20.0), (0.39, 2.0), (0.5, 1.0)])
def test_units_charged_are_the_series_run(monkeypatch, cold, q, z):
    # without the per-order cache every order charged runs (the price does not look at
    # caches: an order met again, cached, is charged again)
    monkeypatch.setattr(rm, "_SERIES", rm._LRU(0))
    counter = SeriesCounter(monkeypatch)
    events = [SubsampledGaussianEvent(q, z, 1000)]
    with work.limit(10**12) as meter:
        work.charge_grid(events)
        for acc in ACCOUNTANTS.values():
            acc.compose(events, 1e-5)
    assert counter.orders > 0
    # every series term run was paid for before it ran, and no more (PER_ORDER pays for
    # each order's call; above q = 0.4 fractional orders run no series but are priced a call)
    if q < 0.4:
        assert meter.used == counter.units + work.PER_ORDER * counter.orders
    else:
        assert 0 < meter.used - counter.units - work.PER_ORDER * counter.orders <= work.PER_ORDER * 130


def test_the_documented_maximum_of_distinct_events_is_refused_before_any_series(monkeypatch, cold):
    """2,000 distinct subsampled Gaussians took about 200 CPU seconds: now refused with
    no series term run (the grid curves are priced first)."""
    counter = SeriesCounter(monkeypatch)
    events = [SubsampledGaussianEvent(0.001 + i * 1e-5, 1.0 + i * 1e-3, 100) for i in range(2000)]
    with pytest.raises(work.TooCostly) as e:
        with work.limit():
            work.charge_grid(events)
            ACCOUNTANTS["rdp"].compose(events, 1e-5)
    assert counter.orders == 0 and counter.units == 0
    assert e.value.limit == work.MAX_UNITS and e.value.needed > work.MAX_UNITS


def test_the_documented_maximum_of_equal_events_is_one_curve(monkeypatch, cold):
    counter = SeriesCounter(monkeypatch)
    events = [SubsampledGaussianEvent(0.01, 1.1, 1000)] * 2000
    with work.limit() as meter:
        work.charge_grid(events)
        for acc in ACCOUNTANTS.values():
            acc.compose(events, 1e-5)
    assert work.grid_units(events) == work.grid_units(events[:1])
    assert counter.units <= meter.used <= work.MAX_UNITS
    # one pair's orders: the 56 of the grid and 1 + 2 x 33 of the refinement, no more
    assert counter.orders <= len(rm.FINITE_ORDERS) + 1 + 2 * 33


def test_a_refinement_past_the_budget_is_refused_before_its_zoom(monkeypatch, cold):
    events = [SubsampledGaussianEvent(0.3, 0.6, 1000)]
    grid = work.grid_units(events)
    counter = SeriesCounter(monkeypatch)
    with pytest.raises(work.TooCostly):
        with work.limit(grid + 1000):
            work.charge_grid(events)
            ACCOUNTANTS["rdp"].compose(events, 1e-5)
    assert counter.units <= grid + 1000


def test_no_budget_open_nothing_is_limited():
    assert work.active() is None
    work.charge(10**18)  # no-op
    events = [SubsampledGaussianEvent(0.01, 1.1, 10)]
    ACCOUNTANTS["rdp"].compose(events, 1e-5)


def _uncached(monkeypatch):
    """The plain path: no (q, z, order) or (q, z) cache."""
    monkeypatch.setattr(rm, "_SERIES", rm._LRU(0))
    monkeypatch.setattr(rm, "_one_step_curve", rm._one_step_curve.__wrapped__)


pairs = st.tuples(st.sampled_from([1e-4, 0.001, 0.004, 0.01, 0.05, 0.45]),
                  st.sampled_from([1.0, 1.1, 2.0, 4.0]))
event_lists = st.lists(
    st.one_of(
        st.builds(lambda p, t: {"kind": "subsampled_gaussian", "sample_rate": p[0], "noise_multiplier": p[1],
                                "steps": t}, pairs, st.integers(1, 5000)),
        st.builds(lambda e: {"kind": "laplace", "epsilon": e}, st.sampled_from([0.01, 0.1, 1.0])),
        st.builds(lambda z: {"kind": "gaussian", "noise_multiplier": z}, st.sampled_from([1.0, 3.0])),
        st.builds(lambda p, k: {"kind": "self_composed", "count": k,
                                "event": {"kind": "subsampled_gaussian", "sample_rate": p[0],
                                          "noise_multiplier": p[1], "steps": 10}}, pairs, st.integers(1, 50)),
    ), min_size=1, max_size=8).map(lambda xs: xs + xs[: len(xs) // 2])  # with repeats


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=event_lists, delta=st.sampled_from([1e-9, 1e-5, 1e-3]))
def test_the_cached_and_metered_path_equals_the_plain_one(monkeypatch, data, delta):
    """Same numbers bit for bit: caches warm (twice), under a budget, and with no cache."""
    events = parse_events(data)
    warm = {n: acc.compose(events, delta) for n, acc in ACCOUNTANTS.items()}
    with work.limit(10**12):
        work.charge_grid(events)
        metered = {n: acc.compose(events, delta) for n, acc in ACCOUNTANTS.items()}
    again = {n: acc.compose(events, delta) for n, acc in ACCOUNTANTS.items()}
    with monkeypatch.context() as m:
        _uncached(m)
        plain = {n: acc.compose(events, delta) for n, acc in ACCOUNTANTS.items()}
    assert warm == metered == again == plain


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=st.floats(1e-5, 0.9), z=st.floats(0.1, 20),
       orders=st.lists(st.floats(1.001, 300), min_size=1, max_size=6))
def test_a_cached_order_is_opacus_value(monkeypatch, q, z, orders):
    a = np.array(orders + [2.0, 64.0])
    first = rm.subsampled_at(q, z, a)
    second = rm.subsampled_at(q, z, a[::-1])[::-1]
    with monkeypatch.context() as m:
        _uncached(m)
        plain = rm.subsampled_at(q, z, a)
    assert np.array_equal(first, plain) and np.array_equal(second, plain)
    assert all(math.isfinite(x) or x == math.inf for x in first)


def test_the_series_cache_is_bounded():
    lru = rm._LRU(3)
    for i in range(10):
        lru.put(i, i)
    assert len(lru) == 3 and lru.get(9) == 9 and lru.get(0) is None
