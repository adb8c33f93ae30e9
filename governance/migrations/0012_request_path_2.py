# Issue 13, second round (reserved; empty until it holds operations).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0011_distributed")]
    operations = []
