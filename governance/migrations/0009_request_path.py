# Issue 13: the request path. A dataset's own release clock (blank = the server default).
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0008_request_idempotency_key")]
    operations = [
        migrations.AddField(
            model_name="dataset",
            name="release_quantum_ms",
            field=models.PositiveIntegerField(
                verbose_name="release clock (ms)", blank=True, null=True, validators=[django.core.validators.MaxValueValidator(60000)],
                help_text="Release clock of runs on this dataset, in milliseconds: what an analyst sees of a run "
                "that reads the data (progress, outcome, finish time) changes only every this many ms, so timing "
                "does not reveal the noise drawn or the data. Blank = the server default (RELEASE_QUANTUM_MS, "
                "1000 ms). 0 turns the clock off (answers as soon as ready): an explicit choice for datasets whose "
                "timing risk you accept. At most 60000."),
        ),
    ]
