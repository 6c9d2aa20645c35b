"""Create the `delivery.drain_tracking_hits` beat task (see emailhub.periodic)."""

from django.db import migrations

from emailhub.periodic import create_in_migration


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name="emailhub: record tracking hits"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0008_engagement_fields"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_in_migration, remove)]
