"""Add the recurring-schedule tick and the schedule reconciler to the periodic tasks."""

from django.db import migrations

from emailhub.periodic import ensure_periodic_tasks


def create(apps, schema_editor):
    ensure_periodic_tasks(
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "PeriodicTasks"),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0001_initial"),
        ("campaigns", "0003_periodic_fanout_sweep"),
    ]

    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
