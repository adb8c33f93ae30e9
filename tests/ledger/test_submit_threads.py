"""Requests submitted from 32 threads at once, with and without an Idempotency-Key (a
keyed request's row is inserted before the gate's lock, a key-less one is written by the
gate's own statement): exactly what the gate admits one by one, never a budget or a grant
cap overspent, and no row left by a refusal."""

import pytest

from governance.ledger import actions as ledger
from governance.requests import submission
from governance.core.errors import BudgetExceeded
from governance.models import LedgerEntry, Request

from .test_concurrency import PER_THREAD, THREADS, run_threads

EPS = 0.0625  # exact in binary: 16 make 1.0


def count(eps=EPS):
    return {"epsilon": eps}


@pytest.fixture
def unsent(monkeypatch):
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)


def _submit(analyst, ds, k, keyed=False):
    try:  # k: no replays
        submission.submit(analyst, ds, "aggregates", "count", count(EPS * (1 - k * 1e-12)),
                          idempotency_key=f"key-{k}" if keyed else "")
        return "admitted"
    except BudgetExceeded:
        return "refused"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "key"])
@pytest.mark.parametrize("policy", ["basic", "rdp"])
def test_32_analysts_at_once_never_overspend(make_dataset, grant, django_user_model, policy, keyed, unsent):
    twin = make_dataset("twin", epsilon=1.0, policy=policy, delta=1e-9)
    ref = django_user_model.objects.create_user("ref")
    grant(ref, twin)
    expected = [_submit(ref, twin, k) for k in range(THREADS * PER_THREAD)].count("admitted")
    ds = make_dataset(epsilon=1.0, policy=policy, delta=1e-9)
    analysts = [django_user_model.objects.create_user(f"a{i}") for i in range(THREADS)]
    for a in analysts:
        grant(a, ds)
    outcomes = run_threads(lambda i: [_submit(analysts[i], ds, i * PER_THREAD + j, keyed) for j in range(PER_THREAD)])
    assert outcomes.count("admitted") == expected > 0
    assert Request.objects.filter(dataset=ds).count() == expected == LedgerEntry.objects.filter(dataset=ds).count()
    assert ledger.Limit.of_dataset(ds).spent(ledger.recompute_state(ds.pk)) <= 1.0
    ds.budget.refresh_from_db()
    assert ds.budget.state == ledger.recompute_state(ds.pk).to_json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "key"])
def test_one_capped_analyst_in_32_threads_gets_exactly_the_cap(make_dataset, analyst, grant, keyed, unsent):
    ds = make_dataset(epsilon=100.0, policy="basic", delta=1e-9)
    grant(analyst, ds, cap_epsilon=1.0)
    outcomes = run_threads(lambda i: [_submit(analyst, ds, i * PER_THREAD + j, keyed) for j in range(PER_THREAD)])
    assert outcomes.count("admitted") == 16 == LedgerEntry.objects.filter(dataset=ds).count()
    # a refused request leaves no row: every row is an admitted one, linked to its entry
    assert Request.objects.filter(dataset=ds).count() == 16
    assert not Request.objects.filter(dataset=ds, ledger_entry__isnull=True).exists()
