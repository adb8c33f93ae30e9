"""The hash chain: written with every ledger change, and any tampering is found by
``manage.py audit verify`` (which names the first broken record)."""

import io
import itertools
import json

import pytest
from django.core.management import call_command
from django.db import connection

from governance.ledger import trail
from accounting import ACCOUNTANTS
from accounting.costs import Cost
from governance.models import AuditRecord, Budget, LedgerEntry

pytestmark = pytest.mark.django_db


def run_verify(*args):
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("audit", "verify", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, out.getvalue(), err.getvalue()


def sql(statement, params=()):
    with connection.cursor() as cur:
        cur.execute(statement, params)


T = AuditRecord._meta.db_table


def test_every_final_ledger_change_has_one_record(history):
    ds, counts = history
    recs = list(AuditRecord.objects.filter(dataset=ds).order_by("seq"))
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    assert {a: sum(r.action == a for r in recs) for a in counts} == counts
    finals = LedgerEntry.objects.filter(dataset=ds).exclude(status="reserved")
    assert sorted(r.ledger_entry_id for r in recs if r.ledger_entry_id) == sorted(e.pk for e in finals)
    assert recs[0].prev_hash == trail.GENESIS
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(recs))
    budget = Budget.objects.get(pk=ds.pk)
    assert budget.audit_seq == len(recs) and budget.audit_head == recs[-1].hash


def test_records_carry_who_what_and_the_running_totals(history, analyst):
    ds, _ = history
    commits = list(AuditRecord.objects.filter(dataset=ds, action="commit").order_by("seq"))
    state = Cost.zero()
    for rec in commits:
        entry = LedgerEntry.objects.get(pk=rec.ledger_entry_id)
        assert rec.actor == entry.analyst.username and rec.event == (entry.committed_event or entry.event)
        state = state + Cost.from_json(entry.committed_cost or entry.cost)
        assert rec.totals["rdp"]["epsilon"] == pytest.approx(
            ACCOUNTANTS["rdp"].spent(state, ds.budget_delta).epsilon, rel=1e-12)
    smaller = [r for r in commits if r.reserved_event]
    assert smaller and all(r.event["steps"] == 120 and r.reserved_event["steps"] == 300 for r in smaller)
    refusal = AuditRecord.objects.filter(dataset=ds, action="refuse").first()
    assert refusal.reason == "budget.exceeded" and "epsilon" in refusal.detail and refusal.charge is None
    assert refusal.params["note"] == "ü<b>&"


@pytest.mark.parametrize("statement", [f"UPDATE {T} SET actor = 'mallory'", f"DELETE FROM {T}"])
def test_the_database_refuses_to_edit_or_delete_records(history, statement):
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql(statement)
    assert AuditRecord.objects.filter(actor="mallory").count() == 0


def test_intact_chain_verifies(history):
    code, out, err = run_verify()
    assert code == 0, err
    assert "ok:" in out and Budget.objects.get(pk=history[0].pk).audit_head in out


def test_one_byte_of_parameters_changed_is_found(history, tamperer):
    ds, _ = history
    rec = AuditRecord.objects.get(dataset=ds, seq=7)
    tampered = json.dumps({**rec.params, "column": "agf"})
    sql(f"UPDATE {T} SET params = %s WHERE id = %s", [tampered, rec.pk])
    code, _, err = run_verify()
    assert code == 1
    assert "record 7 " in err and "hash does not match its content" in err


@pytest.mark.parametrize("field,value", [("actor", "mallory"), ("outcome", "failed"), ("result_sha256", "cd" * 32)])
def test_any_edited_field_is_found(history, tamperer, field, value):
    ds, _ = history
    rec = AuditRecord.objects.filter(dataset=ds, action="commit").order_by("seq")[3]
    sql(f"UPDATE {T} SET {field} = %s WHERE id = %s", [value, rec.pk])
    code, _, err = run_verify()
    assert code == 1 and f"record {rec.seq} " in err


@pytest.mark.parametrize("field, value", [
    ("params", '{"x": ' + "9" * 4301 + "}"),  # valid JSON: SQLite's JSON_VALID and jsonb take it
    ("event", "[" * 990 + "]" * 990),  # (SQLite's JSON_VALID stops at 1,000 levels)
    ("totals", '{"rdp": ' + "[" * 990 + "]" * 990 + "}"),
])
def test_a_record_edited_to_json_python_cannot_read_is_named_by_verify_and_exports_go_on(
        history, tamperer, field, value, api, auditor):
    """One record so edited ended verify, every export and the audit list in a traceback
    (ValueError past 4,300 digits, RecursionError), naming no record (probe CR)."""
    ds, _ = history
    rec = AuditRecord.objects.filter(dataset=ds, action="commit").order_by("seq")[3]
    sql(f"UPDATE {T} SET {field} = %s WHERE id = %s", [value, rec.pk])
    code, _, err = run_verify("--all")
    assert code == 1 and f"record {rec.seq} " in err and "cannot be read" in err, err
    client = api(auditor)
    assert client.get("/api/audit/verify/").status_code == 200
    assert client.get(f"/api/audit/?dataset__name={ds.name}").status_code == 200
    r = client.get(f"/api/audit/export/?dataset={ds.name}&format=json")
    assert r.status_code == 200 and b"unreadable JSON" in b"".join(r.streaming_content)


def test_edited_charge_with_a_recomputed_hash_disagrees_with_the_ledger(history, tamperer):
    """Someone rewrites a record *and* its hash: the link to the next record breaks."""
    ds, _ = history
    rec = AuditRecord.objects.filter(dataset=ds, action="commit").order_by("seq")[2]
    rec.charge = {k: {**v, "epsilon": 0.0} for k, v in rec.charge.items()}
    new_hash = trail.digest(trail.body(rec, ds.name))
    sql(f"UPDATE {T} SET charge = %s, hash = %s WHERE id = %s", [json.dumps(rec.charge), new_hash, rec.pk])
    code, _, err = run_verify()
    assert code == 1 and f"record {rec.seq} " in err and "charge differs" in err


def test_a_rewritten_tail_is_found_by_the_ledger_agreement(history, tamperer):
    """Re-hashing the whole chain after an edit keeps the links, not the ledger's agreement."""
    ds, _ = history
    recs = list(AuditRecord.objects.filter(dataset=ds).order_by("seq"))
    target = next(r for r in recs if r.action == "commit" and r.seq > 3)
    prev = recs[target.seq - 2].hash
    for rec in recs[target.seq - 1:]:
        if rec.pk == target.pk:
            rec.event = {"kind": "laplace", "epsilon": 1e-6}
        rec.prev_hash = prev
        rec.hash = trail.digest(trail.body(rec, ds.name))
        sql(f"UPDATE {T} SET event = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [json.dumps(rec.event), rec.prev_hash, rec.hash, rec.pk])
        prev = rec.hash
    sql(f"UPDATE {Budget._meta.db_table} SET audit_head = %s WHERE dataset_id = %s", [prev, ds.pk])
    code, _, err = run_verify()
    assert code == 1 and f"record {target.seq} " in err and "event differs" in err


def test_a_deleted_record_is_found(history, tamperer):
    ds, _ = history
    sql(f"DELETE FROM {T} WHERE dataset_id = %s AND seq = 5", [ds.pk])
    code, _, err = run_verify()
    assert code == 1 and "record 6 " in err and "expected record 5" in err


def test_a_deleted_last_record_is_found(history, tamperer):
    ds, _ = history
    last = Budget.objects.get(pk=ds.pk).audit_seq
    sql(f"DELETE FROM {T} WHERE dataset_id = %s AND seq = %s", [ds.pk, last])
    code, _, err = run_verify()
    assert code == 1 and f"budget row records {last} records" in err


def test_reordered_records_are_found(history, tamperer):
    ds, _ = history
    a, b = (AuditRecord.objects.get(dataset=ds, seq=s) for s in (3, 4))
    sql(f"UPDATE {T} SET seq = -1 WHERE id = %s", [a.pk])
    sql(f"UPDATE {T} SET seq = 3 WHERE id = %s", [b.pk])
    sql(f"UPDATE {T} SET seq = 4 WHERE id = %s", [a.pk])
    code, _, err = run_verify()
    assert code == 1 and "record 3 " in err and "prev_hash" in err


def test_a_tampered_ledger_entry_is_found(history, tamperer):
    ds, _ = history
    entry = LedgerEntry.objects.filter(dataset=ds, status="committed", committed_event__isnull=True).last()
    sql(f"UPDATE {LedgerEntry._meta.db_table} SET event = %s WHERE id = %s",
        [json.dumps({"kind": "laplace", "epsilon": 1e-9}), entry.pk])
    rec = AuditRecord.objects.get(ledger_entry_id=entry.pk)
    code, _, err = run_verify()
    assert code == 1 and f"record {rec.seq} " in err


def test_a_committed_entry_without_record_is_found(history, tamperer):
    ds, _ = history
    entry = LedgerEntry.objects.filter(dataset=ds, status="committed").order_by("-id").first()
    rec = AuditRecord.objects.get(ledger_entry_id=entry.pk)
    # drop the record and re-link the chain around it: only the ledger can tell
    recs = list(AuditRecord.objects.filter(dataset=ds, seq__gt=rec.seq).order_by("seq"))
    sql(f"DELETE FROM {T} WHERE id = %s", [rec.pk])
    prev = rec.prev_hash
    for r in recs:
        r.seq -= 1
        r.prev_hash = prev
        r.hash = trail.digest(trail.body(r, ds.name))
        sql(f"UPDATE {T} SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s", [r.seq, r.prev_hash, r.hash, r.pk])
        prev = r.hash
    sql(f"UPDATE {Budget._meta.db_table} SET audit_head = %s, audit_seq = audit_seq - 1 WHERE dataset_id = %s",
        [prev, ds.pk])
    code, _, err = run_verify("--all")
    assert code == 1 and ("has no audit record" in err or "re-compose" in err)


L = LedgerEntry._meta.db_table


def _committed(ds, **kw):
    return LedgerEntry.objects.filter(dataset=ds, status="committed", **kw).order_by("id").last()


def _tamper_state(ds, analyst2):
    sql(f"UPDATE {Budget._meta.db_table} SET state = %s WHERE dataset_id = %s", ["{}", ds.pk])


def _tamper_grant_state(ds, analyst2):
    from governance.models import Grant

    sql(f"UPDATE {Grant._meta.db_table} SET state = %s WHERE id = %s",
        ["{}", Grant.objects.get(dataset=ds, analyst=analyst2).pk])


def _tamper_analyst(ds, analyst2):
    entry = _committed(ds)
    other = analyst2.pk if entry.analyst_id != analyst2.pk else LedgerEntry.objects.exclude(
        analyst_id=analyst2.pk).first().analyst_id
    sql(f"UPDATE {L} SET analyst_id = %s WHERE id = %s", [other, entry.pk])


def _tamper_grant(ds, analyst2):
    sql(f"UPDATE {L} SET grant_id = NULL WHERE id = %s", [_committed(ds, grant__isnull=False).pk])


def _tamper_reference(ds, analyst2):
    sql(f"UPDATE {L} SET reference = 'elsewhere' WHERE id = %s", [_committed(ds).pk])


def _tamper_cost(ds, analyst2):
    entry = _committed(ds, committed_event__isnull=True)
    sql(f"UPDATE {L} SET cost = %s WHERE id = %s", [json.dumps(Cost.zero().to_json()), entry.pk])


def _tamper_reservation(ds, analyst2):  # a cancelled run's reservation (the record keeps it)
    entry = _committed(ds, committed_event__isnull=False)  # made to look as if it reserved what it spent
    sql(f"UPDATE {L} SET event = %s, cost = %s WHERE id = %s",
        [json.dumps(entry.committed_event), json.dumps(entry.committed_cost), entry.pk])


def _tamper_stray_reservation(ds, analyst2):
    entry = _committed(ds, grant__isnull=False)
    sql(f"INSERT INTO {L} (dataset_id, analyst_id, grant_id, reference, event, cost, charge, non_private, status, "
        "created_at) SELECT dataset_id, analyst_id, grant_id, 'fake', event, cost, charge, non_private, 'reserved', "
        f"created_at FROM {L} WHERE id = %s", [entry.pk])


def _tamper_non_private(ds, analyst2):  # flagged non-private: counted apart from the budget
    sql(f"UPDATE {L} SET non_private = %s WHERE id = %s", [True, _committed(ds).pk])


@pytest.mark.parametrize("tamper, says", [
    (_tamper_state, "running state (what the gate admits against)"),
    (_tamper_non_private, "non_private flag is not its event's"),
    (_tamper_grant_state, "running state differs from its ledger entries"),
    (_tamper_analyst, "actor differs"),
    (_tamper_grant, "no grant and its analyst is not an officer"),
    (_tamper_reference, "reference differs"),
    (_tamper_cost, "cost is not its event's"),
    (_tamper_reservation, "reserved event differs"),
    (_tamper_stray_reservation, "reserved without a request in flight"),
])
def test_ledger_fields_the_records_do_not_hash_are_checked_too(history, tamperer, analyst2, tamper, says):
    """A hostile probe (2026-11-27) edited each of these with verify saying "ok"; an emptied
    budget state let the gate admit an overspend that only recompose_audit.py noticed."""
    ds, _ = history
    tamper(ds, analyst2)
    code, _, err = run_verify("--all")
    assert code == 1 and says in err, err


def test_spend_past_the_budget_is_found(history, tamperer):
    from governance.models import Dataset

    ds, _ = history
    sql(f"UPDATE {Dataset._meta.db_table} SET budget_epsilon = %s WHERE id = %s", [0.01, ds.pk])
    code, _, err = run_verify("--all")
    assert code == 1 and "past the budget of 0.01" in err, err


def test_records_cannot_be_edited_or_deleted_through_the_orm(history):
    from django.core.exceptions import ValidationError

    rec = AuditRecord.objects.filter(dataset=history[0]).first()
    with pytest.raises(ValidationError):
        rec.save()
    with pytest.raises(ValidationError):
        rec.delete()


def test_verify_names_an_unknown_dataset():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no dataset named nope"):
        call_command("audit", "verify", "--dataset", "nope")


def test_the_gate_state_is_rederived_once_without_a_lock(history, monkeypatch):
    """Verify reads each dataset in one snapshot (core.snapshot): the gate's state is
    re-derived once, without the budget row's lock (on SQLite the database's one write
    lock), and an edit of it is still found."""
    from accounting.costs import Cost
    from governance.audit import verification

    ds, _ = history
    calls = []
    real = verification._gate_problems
    monkeypatch.setattr(verification, "_gate_problems", lambda d: calls.append(d.pk) or real(d))
    assert verification._gate_state(ds) == [] and len(calls) == 1
    Budget.objects.filter(pk=ds.pk).update(state=Cost.zero().to_json())  # the gate's state edited
    calls.clear()
    assert "running state" in verification._gate_state(ds)[0] and len(calls) == 1


def test_verify_warns_of_released_files_the_database_does_not_know(history, settings, analyst):
    """A database restored from an older backup verifies (a consistent earlier state); the
    released files of the requests it lost are still in RESULTS_DIR, and now named."""
    import uuid

    from governance.models import Request

    ds, _ = history
    known = Request.objects.create(dataset=ds, analyst=analyst, engine="aggregates", kind="count", params={}, plan={},
                                   status=Request.Status.SUCCEEDED)
    for rid in (known.pk, "not-a-request", ".scratch"):
        (settings.RESULTS_DIR / str(rid)).mkdir(parents=True)
    code, out, err = run_verify()
    assert code == 0 and "warning" not in err, err
    lost = uuid.uuid4()
    (settings.RESULTS_DIR / str(lost)).mkdir()
    code, out, err = run_verify()
    assert code == 0 and "ok:" in out  # the chains are whole: a warning, not a finding
    assert "1 request(s) this database does not know" in err and str(lost) in err
    # a request the backup holds as queued, released after it (a probe's: run again after the restore)
    queued = Request.objects.create(dataset=ds, analyst=analyst, engine="aggregates", kind="count", params={}, plan={})
    assert queued.status == Request.Status.QUEUED
    (settings.RESULTS_DIR / str(queued.pk)).mkdir()
    code, out, err = run_verify()
    assert code == 0 and "2 request(s) this database does not know, or knows as still queued" in err, err
    assert "recover --restored" in err
