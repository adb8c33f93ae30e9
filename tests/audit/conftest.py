"""A small real history: commits (one with a smaller actual event), refunds, refusals."""

import pytest
from django.db import connection

from governance.ledger import trail, actions as ledger
from governance.requests.submission import GATE_REFUSALS

EVENTS = [
    {"kind": "laplace", "epsilon": 0.1},
    {"kind": "gaussian", "noise_multiplier": 5.0},
    {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 300},
    {"kind": "composed", "events": [{"kind": "laplace", "epsilon": 0.05}, {"kind": "gaussian", "noise_multiplier": 8.0}]},
    {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.02}, "count": 5},
    {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 1e-9},
]


def ctx(**kw):
    return trail.Context(engine="aggregates", kind="count", params={"column": "age", "note": "ü<b>&"}, **kw)


def build_history(ds, analysts, n=30):
    """n requests alternating over analysts and EVENTS; every 5th refunded; until refused."""
    out = {"commit": 0, "release": 0, "refuse": 0}
    for i in range(n):
        who, event = analysts[i % len(analysts)], EVENTS[i % len(EVENTS)]
        try:
            entry = ledger.admit(ds, who, event, reference=f"request {i}")
        except GATE_REFUSALS as err:
            trail.record_refusal(ds, who, event, err, ctx())
            out["refuse"] += 1
            continue
        if i % 5 == 4:
            ledger.release(entry, audit_ctx=ctx(outcome="failed", reason="request.failed_before_read"))
            out["release"] += 1
        elif event["kind"] == "subsampled_gaussian" and (i // len(EVENTS)) % 2 == 0:
            ledger.commit(entry, {**event, "steps": 120}, audit_ctx=ctx(outcome="cancelled", worker="gpu@a"))
            out["commit"] += 1
        else:
            ledger.commit(entry, audit_ctx=ctx(outcome="succeeded", result_sha256="ab" * 32, worker="cpu@a"))
            out["commit"] += 1
    return out


@pytest.fixture
def history(make_dataset, grant, analyst, analyst2):
    ds = make_dataset("survey", epsilon=3.0)
    grant(analyst, ds, cap_epsilon=1.5)
    grant(analyst2, ds)
    counts = build_history(ds, [analyst, analyst2])
    assert counts["refuse"] > 0 and counts["release"] > 0 and counts["commit"] > 5, counts
    return ds, {"settings": 1, "grant": 2, **counts}  # settings: the registration's record; the two grants


@pytest.fixture
def tamperer():
    """Someone with the rights to drop the append-only triggers (migration 0006)."""
    from importlib import import_module

    migration = import_module("governance.migrations.0006_audit_append_only")
    pg = connection.vendor == "postgresql"
    for statement in migration.POSTGRES_REVERSE if pg else migration.SQLITE_REVERSE:
        with connection.cursor() as cur:
            cur.execute(statement)
