"""Add the stalled fan-out sweep to the periodic tasks (see emailhub.periodic)."""

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
        ("campaigns", "0002_campaign_counters"),
        ("delivery", "0002_periodic_tasks"),
    ]

    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
