# Issue 14, second round (reserved; empty until it holds operations).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0012_request_path_2")]
    operations = []
