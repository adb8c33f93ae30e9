"""``audit verify`` and the exports while releases are written: each dataset is read in one
snapshot (governance/core/snapshot.py). Read statement by statement, a release committed
between the budget row's read and the records' read made a sound chain read as broken
("records were deleted or added at the end"; a probe: 16 of 16 verifications during
writes on PostgreSQL, 15 of 16 on SQLite)."""

import threading

import pytest
from django.db import connection

from governance.audit import export, verification
from governance.ledger import actions as ledger

pytestmark = pytest.mark.django_db(transaction=True)

LAPLACE = {"kind": "laplace", "epsilon": 0.01}


def _release(ds, analyst):
    def run():
        try:
            ledger.commit(ledger.admit(ds, analyst, LAPLACE).pk)
        finally:
            connection.close()  # this thread's own connection

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()


@pytest.fixture
def between_reads(monkeypatch, make_dataset, analyst, grant):
    """A release committed by another connection right after verify has read the budget row."""
    ds = make_dataset("clinic", epsilon=10.0)
    grant(analyst, ds)
    for _ in range(3):
        ledger.commit(ledger.admit(ds, analyst, LAPLACE).pk)
    real = verification.Budget.objects.get
    fired = []

    def get(*a, **kw):
        row = real(*a, **kw)
        if not fired:
            fired.append(1)
            _release(ds, analyst)
        return row

    monkeypatch.setattr(verification.Budget.objects, "get", get)
    return ds, fired


def test_verify_reads_one_moment_while_a_release_is_written(between_reads):
    ds, fired = between_reads
    result = verification.verify([ds], stop_at_first=False)
    assert fired and result.ok, result.findings
    # registration, grant and 3 releases before: the moment it began
    assert result.heads[ds.name]["seq"] == result.records == 5
    assert verification.verify([ds]).ok  # and afterwards, the release included


def test_an_export_is_of_one_moment_too(between_reads):
    ds, fired = between_reads
    data = export.build([ds])
    d = data["datasets"][0]
    assert fired and data["verification"]["ok"], data["verification"]
    assert d["head"]["seq"] == len(d["records"])
