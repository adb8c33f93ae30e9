"""Audit records hash the same after a round trip through the database, whatever they hold.

PostgreSQL's jsonb gives 1e16 back as 10000000000000000 and -0.0 as 0.0; it refuses NUL
in text; UTF-8 cannot hold a lone surrogate. A record holding any of these once broke its
chain for good (issue 22). Each value below goes into every JSON field a request can
reach (parameters, event, detail) through the real write paths, and the chain must verify
after each, on SQLite and on PostgreSQL (scripts/test.sh runs both).
"""

import hashlib
import json
import math

import pytest
from django.db import connection, transaction

from governance.audit import verification, export as audit_export
from governance.ledger import trail, actions as ledger
from governance.models import AuditRecord
from governance.requests.submission import GATE_REFUSALS

EXTREME_NUMBERS = [1e16, -1e16, 1.5e16, 123456789012345678.0, 1e308, -1e308, 1.7976931348623157e308, 5e-324,
                   -5e-324, -0.0, 0.0, 2**63, -(2**63), 2**64 + 1, 2**53 + 1, 10**30, 1e-7, 0.1 + 0.2, 1e15,
                   math.inf, -math.inf, math.nan]
EXTREME_TEXTS = ["é" * 5000, "👩‍👩‍👧‍👦" * 1000, "\u202eevil\u202c", "e\u0301" * 300, "漢字かなカナ한글" * 500,
                 "\u200b\ufeff\u00ad", "tab\tnew\nline\r", "nul\x00inside", "lone \ud800 surrogate", "\udfff",
                 "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010ffff", "'; DROP TABLE governance_auditrecord; --", "../../etc/passwd", "%s %n {0}"]
VALUES = EXTREME_NUMBERS + EXTREME_TEXTS

pytestmark = pytest.mark.django_db


def _ctx(value):
    return trail.Context(engine="aggregates", kind="count", detail=value if isinstance(value, str) else "",
                         params={"epsilon": value, "where": {"age": value, value if isinstance(value, str) else "k":
                                                             [value, {"nested": value}]}, "list": [value] * 3})


@pytest.fixture
def dataset(make_dataset, grant, analyst):
    ds = make_dataset("extremes", epsilon=5.0)
    grant(analyst, ds)
    return ds


def _verify_ok():
    out = verification.verify()
    assert out.ok, out.as_dict()
    return out


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:30])
def test_a_refusal_holding_it_verifies(dataset, analyst, value):
    err = GATE_REFUSALS[0]("refused")
    trail.record_refusal(dataset, analyst, {"kind": "laplace", "epsilon": value}, err, _ctx(value))
    _verify_ok()


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:30])
def test_a_commit_a_refund_and_a_replay_holding_it_verify(dataset, analyst, value):
    entry = ledger.admit(dataset, analyst, {"kind": "laplace", "epsilon": 0.01}, reference="extreme")
    ledger.commit(entry, audit_ctx=_ctx(value))
    _verify_ok()
    entry = ledger.admit(dataset, analyst, {"kind": "laplace", "epsilon": 0.01}, reference="extreme")
    ledger.release(entry, audit_ctx=_ctx(value))
    _verify_ok()
    with transaction.atomic():
        trail.record_replay(dataset, analyst, _ctx(value))
    _verify_ok()


def test_every_extreme_value_in_one_chain_verifies_and_exports(dataset, analyst):
    for value in VALUES:
        trail.record_refusal(dataset, analyst, {"kind": "laplace", "epsilon": value},
                             GATE_REFUSALS[0]("refused"), _ctx(value))
        _verify_ok()
    export = json.loads(audit_export.to_json(audit_export.build([dataset])))
    records = export["datasets"][0]["records"]
    # settings: the registration; grant: the analyst's
    assert [r["action"] for r in records] == ["settings", "grant"] + ["refuse"] * len(VALUES)
    assert export["verification"]["ok"]
    for rec in records:  # a third party recomputes each hash from the exported body
        body = {k: v for k, v in rec.items() if k != "hash"}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        assert hashlib.sha256(text.encode()).hexdigest() == rec["hash"]


def test_stored_values_are_what_was_hashed():
    """``storable`` is a fixed point of the database round trip, shown on the values
    themselves: JSON text of the stored form parses back to an equal form."""
    for value in VALUES:
        stored = trail.storable({"v": value, "l": [value]})
        again = json.loads(json.dumps(stored, allow_nan=False))
        assert trail.canonical(again) == trail.canonical(stored)
        assert "\x00" not in trail.canonical(stored).decode()


def _old_rule_record(dataset, analyst, params):
    """A record as the code before ``storable`` wrote it: hashed over the values as given
    (1e16 as a float, -0.0), stored as the database stores them."""
    from governance.models import Budget

    budget = Budget.objects.select_for_update().get(pk=dataset.pk)
    rec, head = trail.prepare(budget, dataset.name, dataset.budget_delta, action=AuditRecord.Action.REPLAY,
                              actor=analyst.get_username(), ctx=trail.Context(engine="aggregates", kind="count"))
    rec.params = params
    rec.hash = trail.digest(trail.body(rec, dataset.name))
    head["audit_head"] = rec.hash
    trail.write(budget, rec, head)
    return rec


def test_a_chain_written_under_the_old_rule_verifies_under_it(dataset, analyst):
    with transaction.atomic():
        _old_rule_record(dataset, analyst, {"epsilon": 1e16, "zero": -0.0, "big": [-1.5e16, 0.0, 1e308]})
    out = _verify_ok()
    if connection.vendor == "postgresql":  # jsonb changed it: verified under the old reading
        assert out.legacy == [(dataset.name, 3)]  # (1: the registration's record, 2: the grant's)
    else:  # SQLite keeps the JSON text as written: the record verifies as it is
        assert out.legacy == []
    # new records after it are written under the new rule and verify as they are
    trail.record_refusal(dataset, analyst, {"kind": "laplace", "epsilon": 1e16}, GATE_REFUSALS[0]("x"), _ctx(1e16))
    out = _verify_ok()
    assert len(out.legacy) == (1 if connection.vendor == "postgresql" else 0)
    rec = AuditRecord.objects.get(dataset=dataset, seq=3)  # 1: the registration, 2: the grant
    body = trail.hashed_body(rec, dataset.name)
    assert trail.digest(body) == rec.hash and body["params"]["epsilon"] == 1e16


def test_an_edited_old_rule_record_is_still_found(dataset, analyst, tamperer):
    with transaction.atomic():
        rec = _old_rule_record(dataset, analyst, {"epsilon": 1e16})
    AuditRecord.objects.filter(pk=rec.pk).update(params={"epsilon": 2e16})
    out = verification.verify()
    assert not out.ok and "its hash does not match" in out.first_broken.problem


def test_a_new_record_cannot_be_passed_off_under_the_old_reading(dataset, analyst, tamperer):
    """A new record holds 10000000000000000 as an int; an edit that the old reading would
    float back to the same number (10000000000000001) is still found."""
    trail.record_refusal(dataset, analyst, {"kind": "laplace", "epsilon": 1e16}, GATE_REFUSALS[0]("x"), _ctx(1e16))
    rec = AuditRecord.objects.get(dataset=dataset, seq=3)  # 1: the registration, 2: the grant
    assert rec.params["epsilon"] == 10**16 and isinstance(rec.params["epsilon"], int)
    AuditRecord.objects.filter(pk=rec.pk).update(params={**rec.params, "epsilon": 10**16 + 1})
    out = verification.verify()
    assert not out.ok and "its hash does not match" in out.first_broken.problem
