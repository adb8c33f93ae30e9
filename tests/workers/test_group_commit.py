"""Group commit (governance.requests.outcomes.write_group): the outcomes due at one moment written in
one transaction, request rows first, then each dataset's ledger entries under its budget
row lock with their audit records chained in order; one failing outcome loses no other."""

import threading
import time

import pytest

from governance.audit import verification
from governance.ledger import trail
from governance.requests import outcomes
from governance.requests.execution import claim
from governance.models import AuditRecord, LedgerEntry, Request
from governance.requests.releaser import Releaser

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_datasets(make_dataset, analyst, grant):
    a, b = make_dataset("alpha", epsilon=5.0), make_dataset("beta", epsilon=5.0)
    grant(analyst, a)
    grant(analyst, b)
    return a, b


def claimed(client, capture, dataset, eps):
    """A request admitted on ``dataset``, its task not run, claimed as a worker would."""
    with capture(execute=False):
        r = client.post("/api/requests/", {"dataset": dataset.name, "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": eps}}, format="json")
    assert r.status_code == 202, r.content
    req = claim(r.json()["id"], worker="cpu@group")
    assert req is not None and req.status == "running"
    Request.objects.filter(pk=req.pk).update(data_read=True)
    return req


def test_a_group_of_two_datasets_is_one_transaction_and_both_chains_verify(
        api, analyst, two_datasets, django_capture_on_commit_callbacks):
    client = api(analyst)
    a, b = two_datasets
    # handed over interleaved: a, b, a, b
    reqs = [claimed(client, django_capture_on_commit_callbacks, ds, 0.1 * (k + 1)) for k, ds in enumerate((a, b, a, b))]
    group = [outcomes.Outcome(req, "succeeded", result={"value": k}) for k, req in enumerate(reqs)]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        outcomes.write_group(group)
    assert len(callbacks) == 1  # one transaction: one wake-up callback for the four
    for k, req in enumerate(reqs):
        req.refresh_from_db()
        assert (req.status, req.result) == ("succeeded", {"value": k})
        assert LedgerEntry.objects.get(pk=req.ledger_entry_id).status == "committed"
    for ds, mine in ((a, reqs[0::2]), (b, reqs[1::2])):
        chain = list(AuditRecord.objects.filter(dataset=ds, action="commit").order_by("seq"))
        assert [r.request_id for r in chain] == [r.pk for r in mine]  # chained in hand-over order
    assert verification.verify().ok


def test_one_failing_outcome_in_a_group_loses_no_other(api, analyst, two_datasets, django_capture_on_commit_callbacks):
    client = api(analyst)
    a, b = two_datasets
    good1, bad, good2 = (claimed(client, django_capture_on_commit_callbacks, ds, 0.2) for ds in (a, a, b))
    # an actual event that costs more than the reservation: ledger.commit refuses it
    group = [outcomes.Outcome(good1, "succeeded", result={"value": 1}),
             outcomes.Outcome(bad, "succeeded", result={"value": 2}, actual_event={"kind": "laplace", "epsilon": 3.0}),
             outcomes.Outcome(good2, "succeeded", result={"value": 3})]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        outcomes.write_group(group)
    assert len(callbacks) == 2  # the group rolled back, then one transaction per outcome that succeeded
    for req in (good1, good2):
        req.refresh_from_db()
        assert req.status == "succeeded"
        assert LedgerEntry.objects.get(pk=req.ledger_entry_id).status == "committed"
    bad.refresh_from_db()
    assert bad.status == "running" and bad.result is None  # left to the recovery sweep, as before
    assert LedgerEntry.objects.get(pk=bad.ledger_entry_id).status == "reserved"
    assert AuditRecord.objects.filter(request_id=bad.pk).count() == 0
    assert AuditRecord.objects.filter(action="commit").count() == 2 and verification.verify().ok


def test_a_group_drops_the_outcome_of_a_request_the_sweep_finished(api, analyst, two_datasets,
                                                                    django_capture_on_commit_callbacks):
    client = api(analyst)
    a, _ = two_datasets
    kept, swept = (claimed(client, django_capture_on_commit_callbacks, a, 0.3) for _ in range(2))
    Request.objects.filter(pk=swept.pk).update(status="failed", error={"code": "request.worker_lost"})
    with django_capture_on_commit_callbacks(execute=False):
        outcomes.write_group([outcomes.Outcome(swept, "succeeded", result={"value": 9}),
                              outcomes.Outcome(kept, "succeeded", result={"value": 1})])
    swept.refresh_from_db()
    kept.refresh_from_db()
    assert swept.status == "failed" and swept.result is None  # never shown
    assert LedgerEntry.objects.get(pk=swept.ledger_entry_id).status == "reserved"  # the sweep's to settle
    assert not verification.verify().ok  # a reservation whose request is finished: verify names it
    from governance.ledger import actions as ledger

    ledger.release(swept.ledger_entry_id)  # as the sweep does, in the transaction that marks it failed
    assert kept.status == "succeeded" and verification.verify().ok


def test_a_refund_and_a_charge_of_one_dataset_in_one_group(api, analyst, two_datasets,
                                                           django_capture_on_commit_callbacks):
    client = api(analyst)
    a, _ = two_datasets
    charged, refunded = (claimed(client, django_capture_on_commit_callbacks, a, 0.5) for _ in range(2))
    with django_capture_on_commit_callbacks(execute=False):
        outcomes.write_group([outcomes.Outcome(refunded, "failed", error={"code": "request.failed_before_read",
                                                                           "detail": "x"}, charge=False),
                              outcomes.Outcome(charged, "succeeded", result={"value": 1})])
    assert LedgerEntry.objects.get(pk=refunded.ledger_entry_id).status == "released"
    assert LedgerEntry.objects.get(pk=charged.ledger_entry_id).status == "committed"
    # the registration's and the grant's records, then the group's two
    assert [r.action for r in AuditRecord.objects.filter(dataset=a).order_by("seq")] == ["settings", "grant",
                                                                                         "release", "commit"]
    assert verification.verify().ok


def test_a_dataset_s_charges_in_a_group_are_two_statements_under_its_lock(api, analyst, two_datasets,
                                                                           django_capture_on_commit_callbacks):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from governance.ledger import group as ledger_group

    client = api(analyst)
    a, _ = two_datasets
    reqs = [claimed(client, django_capture_on_commit_callbacks, a, 0.1 + k * 0.01) for k in range(3)]
    with CaptureQueriesContext(connection) as q:
        ledger_group.commit_many([(r.ledger_entry_id, trail.Context.of_request(r, outcome="succeeded")) for r in reqs])
    if connection.vendor == "postgresql":
        assert len(q.captured_queries) == 2  # lock + read all; compare-and-set + records + chain head
    assert [r.request_id for r in AuditRecord.objects.filter(dataset=a, action="commit").order_by("seq")] == [
        r.pk for r in reqs]
    assert set(LedgerEntry.objects.filter(dataset=a).values_list("status", flat=True)) == {"committed"}
    assert verification.verify().ok


def test_an_entry_committed_elsewhere_sends_the_group_one_by_one_and_nothing_is_recorded_twice(
        api, analyst, two_datasets, django_capture_on_commit_callbacks):
    from django.db import connection

    from governance.ledger import actions as ledger

    client = api(analyst)
    a, _ = two_datasets
    first, again, other = (claimed(client, django_capture_on_commit_callbacks, a, 0.2 + k * 0.01) for k in range(3))
    ledger.commit(again.ledger_entry_id)  # e.g. a run that committed before its request row was written
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        outcomes.write_group([outcomes.Outcome(r, "succeeded", result={"value": 1}) for r in (first, again, other)])
    # PostgreSQL: the group statement refused, rolled back, each written on its own; SQLite
    # commits entry by entry in the group, where a committed entry is a no-op
    assert len(callbacks) == (3 if connection.vendor == "postgresql" else 1)
    assert set(Request.objects.filter(pk__in=[first.pk, again.pk, other.pk]).values_list("status", flat=True)) == {
        "succeeded"}
    assert AuditRecord.objects.filter(ledger_entry_id=again.ledger_entry_id).count() == 1
    assert AuditRecord.objects.filter(dataset=a, action="commit").count() == 3 and verification.verify().ok


def test_each_wake_up_carries_what_was_committed_as_the_row_reads(api, analyst, two_datasets,
                                                                  django_capture_on_commit_callbacks, monkeypatch):
    from governance.requests import waiting

    client = api(analyst)
    a, b = two_datasets
    charged, refunded, other = (claimed(client, django_capture_on_commit_callbacks, ds, 0.3) for ds in (a, a, b))
    pushed = {}
    monkeypatch.setattr(outcomes, "signal_done", lambda pk, state=None: pushed.setdefault(pk, state))
    monkeypatch.setattr(outcomes, "signal_done_many", lambda finished: [pushed.setdefault(*f) for f in finished])
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.write_group([
            outcomes.Outcome(charged, "succeeded", result={"value": 1}),
            outcomes.Outcome(refunded, "failed", error={"code": "request.failed_before_read", "detail": "x"},
                             charge=False),
            outcomes.Outcome(other, "succeeded", result={"value": 2})])
    with django_capture_on_commit_callbacks(execute=True):  # and a lone write
        lone = claimed(client, django_capture_on_commit_callbacks, b, 0.1)
        outcomes.write(outcomes.Outcome(lone, "succeeded", result={"value": 3}))
    for req in (charged, refunded, other, lone):
        row = Request.objects.get(pk=req.pk)
        assert pushed[req.pk] is not None
        assert pushed[req.pk] == waiting.final_state(row, LedgerEntry.objects.get(pk=row.ledger_entry_id))


@pytest.mark.django_db(False)
def test_the_releaser_hands_a_group_every_write_due_at_once_and_never_one_before_its_tick():
    r = Releaser()
    calls, lone = [], []
    gate = threading.Event()
    r.at(time.monotonic(), gate.wait)  # holds the thread while the writes below are queued
    now = time.monotonic()

    def group(writes):
        calls.append(([w() for w in writes], time.monotonic()))

    for name, due in (("a", now + 0.05), ("b", now + 0.04), ("late", now + 0.5)):
        r.at(due, lambda name=name: name, group=group)
    r.at(now + 0.045, lambda: lone.append(time.monotonic()))
    time.sleep(0.1)
    gate.set()
    assert r.drain(timeout=10)
    assert [names for names, _ in calls] == [["b", "a"], ["late"]]  # due order; the late one alone, at its tick
    assert calls[1][1] >= now + 0.5 and len(lone) == 1


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_at_quantum_0_writes_outcomes_through_its_releaser(real_worker, api, analyst, make_dataset,
                                                                          grant):
    """At quantum 0 the task hands its outcome to the releaser thread too (group commit);
    every request ends committed once, with its record, and the chain verifies."""
    from .conftest import wait_for

    from governance.datasets.registry import update

    ds = update(make_dataset(epsilon=50.0), release_quantum_ms=0, actor="officer")
    grant(analyst, ds)
    client = api(analyst)
    ids = [client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                          "params": {"epsilon": 1.0 + k * 1e-6}}, format="json").json()["id"]
           for k in range(8)]
    wait_for(lambda: Request.objects.filter(pk__in=ids, status="succeeded").count() == len(ids), timeout=60)
    assert LedgerEntry.objects.filter(status="committed").count() == len(ids)
    assert AuditRecord.objects.filter(action="commit", request_id__in=ids).count() == len(ids)
    assert verification.verify().ok


@pytest.mark.django_db(transaction=True)
def test_an_outcome_whose_write_finds_the_database_away_is_written_when_it_is_back(
        api, analyst, two_datasets, django_capture_on_commit_callbacks, monkeypatch):
    """The database locked past its timeout (or restarting) when a finished run's outcome is
    written: tried again on the releaser thread until it is back, then written with its
    result and charge (before: dropped, and the sweep charged the reservation in full as
    ``request.worker_lost``)."""
    from django.db import OperationalError

    from governance.requests.releaser import RELEASER

    from governance.requests import submission

    a, _ = two_datasets
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # no task: claimed below as a worker would
    req = claimed(api(analyst), django_capture_on_commit_callbacks, a, 0.5)
    real, calls = outcomes.write, []

    def away_twice(o):
        calls.append(o.req.pk)
        if len(calls) <= 2:
            raise OperationalError("database is locked")
        return real(o)

    monkeypatch.setattr(outcomes, "write", away_twice)
    assert outcomes.write_or_retry(outcomes.Outcome(req, "succeeded", result={"value": 1})) == "running"
    assert RELEASER.drain(timeout=30) and len(calls) == 3
    req.refresh_from_db()
    assert req.status == "succeeded" and req.result == {"value": 1}
    assert LedgerEntry.objects.get(pk=req.ledger_entry_id).status == "committed"
    assert AuditRecord.objects.filter(action="commit", request_id=req.pk).count() == 1 and verification.verify().ok


@pytest.mark.parametrize("grouped", [True, False])
def test_a_result_whose_cancel_was_asked_while_it_waited_for_its_tick_is_not_released(
        api, analyst, two_datasets, django_capture_on_commit_callbacks, grouped):
    """A probe cancelled running counts after their last report, while the outcome waited
    for the dataset's release clock: the cancel answered 200 "running", and the count was
    released all the same (6 of 6 runs). It is written cancelled, charged as it was (a
    one-shot mechanism keeps its whole plan), its files gone, never shown."""
    from django.conf import settings as dj

    client = api(analyst)
    a, b = two_datasets
    asked, other = claimed(client, django_capture_on_commit_callbacks, a, 0.3), \
        claimed(client, django_capture_on_commit_callbacks, b, 0.2)
    files = dj.RESULTS_DIR / str(asked.pk)
    files.mkdir(parents=True)
    (files / "model.pt").write_bytes(b"weights")
    assert client.post(f"/api/requests/{asked.pk}/cancel/").json()["status"] == "running"
    mine = outcomes.Outcome(asked, "succeeded", result={"value": 7, "files": ["model.pt"]},
                            officer_report={"quality": {"x": 1}, "files": [{"name": "report.html"}]})
    with django_capture_on_commit_callbacks(execute=False):
        if grouped:
            outcomes.write_group([mine, outcomes.Outcome(other, "succeeded", result={"value": 1})])
        else:
            assert outcomes.write(mine) == "cancelled"
    row = Request.objects.get(pk=asked.pk)
    assert (row.status, row.result, row.error["code"]) == ("cancelled", None, "request.cancelled")
    assert LedgerEntry.objects.get(pk=asked.ledger_entry_id).status == "committed"
    rec = AuditRecord.objects.get(action="commit", request_id=asked.pk)
    assert rec.outcome == "cancelled" and not files.exists()
    assert row.officer_report == {"quality": {"x": 1}, "files": []}  # (the removed report not listed)
    if grouped:
        assert Request.objects.get(pk=other.pk).status == "succeeded"
    body = client.get(f"/api/requests/{asked.pk}/").json()
    assert body["status"] == "cancelled" and body.get("result") is None
    assert client.post(f"/api/requests/{asked.pk}/cancel/").status_code == 409
    assert verification.verify().ok


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_does_not_release_a_count_cancelled_while_it_waits_for_the_release_clock(
        real_worker, api, analyst, make_dataset, grant):
    from .conftest import wait_for

    from governance.datasets.registry import update

    ds = update(make_dataset(epsilon=50.0), release_quantum_ms=4000, actor="officer")
    grant(analyst, ds)
    client = api(analyst)
    rid = client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                         "params": {"epsilon": 1.0}}, format="json").json()["id"]
    wait_for(lambda: Request.objects.filter(pk=rid, status="running", data_read=True).exists(), timeout=60)
    r = client.post(f"/api/requests/{rid}/cancel/")
    assert r.status_code == 200 and r.json()["status"] == "running"
    wait_for(lambda: Request.objects.filter(pk=rid).exclude(status="running").exists(), timeout=60)
    row = Request.objects.get(pk=rid)
    assert (row.status, row.result) == ("cancelled", None)
    assert LedgerEntry.objects.get(pk=row.ledger_entry_id).status == "committed" and verification.verify().ok
