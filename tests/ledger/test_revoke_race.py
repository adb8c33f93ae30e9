"""An officer's revoke (or a dataset taken out of service) beside an analyst's cancels (a
helper's probe, 2026-12-02, PostgreSQL): the revoke holds the budget row's lock and cancels
the analyst's queued requests row by row, while a cancel holds its request's row and waits
for the budget's to refund it. PostgreSQL broke the deadlock by failing one side: the
officer's revoke answered 503 (the admin's action a 500 page) and the grant stayed active,
its queued requests to run. A row held by another is now skipped, never waited for: its
holder ends it queued. The interleaving is forced here; the test runs on both databases
(on SQLite the write lock puts the two one after the other)."""

import threading
import time

import pytest
from django.db import connection, connections

from governance.audit import verification
from governance.datasets import registry
from governance.ledger import actions, grants
from governance.models import Grant, LedgerEntry, Request
from governance.requests import submission

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unsent(monkeypatch):
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)


def _queued(analyst, ds, n):
    return [submission.submit(analyst, ds, "aggregates", "count", {"epsilon": 0.01})[0].pk for _ in range(n)]


@pytest.mark.parametrize("officer_acts", ["revoke", "take_out_of_service"])
def test_an_officer_s_revoke_does_not_deadlock_with_a_cancel_holding_its_request(
        make_dataset, grant, analyst, officer, monkeypatch, unsent, officer_acts):
    ds = make_dataset("clinic", epsilon=5.0)
    g = grant(analyst, ds)
    ids = _queued(analyst, ds, 4)
    held, go, out = threading.Event(), threading.Event(), {}
    real_release = actions.release

    def release(*args, **kwargs):
        if threading.current_thread().name == "analyst":
            held.set()  # its request's row is updated (locked); the budget's lock is next
            go.wait(10)
        return real_release(*args, **kwargs)

    monkeypatch.setattr(actions, "release", release)

    def run(name, fn):
        def body():
            try:
                fn()
                out[name] = "done"
            except Exception as e:  # noqa: BLE001 - the test reports it
                out[name] = f"{type(e).__name__}: {e}"
            finally:
                connections.close_all()
        return threading.Thread(target=body, name=name)

    analyst_t = run("analyst", lambda: submission.cancel(Request.objects.get(pk=ids[0])))
    if officer_acts == "revoke":
        officer_t = run("officer", lambda: grants.revoke(Grant.objects.get(pk=g.pk), officer))
    else:
        officer_t = run("officer", lambda: registry.take_out_of_service(ds))
    analyst_t.start()
    assert held.wait(10)
    officer_t.start()
    time.sleep(1.5 if connection.vendor == "postgresql" else 0.2)  # the officer reaches the held row
    go.set()
    for t in (analyst_t, officer_t):
        t.join(60)
    assert out == {"analyst": "done", "officer": "done"}, out
    codes = dict(Request.objects.filter(pk__in=ids).values_list("pk", "error__code"))
    expected = "grant.missing" if officer_acts == "revoke" else "dataset.inactive"
    assert codes[ids[0]] == "request.cancelled" and {codes[pk] for pk in ids[1:]} == {expected}, codes
    assert set(Request.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
    assert set(LedgerEntry.objects.values_list("status", flat=True)) == {"released"}
    if officer_acts == "revoke":
        assert not Grant.objects.get(pk=g.pk).active
    assert verification.verify().ok


@pytest.mark.parametrize("officer_acts", ["revoke", "take_out_of_service"])
def test_a_row_held_for_a_moment_is_still_cancelled_by_the_revoke(make_dataset, grant, analyst, officer, unsent,
                                                                  officer_acts):
    """A probe: the sweep's requeue stamp held a queued row as the revoke passed; skipped for
    good, it stayed queued, and ran (charged) once the grant was given back. A row held by
    a statement that lets go is waited for, briefly, and cancelled with the rest."""
    from django.db import transaction

    ds = make_dataset("clinic", epsilon=5.0)
    g = grant(analyst, ds)
    ids = _queued(analyst, ds, 3)
    held, out = threading.Event(), {}

    def stamp():  # as recovery._sweep's requeue: the row's progress, in a transaction of its own
        try:
            with transaction.atomic():
                Request.objects.filter(pk=ids[1], status=Request.Status.QUEUED).update(progress={"requeued_at": 1.0})
                held.set()
                time.sleep(0.2)
        finally:
            connections.close_all()

    holder = threading.Thread(target=stamp)
    holder.start()
    assert held.wait(10)
    try:
        if officer_acts == "revoke":
            grants.revoke(Grant.objects.get(pk=g.pk), officer)
        else:
            registry.take_out_of_service(ds)
    finally:
        holder.join(30)
    assert set(Request.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
    assert set(LedgerEntry.objects.values_list("status", flat=True)) == {"released"}
    assert verification.verify().ok
