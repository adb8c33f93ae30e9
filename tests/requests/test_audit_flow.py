"""Each request's audit record, written by the path that commits or refunds its charge:
a release, a failure after the read, a refund, a cancellation, a refusal and a replay."""

import pytest

from governance.audit import verification
from governance.ledger import trail
from governance.models import AuditRecord, Request
from tests.requests.test_requests_api import post

pytestmark = pytest.mark.django_db


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


def only_record(**filters):
    (rec,) = AuditRecord.objects.filter(**filters).exclude(action__in=["settings", "grant"])
    return rec


def test_a_release_is_recorded_with_its_request_result_and_worker(api, analyst, clinic,
                                                                  django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.25}).json()["id"]
    req = Request.objects.get(pk=rid)
    rec = only_record(dataset=clinic)
    assert (rec.action, rec.outcome, rec.actor, str(rec.request_id)) == ("commit", "succeeded", "ann", rid)
    assert (rec.engine, rec.kind, rec.params) == ("probe", "count", {"epsilon": 0.25})
    assert rec.ledger_entry_id == req.ledger_entry_id and rec.event == {"kind": "laplace", "epsilon": 0.25}
    assert rec.result_sha256 == trail.result_digest(req.result, req.result_salt) and len(rec.result_sha256) == 64
    assert rec.worker == req.worker and rec.requested_at == req.created_at
    assert rec.charge["basic"]["epsilon"] == pytest.approx(0.25)
    assert rec.totals["basic"]["epsilon"] == pytest.approx(0.25)
    assert verification.verify().ok


def test_a_failure_after_the_read_is_a_charged_record_without_result(api, analyst, clinic,
                                                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        post(api(analyst), {"epsilon": 0.5}, kind="fail")
    rec = only_record(dataset=clinic)
    assert (rec.action, rec.outcome, rec.reason) == ("commit", "failed", "request.failed_after_read")
    assert rec.result_sha256 == "" and "secret" not in rec.detail


def test_a_failure_before_the_read_is_a_refund_record(api, analyst, clinic, settings,
                                                      django_capture_on_commit_callbacks):
    (settings.DATA_DIR / clinic.file).unlink()
    with django_capture_on_commit_callbacks(execute=True):
        post(api(analyst), {"epsilon": 0.5})
    rec = only_record(dataset=clinic)
    assert (rec.action, rec.outcome, rec.reason) == ("release", "failed", "request.failed_before_read")
    assert rec.charge is None and rec.totals["rdp"]["epsilon"] == 0


def test_a_cancelled_queued_request_is_a_refund_record(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False):
        rid = post(client, {"epsilon": 0.5}).json()["id"]
    assert not AuditRecord.objects.exclude(action__in=["settings", "grant"]).exists()  # a reservation is not a release
    client.post(f"/api/requests/{rid}/cancel/")
    rec = only_record(dataset=clinic)
    assert (rec.action, rec.outcome, str(rec.request_id)) == ("release", "cancelled", rid)


def test_a_smaller_committed_event_is_recorded_next_to_the_reserved_one(api, analyst, clinic,
                                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        post(api(analyst), {"epsilon": 0.1}, kind="stepwise")
    rec = only_record(dataset=clinic)
    assert rec.event["count"] == 2 and rec.reserved_event["count"] == 4
    assert rec.charge["basic"]["epsilon"] == pytest.approx(0.2)


def test_a_refusal_is_recorded_though_nothing_else_is_written(api, analyst, clinic):
    r = post(api(analyst), {"epsilon": 1.5})
    assert r.status_code == 409 and not Request.objects.exists()
    rec = only_record(dataset=clinic)
    assert (rec.action, rec.outcome, rec.reason, rec.actor) == ("refuse", "refused", "budget.exceeded", "ann")
    assert rec.event == {"kind": "laplace", "epsilon": 1.5} and rec.params == {"epsilon": 1.5}
    assert "limit 1" in rec.detail and rec.ledger_entry_id is None
    assert verification.verify().ok


def test_a_refused_external_charge_is_recorded(api, officer, clinic):
    r = api(officer).post(f"/api/datasets/{clinic.name}/charges/",
                          {"event": {"kind": "laplace", "epsilon": 2.0}, "reference": "census table 3"},
                          format="json")
    assert r.status_code == 409
    rec = only_record(dataset=clinic)
    assert rec.action == "refuse" and rec.actor == "olivia" and rec.kind == "external charge"
    assert rec.reference == "census table 3" and rec.reason == "budget.exceeded"  # in its own field, as a commit's


def test_the_analyst_can_match_her_result_to_its_record_and_the_trail_alone_cannot_be_tried(
        api, analyst, auditor, clinic, django_capture_on_commit_callbacks):
    """The record's result_sha256 is SHA-256 of the result's salt (given to the analyst with
    her result) and the result's canonical JSON: she can show the record is of what she
    got; someone with the trail alone (an auditor, an export) cannot find the released
    number by hashing guesses of it."""
    import hashlib
    import json

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(client, {"epsilon": 0.25}).json()["id"]
    body = client.get(f"/api/requests/{rid}/").json()
    salt, result = body["result_salt"], body["result"]
    assert isinstance(salt, str) and len(salt) == 32
    text = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    (rec,) = api(auditor).get("/api/audit/", {"action": "commit"}).json()["results"]
    assert hashlib.sha256(salt.encode() + text).hexdigest() == rec["result_sha256"]
    assert hashlib.sha256(text).hexdigest() != rec["result_sha256"]  # the unsalted guess of the true value fails
    assert api(auditor).get(f"/api/requests/{rid}/").status_code in (403, 404)
    other = Request.objects.get(pk=rid)
    assert other.result_salt == salt and Request.objects.exclude(pk=rid).count() == 0


def test_a_replay_is_recorded_at_no_charge(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, {"epsilon": 0.5}).json()
    again = post(client, {"epsilon": 0.5}).json()
    rec = only_record(dataset=clinic, action="replay")
    assert str(rec.request_id) == again["id"] and first["id"] in rec.detail
    assert rec.charge is None and rec.result_sha256 == only_record(action="commit").result_sha256
    assert verification.verify().ok


def test_a_result_of_large_numbers_hashes_as_the_analyst_gets_it(api, analyst, auditor, make_dataset, grant,
                                                                  django_capture_on_commit_callbacks):
    """A sum over bounds of +-1e17 releases floats of 1e16 and more, which PostgreSQL's jsonb
    gives back as ints: the record hashed the floats, the analyst got the ints, and her
    sha256(salt + canonical(result)) never matched; its replay's record hashed the ints, a
    second hash of one release (probe CR)."""
    import hashlib
    import json

    ds = make_dataset("wide", epsilon=5.0, schema={"age": {"lower": 18, "upper": 90},
                                                   "income": {"lower": -1e17, "upper": 1e17}})
    grant(analyst, ds)
    client = api(analyst)
    ask = {"dataset": "wide", "engine": "aggregates", "kind": "sum", "params": {"column": "income", "epsilon": 1.0}}
    with django_capture_on_commit_callbacks(execute=True):
        rid = client.post("/api/requests/", ask, format="json").json()["id"]
    body = client.get(f"/api/requests/{rid}/").json()
    assert body["status"] == "succeeded", body
    text = json.dumps(body["result"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert "100000000000000000" in text.decode()  # the noise scale, 1e17: past where jsonb writes ints
    assert client.post("/api/requests/", ask, format="json").status_code == 200  # a replay
    hashes = {r["action"]: r["result_sha256"] for r in api(auditor).get("/api/audit/").json()["results"]
              if r["action"] in ("commit", "replay")}
    assert hashes["commit"] == hashes["replay"] == hashlib.sha256(body["result_salt"].encode() + text).hexdigest()
