# Issue 16, second round (reserved; empty until it holds operations).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0013_distributed_2")]
    operations = []
