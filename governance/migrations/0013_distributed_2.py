# Issue 14: the audit record names a distributed run's cluster job (a nullable column).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0011_distributed")]
    operations = [
        # Nullable, no default: ALTER TABLE ADD COLUMN on SQLite and PostgreSQL alike (no
        # table rebuild, so the append-only triggers of 0006 stay), old rows NULL.
        migrations.AddField(
            model_name="auditrecord",
            name="cluster",
            field=models.JSONField(blank=True, null=True, help_text="The cluster job of a distributed run: backend, "
                                   "scheduler address (no credentials), job and task keys (hashed only when set)."),
        ),
    ]
