from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0014_accounting_2")]

    operations = []
