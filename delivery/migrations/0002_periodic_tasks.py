"""The periodic housekeeping tasks, stored in django-celery-beat so operators see and edit them."""

from django.db import migrations

# name: (task, every seconds, expire seconds). A tick that waited longer than its expiry on a
# busy queue is dropped rather than run late: the next one does the same work.
PERIODIC_TASKS = {
    "emailhub: relay outbox": ("delivery.relay_outbox", 1, 5),
    "emailhub: requeue stale sends": ("delivery.requeue_stale_sending", 30, 60),
}


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    for name, (task, every, expire) in PERIODIC_TASKS.items():
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
        PeriodicTask.objects.update_or_create(
            name=name,
            defaults={"task": task, "interval": interval, "queue": "system", "expire_seconds": expire, "enabled": True},
        )
    # Tell running beats that the schedule changed.
    from django.utils import timezone

    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name__in=PERIODIC_TASKS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
