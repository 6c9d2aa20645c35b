"""Add the recurring-schedule tick and the schedule reconciler to the periodic tasks."""

from django.db import migrations

from emailhub.periodic import create_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0001_initial"),
        ("campaigns", "0003_periodic_fanout_sweep"),
    ]

    operations = [migrations.RunPython(create_in_migration, migrations.RunPython.noop)]
