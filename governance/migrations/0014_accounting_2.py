# Issue 16: pld_certification's help text names MST syntheses beside DP-SGD runs.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0013_distributed_2")]
    operations = [
        migrations.AlterField(
            model_name="dataset",
            name="pld_certification",
            field=models.BooleanField(
                default=False,
                help_text="Let a single pre-planned run (a DP-SGD training or an MST synthesis with accountant pld) be "
                "calibrated and certified by the privacy loss distribution, which is tighter than RDP for one run but not "
                "a valid filter across adaptive requests: the gate still charges the run by its RDP curve.",
                verbose_name="PLD certification of single runs",
            ),
        ),
    ]
