"""The request POST's statements (issue 13): a request without an Idempotency-Key is
written by the gate's own statement with its ledger entry; one with a key is inserted
before the gate's lock (a retry's insert of the same key may wait, never under the lock).
The count of statements is pinned: each one is a round trip on every DP answer."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance.models import AuditRecord, LedgerEntry, Request

URL = "/api/requests/"
COUNT = {"engine": "aggregates", "kind": "count", "params": {"epsilon": 0.25}}


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


@pytest.fixture(autouse=True)
def as_deployed():
    """The answer as a deployment gives it (tests run tasks eagerly, and the view then
    re-reads the row it answers with); the on-commit sending is captured, not run."""
    from workers import app

    eager, app.conf.task_always_eager = app.conf.task_always_eager, False
    yield
    app.conf.task_always_eager = eager


def _post(client, ds, captured, **headers):
    with CaptureQueriesContext(connection) as q:
        r = client.post(URL, {**COUNT, "dataset": ds.name}, format="json", **headers)
    # the test's transaction makes the POST's BEGIN and COMMIT savepoints: not counted
    captured.extend(x["sql"] for x in q.captured_queries if "SAVEPOINT" not in x["sql"])
    return r


@pytest.mark.django_db
def test_a_post_without_a_key_is_written_by_the_gate(api, analyst, clinic, django_capture_on_commit_callbacks):
    sql = []
    with django_capture_on_commit_callbacks(execute=False):
        r = _post(api(analyst), clinic, sql)
    assert r.status_code == 202, r.content
    req = Request.objects.get(pk=r.json()["id"])
    entry = LedgerEntry.objects.get(pk=req.ledger_entry_id)
    assert req.status == "queued" and entry.status == "reserved" and entry.reference == f"request {req.pk}"
    assert req.plan["event"] == r.json()["event"] and req.params == COUNT["params"]
    assert req.created_at is not None and req.fingerprint and req.idempotency_key == ""
    inserts = [i for i, s in enumerate(sql) if s.lstrip().upper().startswith(f"INSERT INTO {Request._meta.db_table}".upper())]
    if connection.vendor == "postgresql":
        assert not inserts, sql  # no insert of its own: the gate's statement wrote it
    else:  # the gate's writes are separate statements: the request row after its entry's
        entry_insert = next(i for i, s in enumerate(sql) if s.lstrip().upper().startswith(f"INSERT INTO {LedgerEntry._meta.db_table}".upper()))
        assert len(inserts) == 1 and inserts[0] > entry_insert, sql
    # token and user, dataset, replay lookup, the analyst's active requests (MAX_ACTIVE_REQUESTS:
    # a count, after an advisory lock on PostgreSQL), lock, the writes (one CTE on
    # PostgreSQL: four on SQLite, whose gate locks the budget and grant by two reads)
    assert len(sql) == (7 if connection.vendor == "postgresql" else 10), sql


@pytest.mark.django_db
def test_a_post_with_a_key_is_inserted_before_the_gate(api, analyst, clinic, django_capture_on_commit_callbacks):
    sql = []
    with django_capture_on_commit_callbacks(execute=False):
        r = _post(api(analyst), clinic, sql, HTTP_IDEMPOTENCY_KEY="k-1")
    assert r.status_code == 202, r.content
    first_insert = next(i for i, s in enumerate(sql) if s.lstrip().upper().startswith(("INSERT", "WITH")))
    assert Request._meta.db_table in sql[first_insert] and "governance_ledgerentry" not in sql[first_insert]
    assert Request.objects.get(pk=r.json()["id"]).ledger_entry_id is not None
    # token and user, dataset, key lookup, replay lookup, active requests (+ advisory lock
    # on PostgreSQL), insert, lock, the writes (one CTE on PostgreSQL: four on SQLite)
    assert len(sql) == (9 if connection.vendor == "postgresql" else 12), sql


@pytest.mark.django_db
def test_a_refused_post_without_a_key_leaves_no_row(api, analyst, make_dataset, grant):
    ds = make_dataset(epsilon=0.1)
    grant(analyst, ds)
    r = api(analyst).post(URL, {**COUNT, "dataset": ds.name}, format="json")
    assert r.status_code == 409, r.content
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()
    assert AuditRecord.objects.filter(action="refuse").count() == 1


@pytest.mark.django_db
def test_a_status_read_is_one_statement_after_the_token(api, analyst, officer, clinic,
                                                        django_capture_on_commit_callbacks):
    from workers import app

    app.conf.task_always_eager = True  # run in the test (as_deployed restores it)
    with django_capture_on_commit_callbacks(execute=True):
        rid = api(analyst).post(URL, {**COUNT, "dataset": clinic.name}, format="json").json()["id"]
    for user in (analyst, officer):
        client = api(user)
        with CaptureQueriesContext(connection) as q:
            r = client.get(f"{URL}{rid}/")
        assert r.status_code == 200 and r.json()["status"] == "succeeded" and r.json()["analyst"] == analyst.username
        assert r.json()["charge"]["ledger_status"] == "committed"
        assert (r.json()["result"] is not None) == (user == analyst)  # the result to the analyst who asked only
        assert len(q.captured_queries) == 2, [x["sql"] for x in q.captured_queries]  # the token, the request
    for bad in ("not-a-uuid", "0" * 31, rid.upper()[:-1] + "Z"):
        assert api(analyst).get(f"{URL}{bad}/").status_code == 404
