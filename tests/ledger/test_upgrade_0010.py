"""Upgrading a deployment with history across migration 0010 (issue 16): existing
datasets get approx_delta_share 0.1 (the constant the gate used before) and
pld_certification off, so every gate decision, every running total and the audit trail
stay exactly as they were: the cost vectors' order grid did not change, nothing stored is
rewritten, and ``audit verify`` still passes on the old records."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounting.costs import Cost
from governance.audit import verification
from governance.ledger import actions as ledger, limits
from governance.models import Budget, Dataset

EVENTS = [{"kind": "laplace", "epsilon": 0.1}, {"kind": "epsilon_delta", "epsilon": 0.05, "delta": 1e-9},
          {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 300},
          {"kind": "gaussian", "noise_multiplier": 5.0}]


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def snapshot(ds):
    ds = Dataset.objects.get(pk=ds.pk)
    state = Cost.from_json(Budget.objects.get(pk=ds.pk).state)
    return ledger.Limit.of_dataset(ds).spent(state), limits.budget_report(state, ledger.Limit.of_dataset(ds))


@pytest.mark.django_db(transaction=True)
def test_a_ledger_with_history_survives_the_upgrade(make_dataset, officer):
    ds = make_dataset(epsilon=5.0)
    for event in EVENTS:
        ledger.commit(ledger.admit(ds, officer, event))
    before_spent, before_report = snapshot(ds)
    assert verification.verify().ok

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("governance")
    migrate([("governance", "0009_request_path")])  # the schema before issue 16 (its fields dropped)
    migrate(latest)  # ... and the upgrade

    ds = Dataset.objects.get(pk=ds.pk)
    assert ds.approx_delta_share == 0.1 and ds.pld_certification is False
    after_spent, after_report = snapshot(ds)
    assert after_spent == before_spent
    assert after_report == before_report
    result = verification.verify()
    assert result.ok, result.as_dict()
    ledger.commit(ledger.admit(ds, officer, EVENTS[0]))  # the gate works on the upgraded rows
    assert verification.verify().ok
