"""Add the outbound dispatcher's tick and the delivery sweep to the periodic tasks."""

from django.db import migrations

from emailhub.periodic import create_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("outbound", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_in_migration, migrations.RunPython.noop)]
