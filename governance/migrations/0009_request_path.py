# Reserved for issue 13: the request path. Empty until that work needs schema changes,
# so that parallel work keeps one linear migration history.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0008_request_idempotency_key")]
    operations = []
