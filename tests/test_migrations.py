"""Migrations an old process can live with: during an upgrade the web processes of the
release before keep serving after ``migrate`` ran (the web rolls without downtime), and
they write rows without the columns the new release added. A NOT NULL column added
without a database default refused every such write (a probe: 0019's ``result_salt``
made an old web process answer every POST /api/requests/ with a 409 "conflict")."""

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import AddField
from django.db.models.fields import NOT_PROVIDED

# Added before the rule: the releases that could still be serving when they ran are gone.
BEFORE_THE_RULE = "0019"


def _added_fields():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if app != "governance" or name[:4] < BEFORE_THE_RULE:
            continue
        for op in migration.operations:
            if isinstance(op, AddField):
                yield name, op.model_name, op.name


def test_every_column_added_since_has_a_database_default_or_takes_null():
    added = list(_added_fields())
    assert ("0019_request_result_salt", "request", "result_salt") in added
    for migration, model, name in added:
        field = apps.get_model("governance", model)._meta.get_field(name)
        assert field.null or field.db_default is not NOT_PROVIDED, (
            f"{migration}: {model}.{name} is NOT NULL without db_default: an old web process's INSERT fails")


@pytest.mark.django_db
def test_a_request_row_written_without_result_salt_is_stored(make_dataset, analyst):
    """What the release before writes: no result_salt column in its INSERT."""
    ds = make_dataset()
    with connection.cursor() as c:
        c.execute("INSERT INTO governance_request (id, dataset_id, analyst_id, engine, kind, params, fingerprint, "
                  "idempotency_key, plan, status, progress, data_read, cancel_requested, worker, created_at) "
                  "VALUES (%s, %s, %s, 'aggregates', 'count', '{}', '', '', '{}', 'queued', '{}', false, false, '', "
                  "CURRENT_TIMESTAMP)", ["0" * 32, ds.pk, analyst.pk])
        c.execute("SELECT result_salt FROM governance_request")
        assert c.fetchone() == ("",)
