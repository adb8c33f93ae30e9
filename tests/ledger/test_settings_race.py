"""An officer's change of a dataset's gate settings races an admission (a helper's probe,
2026-11-29): the admission waits for the budget row's lock the change holds, then must
judge by the settings as committed. On PostgreSQL the gate's statement read the dataset
row from its snapshot, taken before the wait (READ COMMITTED re-reads only the rows a
statement locks): a request waiting while the budget was cut from 1 to 0.2 was admitted at
0.5, and ``audit verify`` then failed (ledger past its budget). On SQLite the write lock
makes the two one after the other; the test runs on both."""

import threading
import time

import pytest
from django.db import connections

from governance.audit import verification
from governance.core.errors import BudgetExceeded
from governance.datasets import registry
from governance.ledger import trail
from governance.models import Dataset, LedgerEntry
from governance.requests import submission

HOLD = 2.0  # seconds the officer's transaction keeps the lock after writing the change


def race(officer_changes, other) -> None:
    """Both in threads of their own (each with its own connection), as far as they go."""
    def closing(fn):
        def run():
            try:
                fn()
            finally:
                connections.close_all()
        return run

    threads = [threading.Thread(target=closing(officer_changes)), threading.Thread(target=closing(other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


@pytest.fixture
def unsent(monkeypatch):
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["basic", "rdp"])
def test_an_admission_that_waited_for_a_budget_cut_judges_by_it(make_dataset, grant, analyst, officer, monkeypatch,
                                                                  unsent, policy):
    ds = make_dataset("clinic", epsilon=1.0, policy=policy)
    grant(analyst, ds)
    submission.submit(analyst, ds, "aggregates", "count", {"epsilon": 0.01})  # warm: imports, plugin, OpenDP
    recorded = trail.record_settings

    def slow(*args, **kwargs):
        recorded(*args, **kwargs)
        changed.set()
        time.sleep(HOLD)  # the change written, its transaction still open: the budget row locked

    changed, out = threading.Event(), {}
    monkeypatch.setattr(trail, "record_settings", slow)

    def analyst_asks():
        try:
            assert changed.wait(30)
            submission.submit(analyst, Dataset.objects.get(pk=ds.pk), "aggregates", "count", {"epsilon": 0.5})
            out["answer"] = "admitted"
        except BudgetExceeded:
            out["answer"] = "refused"

    race(lambda: registry.update(Dataset.objects.get(pk=ds.pk), actor=officer.username, budget_epsilon=0.2),
         analyst_asks)
    assert out["answer"] == "refused", out
    assert LedgerEntry.objects.filter(dataset_id=ds.pk).count() == 1  # the warm-up only
    report = verification.verify(stop_at_first=False).as_dict()
    assert report["ok"], report


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_waited_for_a_delta_change_reports_at_the_new_delta(make_dataset, grant, analyst, officer,
                                                                          monkeypatch, unsent):
    """The commit's lock statement read the delta the same way: its audit record reported
    the charge at the delta of before the change it had waited for."""
    from governance.ledger import actions as ledger
    from governance.models import AuditRecord

    ds = make_dataset("clinic", epsilon=1.0, policy="rdp", delta=1e-6)
    grant(analyst, ds)
    req, _ = submission.submit(analyst, ds, "aggregates", "count", {"epsilon": 0.1})
    recorded = trail.record_settings
    changed = threading.Event()

    def slow(*args, **kwargs):
        recorded(*args, **kwargs)
        changed.set()
        time.sleep(HOLD)

    monkeypatch.setattr(trail, "record_settings", slow)

    def worker_commits():
        assert changed.wait(30)
        ledger.commit(req.ledger_entry_id)

    race(lambda: registry.update(Dataset.objects.get(pk=ds.pk), actor=officer.username, budget_delta=1e-7),
         worker_commits)
    record = AuditRecord.objects.get(dataset_id=ds.pk, action="commit")
    assert record.totals["at_delta"] == 1e-7, record.totals
    assert verification.verify(stop_at_first=False).as_dict()["ok"]
