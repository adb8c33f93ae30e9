# Reserved for issue 14: distributed execution. Empty until that work needs schema changes,
# so that parallel work keeps one linear migration history.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0011_analyst_client")]
    operations = []
