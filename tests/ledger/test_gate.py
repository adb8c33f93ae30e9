"""The gate's actions: admit, commit, release, and the rules each policy gates with."""

import math
import random

import pytest
from django.core.exceptions import ValidationError

from governance.ledger import actions as ledger
from accounting.costs import Cost
from governance.core.errors import (
    BudgetExceeded,
    DatasetNotActive,
    InvalidEvent,
    LedgerConflict,
    NoGrant,
    NonPrivateRefused,
)
from governance.models import Budget, LedgerEntry

LAP = {"kind": "laplace", "epsilon": 0.25}
DPSGD = {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 2.0, "steps": 200}

pytestmark = pytest.mark.django_db


def state_of(ds) -> Cost:
    return Cost.from_json(Budget.objects.get(pk=ds.pk).state)


def spent(ds) -> float:
    ds.refresh_from_db()
    return ledger.Limit.of_dataset(ds).spent(state_of(ds))


def assert_state_matches_ledger(ds):
    stored, derived = state_of(ds).values, ledger.recompute_state(ds.pk).values
    assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a == b) for a, b in zip(stored, derived))


def test_it_reserves_then_commits(make_dataset, analyst, grant):
    ds = make_dataset()
    grant(analyst, ds)
    entry = ledger.admit(ds, analyst, LAP, reference="q1")
    assert entry.status == "reserved" and spent(ds) == pytest.approx(0.25)
    entry = ledger.commit(entry)
    assert entry.status == "committed" and entry.committed_at is not None
    assert spent(ds) == pytest.approx(0.25)
    assert ledger.commit(entry).status == "committed"  # a second commit changes nothing
    assert spent(ds) == pytest.approx(0.25)


def test_it_refunds_a_released_reservation(make_dataset, analyst, grant):
    ds = make_dataset()
    g = grant(analyst, ds)
    entry = ledger.admit(ds, analyst, LAP)
    ledger.release(entry)
    assert LedgerEntry.objects.get(pk=entry.pk).status == "released"
    assert spent(ds) == 0.0
    g.refresh_from_db()
    assert Cost.from_json(g.state).eps == 0.0
    assert ledger.release(entry).status == "released"  # idempotent
    assert spent(ds) == 0.0


def test_it_never_moves_status_backwards(make_dataset, analyst, grant):
    ds = make_dataset()
    grant(analyst, ds)
    committed = ledger.commit(ledger.admit(ds, analyst, LAP))
    with pytest.raises(LedgerConflict):
        ledger.release(committed)
    released = ledger.release(ledger.admit(ds, analyst, LAP))
    with pytest.raises(LedgerConflict):
        ledger.commit(released)


def test_it_commits_a_smaller_actual_event_and_refunds_the_rest(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=10.0)
    grant(analyst, ds)
    entry = ledger.admit(ds, analyst, DPSGD)
    full = spent(ds)
    entry = ledger.commit(entry, {**DPSGD, "steps": 50})
    assert entry.committed_event["steps"] == 50
    assert entry.event["steps"] == 200  # the reserved event is never edited
    assert 0 < spent(ds) < full
    assert_state_matches_ledger(ds)


def test_it_refuses_a_committed_event_larger_than_the_reservation(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=10.0)
    grant(analyst, ds)
    entry = ledger.admit(ds, analyst, DPSGD)
    with pytest.raises(InvalidEvent):
        ledger.commit(entry, {**DPSGD, "steps": 400})
    assert LedgerEntry.objects.get(pk=entry.pk).status == "reserved"


def test_it_never_edits_or_deletes_an_entry(make_dataset, analyst, grant):
    ds = make_dataset()
    grant(analyst, ds)
    entry = ledger.admit(ds, analyst, LAP)
    entry.event = {"kind": "laplace", "epsilon": 0.0001}
    with pytest.raises(ValidationError):
        entry.save()
    with pytest.raises(ValidationError):
        entry.delete()
    assert LedgerEntry.objects.get(pk=entry.pk).event == LAP


def test_it_requires_a_grant_and_an_active_dataset(make_dataset, analyst, outsider, grant):
    ds = make_dataset()
    with pytest.raises(NoGrant):
        ledger.admit(ds, outsider, LAP)
    draft = make_dataset("draft", activate=False)
    grant(analyst, draft)
    with pytest.raises(DatasetNotActive):
        ledger.admit(draft, analyst, LAP)
    assert LedgerEntry.objects.count() == 0


def test_it_refuses_beyond_the_budget_with_the_numbers(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.75})
    with pytest.raises(BudgetExceeded) as e:
        ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.5})
    x = e.value.extra
    assert x["scope"] == "dataset" and x["policy"] == "rdp"
    assert x["spent_epsilon"] == pytest.approx(0.75)
    assert x["remaining_epsilon"] == pytest.approx(0.25)
    assert x["would_total_epsilon"] == pytest.approx(1.25, rel=1e-3)
    assert set(x["request_charge"]) == {"basic", "advanced", "rdp"}
    assert LedgerEntry.objects.count() == 1


def test_it_gates_by_the_analysts_cap(make_dataset, analyst, analyst2, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds, cap_epsilon=0.3)
    grant(analyst2, ds)
    ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.25})
    with pytest.raises(BudgetExceeded) as e:
        ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.25})
    assert e.value.extra["scope"] == "grant"
    ledger.admit(ds, analyst2, {"kind": "laplace", "epsilon": 0.5})  # the dataset still has room


@pytest.mark.parametrize("policy,admitted", [("basic", 4), ("advanced", 0), ("rdp", 4)])
def test_each_policy_gates_with_its_own_filter(make_dataset, analyst, grant, policy, admitted):
    # Four Laplace(0.25) fit a budget of 1.0 exactly under basic and under RDP (alpha = inf is
    # the pure-DP filter); with delta = 1e-6 the advanced filter's
    # sqrt(2 log(2/delta) sum eps^2) + sum eps^2 / 2 is already 1.38 for one of them:
    # advanced composition only pays off for many small releases.
    ds = make_dataset(epsilon=1.0, policy=policy, delta=1e-6)
    grant(analyst, ds)
    n = 0
    for _ in range(6):
        try:
            ledger.admit(ds, analyst, LAP)
            n += 1
        except BudgetExceeded:
            break
    assert n == admitted


def test_rdp_filter_admits_many_more_small_gaussians_than_basic(make_dataset, analyst, grant):
    counts = {}
    for policy in ("basic", "rdp"):
        ds = make_dataset(f"g-{policy}", epsilon=1.0, delta=1e-5, policy=policy)
        grant(analyst, ds)
        n = 0
        while n < 2000:
            try:
                ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 20.0})
                n += 1
            except BudgetExceeded:
                break
        counts[policy] = n
    assert counts["rdp"] > 3 * counts["basic"] > 0


def test_it_states_a_delta_on_gaussian_events_and_keeps_deltas_within_budget(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=50.0, delta=1e-5, policy="basic")
    grant(analyst, ds)
    for _ in range(20):
        entry = ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 5.0})
        assert 0 < entry.event["delta"] < 1e-5
    assert state_of(ds).delta <= 1e-5


def test_a_pure_dp_budget_refuses_gaussian_noise(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=5.0, delta=0.0)
    grant(analyst, ds)
    with pytest.raises((BudgetExceeded, InvalidEvent)):
        ledger.admit(ds, analyst, {"kind": "gaussian", "noise_multiplier": 5.0})
    ledger.admit(ds, analyst, LAP)


def test_non_private_releases_are_refused_unless_the_officer_allows_them(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1000.0)
    grant(analyst, ds)
    with pytest.raises(NonPrivateRefused):
        ledger.admit(ds, analyst, {"kind": "non_private"})
    assert not LedgerEntry.objects.filter(dataset=ds).exists()
    from governance.datasets import registry

    ds = registry.update(ds, actor="olivia", allow_non_private=True)  # with its settings record
    sweep = {"kind": "composed", "events": [DPSGD, {"kind": "non_private"}]}
    entry = ledger.admit(ds, analyst, sweep)
    assert entry.non_private
    assert_state_matches_ledger(ds)
    assert math.isfinite(spent(ds))
    # The commit may shrink the private part; it may not add a non-private part elsewhere.
    ledger.commit(entry, {"kind": "composed", "events": [{**DPSGD, "steps": 10}, {"kind": "non_private"}]})
    assert_state_matches_ledger(ds)
    # the chain verifies: its cost is the private part's, as the ledger stores it (a probe:
    # "ledger entry N's cost is not its event's" after every allowed sweep, for good)
    from governance.audit.verification import verify

    assert verify([ds]).ok, verify([ds]).findings
    other = ledger.admit(ds, analyst, LAP)
    with pytest.raises(InvalidEvent):
        ledger.commit(other, {"kind": "composed", "events": [{"kind": "no_op"}, {"kind": "non_private"}]})


def test_running_state_equals_the_ledger_after_random_traffic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=100.0, delta=1e-5)
    grant(analyst, ds)
    rng = random.Random(7)
    events = [LAP, {"kind": "gaussian", "noise_multiplier": 3.0}, DPSGD,
              {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 1e-8},
              {"kind": "self_composed", "event": LAP, "count": 3}]
    for _ in range(60):
        entry = ledger.admit(ds, analyst, rng.choice(events))
        r = rng.random()
        if r < 0.4:
            ledger.commit(entry)
        elif r < 0.7:
            ledger.release(entry)
    assert_state_matches_ledger(ds)


def test_an_officer_charge_is_admitted_and_committed(make_dataset, officer):
    ds = make_dataset(epsilon=1.0)
    entry = ledger.charge(ds, officer, {"kind": "epsilon_delta", "epsilon": 0.5, "delta": 0}, reference="census table")
    assert entry.status == "committed"
    with pytest.raises(BudgetExceeded):
        ledger.charge(ds, officer, {"kind": "epsilon_delta", "epsilon": 0.6, "delta": 0})
    assert LedgerEntry.objects.count() == 1
