# Reserved for issue 16: tighter accounting. Empty until that work needs schema changes,
# so that parallel work keeps one linear migration history.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0009_request_path")]
    operations = []
