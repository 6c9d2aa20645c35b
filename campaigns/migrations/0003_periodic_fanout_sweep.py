"""Add the stalled fan-out sweep to the periodic tasks (see emailhub.periodic)."""

from django.db import migrations

from emailhub.periodic import create_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0002_campaign_counters"),
        ("delivery", "0002_periodic_tasks"),
    ]

    operations = [migrations.RunPython(create_in_migration, migrations.RunPython.noop)]
