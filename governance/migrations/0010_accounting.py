# Issue 16: tighter accounting. The RDP filter's share of delta for approximate-DP events
# becomes a per-dataset setting (it was the module constant accounting.rdp.APPROX_SHARE,
# 0.1): existing datasets get 0.1, so their gate behaves exactly as before the upgrade and
# their ledgers, cost vectors and audit records are untouched (the order grid of the cost
# vector did not change; plain composition refines the order off the grid instead).
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0009_request_path")]
    operations = [
        migrations.AddField(
            model_name="dataset",
            name="pld_certification",
            field=models.BooleanField(
                default=False, verbose_name="PLD certification of single runs",
                help_text="Let a single pre-planned run (a DP-SGD training with accountant pld) be calibrated and "
                "certified by the privacy loss distribution, which is tighter than RDP for one run but not a valid filter across "
                "adaptive requests: the gate still charges the run by its RDP curve."),
        ),
        migrations.AddField(
            model_name="dataset",
            name="approx_delta_share",
            field=models.FloatField(
                default=0.1, verbose_name="delta share for (epsilon, delta) events",
                validators=[django.core.validators.MinValueValidator(0.0),
                            django.core.validators.MaxValueValidator(0.9)],
                help_text="RDP policy: the fraction of the budget's delta set aside for approximate-DP releases "
                "(epsilon_delta events); the rest is split over the filter's orders. Larger admits more such "
                "releases and makes every other request slightly dearer. 0 refuses them. Default 0.1, at most 0.9."),
        ),
    ]
