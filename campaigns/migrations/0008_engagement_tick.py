"""Add the engagement refresh to the periodic tasks (see emailhub.periodic)."""

from django.db import migrations

from emailhub.periodic import create_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0007_engagement"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_in_migration, migrations.RunPython.noop)]
