"""Create the periodic housekeeping tasks (see emailhub.periodic) so operators see them in the admin."""

from django.db import migrations

from emailhub.periodic import PERIODIC_TASKS, create_in_migration


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name__in=PERIODIC_TASKS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_in_migration, remove)]
