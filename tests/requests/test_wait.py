"""``?wait=seconds`` on GET and POST /api/requests/: the answer waits for the result instead
of the client polling; bad values are a 400 before anything is planned or charged."""

import os
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from governance.requests import waiting
from governance.models import LedgerEntry, Request

URL = "/api/requests/"
# the real Redis of the ``signal`` cases (TEST_WAIT_REDIS_DB: another database for a second run beside this one)
WAIT_REDIS = f"redis://127.0.0.1:{os.environ.get('REDIS_PORT', '63799')}/{os.environ.get('TEST_WAIT_REDIS_DB', '14')}"
COUNT = {"engine": "aggregates", "kind": "count", "params": {"epsilon": 0.25}}


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    return ds


@pytest.mark.parametrize("value", ["abc", "-1", "30.5", "nan", "inf", "", "1e9", "1_0", "\u0665"])
@pytest.mark.django_db
def test_it_refuses_a_bad_wait_on_post_before_charging(api, analyst, clinic, value):
    r = api(analyst).post(f"{URL}?wait={value}", {**COUNT, "dataset": clinic.name}, format="json")
    assert r.status_code == 400 and r.json()["code"] == "request.invalid", r.content
    assert "wait" in r.json()["errors"]
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()


@pytest.mark.parametrize("value", ["x", "-0.5", "31"])
@pytest.mark.django_db
def test_it_refuses_a_bad_wait_on_get(api, analyst, clinic, value, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        rid = api(analyst).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
    r = api(analyst).get(f"{URL}{rid}/?wait={value}")
    assert r.status_code == 400 and r.json()["code"] == "request.invalid"


@pytest.mark.django_db(transaction=True)  # the task is sent (and run eagerly) on the real commit
def test_a_post_with_wait_answers_with_the_result(api, analyst, clinic):
    r = api(analyst).post(f"{URL}?wait=10", {**COUNT, "dataset": clinic.name}, format="json")
    assert r.status_code == 202  # the same code as without wait; the body is final
    assert r.json()["status"] == "succeeded" and r.json()["result"] is not None
    # read once final with the POST's dataset and analyst in hand: what a GET shows (the
    # GET adds rdp's refined figures to the charge)
    body, shown = r.json(), api(analyst).get(f"{URL}{r.json()['id']}/").json()
    assert body["charge"]["ledger_status"] == "committed" and body["analyst"] == analyst.username
    assert {k: v for k, v in body.items() if k != "charge"} == {k: v for k, v in shown.items() if k != "charge"}


@pytest.mark.django_db
def test_a_wait_ends_when_its_time_is_up(api, analyst, clinic, django_capture_on_commit_callbacks, settings):
    settings.REDIS_URL = ""
    with django_capture_on_commit_callbacks(execute=False):  # never sent: stays queued
        rid = api(analyst).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
    t0 = time.monotonic()
    body = api(analyst).get(f"{URL}{rid}/?wait=0.3").json()
    assert body["status"] == "queued" and time.monotonic() - t0 >= 0.3


@pytest.mark.parametrize("signal", [False, True], ids=["row polled", "redis signal"])
@pytest.mark.django_db(transaction=True)
def test_a_get_with_wait_returns_once_another_process_finishes_it(api, analyst, clinic, settings, signal,
                                                                 monkeypatch):
    """The finishing side is another thread writing the row (as a worker would), with and
    without the Redis signal; the waiter sees the final row, not a stale one."""
    if signal:
        settings.REDIS_URL = WAIT_REDIS
        try:
            waiting._client().ping()
        except Exception:  # noqa: BLE001
            pytest.skip("no Redis on REDIS_PORT")
    else:
        settings.REDIS_URL = ""
    from governance.requests import submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # no worker: it stays queued
    rid = api(analyst).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
    assert Request.objects.get(pk=rid).status == "queued"

    def finish():
        time.sleep(0.3)
        Request.objects.filter(pk=rid).update(status="succeeded", result={"count": 1}, finished_at=timezone.now())
        if signal:
            waiting.signal_done(rid)
        connection.close()

    t = threading.Thread(target=finish)
    t.start()
    body = api(analyst).get(f"{URL}{rid}/?wait=20").json()
    t.join()
    assert body["status"] == "succeeded" and body["result"] == {"count": 1}


def test_parse_wait_bounds():
    assert waiting.parse_wait("0") == 0 and waiting.parse_wait("30") == 30 and waiting.parse_wait("0.25") == 0.25


@pytest.mark.django_db(transaction=True)
def test_a_post_with_wait_answers_from_the_final_state_the_worker_pushed(api, analyst, clinic, settings,
                                                                        monkeypatch):
    """The worker's wake-up carries what it committed (``waiting.final_state``): the POST
    that holds the rest of the row answers without reading it again, with the answer a
    read of the row gives."""
    from governance.ledger import actions as ledger
    from governance.requests import submission
    from governance.api import request_views

    settings.REDIS_URL = WAIT_REDIS
    try:
        waiting._client().ping()
    except Exception:  # noqa: BLE001
        pytest.skip("no Redis on REDIS_PORT")
    threads = []

    def worker(pk, queue):  # as governance.requests.outcomes does: commit, then push what was committed
        def run():
            time.sleep(0.3)
            Request.objects.filter(pk=pk).update(status="succeeded", result={"count": 7}, finished_at=timezone.now(),
                                                 started_at=timezone.now(), progress={"phase": "succeeded"})
            req = Request.objects.get(pk=pk)
            entry = ledger.commit(req.ledger_entry_id)
            waiting.signal_done(pk, waiting.final_state(req, entry))
            connection.close()
        threads.append(threading.Thread(target=run))
        threads[-1].start()

    monkeypatch.setattr(submission, "enqueue", worker)
    monkeypatch.setattr(request_views, "_final_row", lambda *a: pytest.fail("the row was read again"))
    r = api(analyst).post(f"{URL}?wait=20", {**COUNT, "dataset": clinic.name}, format="json")
    threads[0].join()
    body = r.json()
    assert r.status_code == 202 and body["status"] == "succeeded" and body["result"] == {"count": 7}
    assert body["charge"]["ledger_status"] == "committed"
    shown = api(analyst).get(f"{URL}{body['id']}/").json()  # the GET adds rdp's refined figures
    assert {k: v for k, v in body.items() if k != "charge"} == {k: v for k, v in shown.items() if k != "charge"}
    assert {k: v for k, v in body["charge"].items() if k != "rdp"} == {
        k: v for k, v in shown["charge"].items() if k != "rdp"}


def test_a_final_state_too_large_to_push_is_read_from_the_row():
    req = Request(status="succeeded", progress={}, result={"x": "y" * waiting.FINAL_STATE_MAX_BYTES}, error=None,
                  officer_report=None)
    assert waiting.final_state(req) is None
    req.result = {"x": 1}
    assert waiting.apply_final_state(Request(ledger_entry_id=None), waiting.final_state(req)).result == {"x": 1}


@pytest.mark.parametrize("how", ["token revoked", "token reissued", "deactivated", "session ended"])
@pytest.mark.django_db(transaction=True)
def test_a_wait_whose_caller_was_signed_out_meanwhile_shows_nothing(api, analyst, clinic, settings, monkeypatch,
                                                                  how):
    """A probe revoked the token (or deactivated the account) while a ``?wait=30`` call
    waited: the same token got 401 elsewhere at once, and the waiting call still answered
    with the released count 9 s later."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from governance.core import tokens
    from governance.requests import submission

    settings.REDIS_URL = ""
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # no worker: finished below
    if how == "session ended":
        client = APIClient()
        client.force_login(analyst)
    else:
        client = api(analyst)
    rid = client.post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]

    def sign_out_then_finish():
        time.sleep(0.2)
        user = get_user_model().objects.get(pk=analyst.pk)
        if how == "token revoked" or how == "session ended":
            tokens.revoke(user)
        elif how == "token reissued":
            tokens.issue(user)
        else:
            get_user_model().objects.filter(pk=user.pk).update(is_active=False)
        Request.objects.filter(pk=rid).update(status="succeeded", result={"count": 1}, finished_at=timezone.now())
        connection.close()

    t = threading.Thread(target=sign_out_then_finish)
    t.start()
    r = client.get(f"{URL}{rid}/?wait=20")
    t.join()
    assert r.status_code == 401 and r.json()["code"] == "auth.failed" and "result" not in r.json(), r.content


@pytest.mark.django_db
def test_an_analyst_holding_her_waits_is_answered_at_once_and_others_still_wait(
        api, analyst, analyst2, clinic, grant, settings, django_capture_on_commit_callbacks, monkeypatch):
    """A probe's four ?wait=30 calls of one analyst held all four web threads, and another
    analyst's GET /api/me/ took 28 s: past WAITS_PER_ANALYST a call answers at once."""
    settings.REDIS_URL = ""
    grant(analyst2, clinic)
    with django_capture_on_commit_callbacks(execute=False):  # never sent: stays queued
        rid = api(analyst).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
        rid2 = api(analyst2).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
    monkeypatch.setitem(waiting._waiting, analyst.pk, settings.WAITS_PER_ANALYST)  # her waits elsewhere
    t0 = time.monotonic()
    assert api(analyst).get(f"{URL}{rid}/?wait=5").json()["status"] == "queued"
    assert time.monotonic() - t0 < 2
    t0 = time.monotonic()
    assert api(analyst2).get(f"{URL}{rid2}/?wait=0.3").json()["status"] == "queued"
    assert time.monotonic() - t0 >= 0.3 and waiting._waiting == {analyst.pk: settings.WAITS_PER_ANALYST}


def test_wait_slots_are_counted_per_user_and_given_back():
    from django.conf import settings

    with waiting.wait_slot(1) as a, waiting.wait_slot(1) as b, waiting.wait_slot(1) as c, waiting.wait_slot(2) as d:
        assert (a, b, c, d) == (True, True, settings.WAITS_PER_ANALYST > 2, True)
    assert waiting._waiting == {}


@pytest.mark.django_db(transaction=True)
def test_a_waiting_post_whose_analyst_was_made_an_auditor_meanwhile_shows_nothing(api, analyst, clinic, settings,
                                                                                   monkeypatch):
    """A probe made the analyst an auditor while her ``POST ?wait=30`` waited: the POST
    still answered with the result, which a GET of the same request (404) no longer shows."""
    from django.contrib.auth.models import Group

    from governance.core import roles
    from governance.requests import submission

    settings.REDIS_URL = ""
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # no worker: finished below

    def promote_then_finish():
        time.sleep(0.3)
        analyst.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
        Request.objects.update(status="succeeded", result={"count": 1}, finished_at=timezone.now())
        connection.close()

    t = threading.Thread(target=promote_then_finish)
    t.start()
    r = api(analyst).post(f"{URL}?wait=20", {**COUNT, "dataset": clinic.name}, format="json")
    t.join()
    assert r.status_code == 403 and "result" not in r.json() and "role changed" in r.json()["detail"], r.content
