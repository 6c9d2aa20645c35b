"""The periodic housekeeping tasks beat runs, stored in django-celery-beat.

They are created by a migration and again, if missing, whenever beat starts; an existing row is
never overwritten, so an operator's edit in the admin (another interval, disabled) stands.
"""

from __future__ import annotations

from typing import Any

# name: (task, every N seconds, expire seconds, queue). A tick that waited longer than its expiry
# on a busy queue is dropped rather than run late: the next tick does the same work.
PERIODIC_TASKS: dict[str, tuple[str, int, int, str]] = {
    "emailhub: relay outbox": ("delivery.relay_outbox", 1, 5, "system"),
    "emailhub: requeue stale sends": ("delivery.requeue_stale_sending", 30, 60, "system"),
    "emailhub: resume stalled fan-outs": ("campaigns.resume_stalled_fanouts", 15, 30, "system"),
    "emailhub: resume stalled imports": ("campaigns.resume_stalled_imports", 15, 30, "system"),
    "emailhub: recurring schedules": ("scheduling.run_recurring", 5, 10, "system"),
    "emailhub: reconcile schedule": ("scheduling.reconcile", 30, 60, "system"),
    # Open/click hits wait in Redis until this records them, one INSERT per batch.
    "emailhub: record tracking hits": ("delivery.drain_tracking_hits", 1, 2, "system"),
    "emailhub: refresh engagement": ("campaigns.refresh_engagement", 60, 120, "campaigns"),
    # Outbound webhooks, on their own queue: events whose doorbell was lost, and deliveries no
    # task is coming for (retries the index lost, a dead task's claims).
    "emailhub: dispatch outbound events": ("outbound.dispatch_events", 1, 2, "webhooks"),
    "emailhub: sweep outbound deliveries": ("outbound.sweep", 5, 10, "webhooks"),
}


def ensure_periodic_tasks(
    interval_model: Any = None, task_model: Any = None, changed_model: Any = None
) -> int:
    """Create the missing periodic tasks; return how many were created.

    The models are parameters so the data migration can pass its historical models.
    """
    if interval_model is None:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

        interval_model, task_model, changed_model = IntervalSchedule, PeriodicTask, PeriodicTasks
    from django.utils import timezone

    created = 0
    for name, (task, every, expire, queue) in PERIODIC_TASKS.items():
        if task_model.objects.filter(name=name).exists():
            continue
        interval, _ = interval_model.objects.get_or_create(every=every, period="seconds")
        task_model.objects.create(
            name=name, task=task, interval=interval, queue=queue, expire_seconds=expire, enabled=True
        )
        created += 1
    if created:
        # Running beats re-read their schedule when this timestamp moves.
        changed_model.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})
    return created


def create_in_migration(apps: Any, schema_editor: Any) -> None:
    """RunPython body for the migrations that add periodic tasks (with historical models)."""
    ensure_periodic_tasks(
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "PeriodicTasks"),
    )
