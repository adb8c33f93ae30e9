"""The gate without a lock across round trips (governance/gate_unlocked.py, PostgreSQL):
a request POSTed without an Idempotency-Key is decided on an unlocked read and written by
one statement that writes only if the budget's and the grant's states are still as read.
Many at once never overspend a budget or a grant cap; a state that moved is read again."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance import gate_unlocked, ledger, submission
from governance.errors import BudgetExceeded
from governance.models import LedgerEntry, Request

from .test_concurrency import PER_THREAD, THREADS, run_threads

EPS = 0.0625  # exact in binary: 16 make 1.0


def count(eps=EPS):
    return {"epsilon": eps}


@pytest.fixture
def unsent(monkeypatch):
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)


def _submit(analyst, ds, k):
    try:
        submission.submit(analyst, ds, "aggregates", "count", count(EPS * (1 - k * 1e-12)))  # k: no replays
        return "admitted"
    except BudgetExceeded:
        return "refused"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["basic", "rdp"])
def test_32_analysts_at_once_never_overspend(make_dataset, grant, django_user_model, policy, unsent):
    twin = make_dataset("twin", epsilon=1.0, policy=policy, delta=1e-9)
    ref = django_user_model.objects.create_user("ref")
    grant(ref, twin)
    expected = [_submit(ref, twin, k) for k in range(THREADS * PER_THREAD)].count("admitted")
    ds = make_dataset(epsilon=1.0, policy=policy, delta=1e-9)
    analysts = [django_user_model.objects.create_user(f"a{i}") for i in range(THREADS)]
    for a in analysts:
        grant(a, ds)
    outcomes = run_threads(lambda i: [_submit(analysts[i], ds, i * PER_THREAD + j) for j in range(PER_THREAD)])
    assert outcomes.count("admitted") == expected > 0
    assert Request.objects.filter(dataset=ds).count() == expected == LedgerEntry.objects.filter(dataset=ds).count()
    assert ledger.Limit.of_dataset(ds).spent(ledger.recompute_state(ds.pk)) <= 1.0
    ds.budget.refresh_from_db()
    assert ds.budget.state == ledger.recompute_state(ds.pk).to_json()


@pytest.mark.django_db(transaction=True)
def test_one_capped_analyst_in_32_threads_gets_exactly_the_cap(make_dataset, analyst, grant, unsent):
    ds = make_dataset(epsilon=100.0, policy="basic", delta=1e-9)
    grant(analyst, ds, cap_epsilon=1.0)
    outcomes = run_threads(lambda i: [_submit(analyst, ds, i * PER_THREAD + j) for j in range(PER_THREAD)])
    assert outcomes.count("admitted") == 16 == LedgerEntry.objects.filter(dataset=ds).count()


@pytest.mark.django_db(transaction=True)
def test_a_state_that_moved_between_the_read_and_the_write_is_read_again(make_dataset, analyst, grant,
                                                                          monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the unlocked gate is PostgreSQL's")
    ds = make_dataset(epsilon=10.0, policy="basic", delta=1e-9)
    grant(analyst, ds)
    real_writes, moved = ledger.writes, []

    def writes_after_another_admission(*args):
        if not moved:  # another admission commits between this gate's read and its write
            moved.append(True)
            ledger.admit(ds.pk, analyst, {"kind": "laplace", "epsilon": 0.5})
        return real_writes(*args)

    monkeypatch.setattr(ledger, "writes", writes_after_another_admission)
    req = Request(analyst=analyst, dataset=ds, engine="aggregates", kind="count", params={}, fingerprint="f",
                  plan={"event": {"kind": "laplace", "epsilon": 1.0}}, progress={})
    with CaptureQueriesContext(connection) as q:
        entry = gate_unlocked.admit_unlocked(ds, analyst, {"kind": "laplace", "epsilon": 1.0}, reference="r",
                                             new_request=req)
    reads = [x for x in q.captured_queries if x["sql"].startswith("SELECT b.state::text")]
    assert entry is not None and len(reads) == 2  # the first write found the state moved: read again
    assert Request.objects.get(pk=req.pk).ledger_entry_id == entry.pk
    assert LedgerEntry.objects.filter(dataset=ds).count() == 2
    assert ledger.Limit.of_dataset(ds).spent(ledger.recompute_state(ds.pk)) == pytest.approx(1.5)
    ds.budget.refresh_from_db()
    assert ds.budget.state == ledger.recompute_state(ds.pk).to_json()
