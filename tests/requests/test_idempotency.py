"""A POST retried with the same Idempotency-Key is not charged twice, whatever state the
first one is in; and a refusal's audit record commits with the refusal."""

import threading

import pytest
from django.db import connections

from governance.audit import verification
from governance.ledger import trail
from governance.requests import submission
from governance.core.errors import BudgetExceeded
from governance.models import AuditRecord, LedgerEntry, Request

pytestmark = pytest.mark.django_db
URL = "/api/requests/"


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


def post(client, params, key=None, kind="count"):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(URL, {"dataset": "clinic", "engine": "probe", "kind": kind, "params": params},
                       format="json", headers=headers)


def spent(ds) -> float:
    return sum(e.charge["basic"]["epsilon"] for e in LedgerEntry.objects.filter(dataset=ds)
               .exclude(status="released"))


def test_a_retry_while_the_first_is_queued_gets_it_back_uncharged(api, analyst, clinic,
                                                                   django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        first = post(client, {"epsilon": 0.25}, key="k-1")
        again = post(client, {"epsilon": 0.25}, key="k-1")
    assert first.status_code == again.status_code == 202
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert again.json()["id"] == first.json()["id"] and again.json()["status"] == "queued"
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1
    assert spent(clinic) == pytest.approx(0.25)


def test_a_retry_while_the_first_runs_or_after_it_failed_is_not_run_again(api, analyst, clinic,
                                                                           django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        first = post(client, {"epsilon": 0.25}, key="running")
    Request.objects.filter(pk=first.json()["id"]).update(status="running", data_read=True)
    again = post(client, {"epsilon": 0.25}, key="running")
    assert again.status_code == 202 and again.json()["status"] == "running"

    with django_capture_on_commit_callbacks(execute=True):
        failed = post(client, {"epsilon": 0.25}, key="fails", kind="fail")
    assert client.get(f"{URL}{failed.json()['id']}/").json()["status"] == "failed"
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        retry = post(client, {"epsilon": 0.25}, key="fails", kind="fail")
    assert retry.json()["id"] == failed.json()["id"] and retry.json()["status"] == "failed"
    assert not callbacks  # nothing queued
    assert Request.objects.count() == 2 and LedgerEntry.objects.count() == 2
    assert spent(clinic) == pytest.approx(0.5)


def test_without_a_key_a_retry_is_a_new_request(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        ids = {post(client, {"epsilon": 0.25}).json()["id"] for _ in range(2)}
    assert len(ids) == 2 and spent(clinic) == pytest.approx(0.5)


def test_a_retry_of_a_replayed_answer_is_the_same_replay(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        post(client, {"epsilon": 0.25})
    replay = post(client, {"epsilon": 0.25}, key="r")
    again = post(client, {"epsilon": 0.25}, key="r")
    assert replay.status_code == again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == replay.json()["id"] and again.json()["replayed"] is True
    assert Request.objects.count() == 2 and AuditRecord.objects.filter(action="replay").count() == 1


def test_the_same_key_with_other_parameters_is_refused(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        first = post(client, {"epsilon": 0.25}, key="k")
        other = post(client, {"epsilon": 0.5}, key="k")
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency.key_reused" and other.json()["request"] == first.json()["id"]
    assert Request.objects.count() == 1 and spent(clinic) == pytest.approx(0.25)


def test_keys_belong_to_one_analyst(api, analyst, analyst2, clinic, grant, django_capture_on_commit_callbacks):
    grant(analyst2, clinic)
    with django_capture_on_commit_callbacks(execute=False):
        mine = post(api(analyst), {"epsilon": 0.25}, key="shared")
        theirs = post(api(analyst2), {"epsilon": 0.25}, key="shared")
    assert mine.status_code == theirs.status_code == 202
    assert mine.json()["id"] != theirs.json()["id"] and "Idempotent-Replayed" not in theirs


@pytest.mark.parametrize("close", ["deactivate", "revoke"])
def test_a_retry_after_the_dataset_closed_to_her_gets_the_earlier_request(api, analyst, clinic, close,
                                                                         django_capture_on_commit_callbacks):
    """A POST whose answer was lost, retried after the officer deactivated the dataset or
    revoked her grant: the same POST, so the same request comes back (she sees it in her
    list anyway), not a 400 "No dataset" that leaves her unable to tell it was charged."""
    from django.utils import timezone

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        first = post(client, {"epsilon": 0.25}, key="lost")
    if close == "deactivate":
        type(clinic).objects.filter(pk=clinic.pk).update(status="draft")  # what deactivate does
    else:
        clinic.grants.update(revoked_at=timezone.now())
    again = post(client, {"epsilon": 0.25}, key="lost")
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    # only that POST: another one, or the key with another request, is refused as before
    assert post(client, {"epsilon": 0.25}).status_code == 400
    assert post(client, {"epsilon": 0.5}, key="lost").status_code == 422
    assert post(client, {"epsilon": 0.25}, key="never-sent").status_code == 400
    assert Request.objects.count() == 1 and spent(clinic) == pytest.approx(0.25)


def test_a_key_reused_on_a_dataset_she_cannot_use_says_the_same_whether_or_not_it_exists(
        api, analyst, clinic, make_dataset, django_capture_on_commit_callbacks):
    make_dataset(name="hidden", epsilon=1.0)  # no grant
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        post(client, {"epsilon": 0.25}, key="mine")
    answers = [client.post(URL, {"dataset": name, "engine": "probe", "kind": "count", "params": {"epsilon": 0.25}},
                           format="json", headers={"Idempotency-Key": "mine"}) for name in ("hidden", "no-such")]
    assert [a.status_code for a in answers] == [422, 422]
    assert answers[0].json()["detail"] == answers[1].json()["detail"]


def test_an_analyst_made_an_auditor_learns_nothing_of_her_old_requests_by_their_keys(
        api, analyst, clinic, django_capture_on_commit_callbacks):
    """Her grant revoked and she made an auditor, her old key with other parameters was a
    422 naming the request's id, engine, kind and dataset, which she may no longer see
    (probe CO); the same key and parameters, a 404 of the request."""
    from django.contrib.auth.models import Group
    from django.utils import timezone

    from governance.core import roles

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        first = post(client, {"epsilon": 0.25}, key="old")
    clinic.grants.update(revoked_at=timezone.now())
    analyst.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
    for params in ({"epsilon": 0.5}, {"epsilon": 0.25}):
        r = post(client, params, key="old")
        assert r.status_code in (400, 403) and first.json()["id"] not in r.content.decode(), r.content
    assert Request.objects.count() == 1


@pytest.mark.parametrize("key", ["", "x" * 201, "caf\u00e9", "tab\tin"])
def test_a_malformed_key_is_a_400(api, analyst, clinic, key):
    r = post(api(analyst), {"epsilon": 0.25}, key=key)
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["errors"]
    assert not Request.objects.exists()


def test_a_refused_request_with_a_key_can_be_retried_and_is_refused_again(api, analyst, clinic):
    client = api(analyst)
    assert post(client, {"epsilon": 1.5}, key="big").status_code == 409
    assert post(client, {"epsilon": 1.5}, key="big").status_code == 409
    assert not Request.objects.exists()
    assert AuditRecord.objects.filter(action="refuse").count() == 2


def test_a_refusal_is_not_answered_when_its_audit_record_cannot_be_written(analyst, clinic, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    # every record goes through trail.prepare (trail.append, and on PostgreSQL the gate's
    # one-statement refusal, ledger.refuse)
    monkeypatch.setattr(trail, "prepare", broken)
    with pytest.raises(RuntimeError, match="disk full"):  # a 500, not a 409 without its record
        submission.submit(analyst, clinic, "probe", "count", {"epsilon": 1.5})
    assert not Request.objects.exists() and not AuditRecord.objects.filter(action="refuse").exists()
    monkeypatch.undo()
    with pytest.raises(BudgetExceeded):
        submission.submit(analyst, clinic, "probe", "count", {"epsilon": 1.5})
    rec = AuditRecord.objects.exclude(action__in=["settings", "grant"]).get()
    assert (rec.action, rec.outcome, rec.reason) == ("refuse", "refused", "budget.exceeded")
    assert verification.verify().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_make_one_request(api, analyst, clinic):
    """Eight clients send the same POST with the same key at once (PostgreSQL: the unique
    index makes the losers wait for the winner's commit): one request, one charge."""
    barrier = threading.Barrier(8)
    answers, errors = [], []

    def client_thread():
        try:
            client = api(analyst)
            barrier.wait()
            r = post(client, {"epsilon": 0.25}, key="burst")
            answers.append((r.status_code, r.json().get("id"), r.get("Idempotent-Replayed")))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=client_thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert {status for status, _, _ in answers} <= {200, 202}
    assert len({rid for _, rid, _ in answers}) == 1
    assert sum(1 for *_, repeated in answers if repeated) == 7
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1
    assert spent(clinic) == pytest.approx(0.25)
