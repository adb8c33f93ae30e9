# Issue 14: distributed execution. A dataset says where it lives and how it runs.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0010_accounting")]
    operations = [
        migrations.AddField(
            model_name="dataset", name="execution",
            field=models.CharField(
                choices=[("local", "local (a worker reads the whole table)"),
                         ("distributed", "distributed (Parquet partitions, run on the Dask cluster)")],
                default="local", max_length=12,
                help_text="local: the stored file, read by one worker; distributed: Parquet partitions at location, "
                "run on the Dask cluster (governance.partitions).")),
        migrations.AddField(
            model_name="dataset", name="location",
            field=models.CharField(blank=True, max_length=1000, help_text="A distributed dataset's partitions: "
                                   "a directory or object-store prefix (blank for a stored file).")),
        migrations.AddField(
            model_name="dataset", name="partitions",
            field=models.JSONField(blank=True, default=list, help_text="A distributed dataset's manifest: "
                                   '[{"path" (relative to location), "rows", "bytes"}], checked before each run.')),
        migrations.AddField(
            model_name="dataset", name="arrow_schema",
            field=models.TextField(blank=True, help_text="A distributed dataset's Arrow schema (IPC, base64).")),
    ]
