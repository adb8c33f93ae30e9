# Reserved for issue 15: the analyst's side (client, SQL, previews). Empty until that work needs schema changes,
# so that parallel work keeps one linear migration history.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0010_accounting")]
    operations = []
