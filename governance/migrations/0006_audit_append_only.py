"""The database itself refuses UPDATE and DELETE on audit records (append-only), on
SQLite and PostgreSQL. Someone with the rights to drop these triggers can still edit the
table: that is what the hash chain and ``audit verify`` are for."""

from django.db import migrations

TABLE = "governance_auditrecord"
MESSAGE = "audit records are append-only"

SQLITE = [f"""CREATE TRIGGER audit_no_{op.lower()} BEFORE {op} ON {TABLE}
BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END;""" for op in ("UPDATE", "DELETE")]
SQLITE_REVERSE = [f"DROP TRIGGER IF EXISTS audit_no_{op};" for op in ("update", "delete")]

POSTGRES = [f"""CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION '{MESSAGE}'; END; $$ LANGUAGE plpgsql;""",
            f"""CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {TABLE}
FOR EACH ROW EXECUTE FUNCTION audit_append_only();"""]
POSTGRES_REVERSE = [f"DROP TRIGGER IF EXISTS audit_append_only ON {TABLE};",
                    "DROP FUNCTION IF EXISTS audit_append_only();"]


def forwards(apps, schema_editor):
    statements = POSTGRES if schema_editor.connection.vendor == "postgresql" else SQLITE
    for sql in statements:
        schema_editor.execute(sql)


def backwards(apps, schema_editor):
    statements = POSTGRES_REVERSE if schema_editor.connection.vendor == "postgresql" else SQLITE_REVERSE
    for sql in statements:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("governance", "0005_audit_trail")]
    operations = [migrations.RunPython(forwards, backwards)]
