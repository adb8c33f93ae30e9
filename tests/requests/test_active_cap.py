"""``MAX_ACTIVE_REQUESTS``: one analyst's requests queued or running at once. Past it a new
request is a 429 ``request.too_many_active`` with ``Retry-After``, nothing planned into
the ledger, until one ends; other analysts are not held up, and a replay (no work) passes.
Without it one analyst could queue hours of every worker's time (a probe's finding)."""

import pytest

from governance.core.errors import TooManyActive
from governance.models import AuditRecord, LedgerEntry, Request
from governance.requests import submission
from tests.ledger.test_concurrency import run_threads

URL = "/api/requests/"


def count(eps):
    return {"dataset": "clinic", "engine": "aggregates", "kind": "count", "params": {"epsilon": eps}}


@pytest.fixture
def clinic(make_dataset, grant, analyst, analyst2, monkeypatch, settings):
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # no worker: requests stay queued
    settings.MAX_ACTIVE_REQUESTS = 2
    ds = make_dataset("clinic", epsilon=10.0)
    grant(analyst, ds)
    grant(analyst2, ds)
    return ds


@pytest.mark.django_db
def test_past_the_cap_a_request_waits_for_one_to_end(clinic, api, analyst, analyst2):
    first = [api(analyst).post(URL, count(0.1 + i / 100), format="json") for i in range(2)]
    assert [r.status_code for r in first] == [202, 202]
    entries, records = LedgerEntry.objects.count(), AuditRecord.objects.count()
    r = api(analyst).post(URL, count(0.2), format="json")
    assert r.status_code == 429 and r["Retry-After"] == "10", r.content
    body = r.json()
    assert body["code"] == "request.too_many_active" and body["active"] == 2 and body["max_active"] == 2
    assert "cancel one" in body["detail"]
    assert (LedgerEntry.objects.count(), AuditRecord.objects.count()) == (entries, records)  # nothing charged
    assert Request.objects.filter(analyst=analyst).count() == 2
    # another analyst is not held up
    assert api(analyst2).post(URL, count(0.2), format="json").status_code == 202
    # one ends (cancelled): the next is admitted
    assert api(analyst).post(f"{URL}{first[0].json()['id']}/cancel/").status_code in (200, 202)
    assert api(analyst).post(URL, count(0.2), format="json").status_code == 202


@pytest.mark.django_db
def test_a_replay_does_no_work_and_passes_the_cap(clinic, api, analyst):
    done = api(analyst).post(URL, count(0.1), format="json").json()["id"]
    Request.objects.filter(pk=done).update(status=Request.Status.SUCCEEDED, result={"count": 7})
    assert [api(analyst).post(URL, count(0.3 + i / 100), format="json").status_code for i in range(3)] == \
        [202, 202, 429]
    r = api(analyst).post(URL, count(0.1), format="json")  # the succeeded one's parameters
    assert r.status_code in (200, 201, 202) and r.json()["replay_of"] == done, r.content


@pytest.mark.django_db
def test_zero_is_no_cap(clinic, api, analyst, settings):
    settings.MAX_ACTIVE_REQUESTS = 0
    assert {api(analyst).post(URL, count(0.1 + i / 100), format="json").status_code for i in range(5)} == {202}


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_of_one_analyst_count_one_another(clinic, analyst, settings):
    settings.MAX_ACTIVE_REQUESTS = 3

    def submit(i):
        try:
            submission.submit(analyst, clinic, "aggregates", "count", {"epsilon": 0.01 + i / 1000})
            return ["admitted"]
        except TooManyActive:
            return ["refused"]

    outcomes = run_threads(submit)
    assert outcomes.count("admitted") == 3 == Request.objects.filter(analyst=analyst).count()
    assert outcomes.count("refused") == len(outcomes) - 3 > 0
