"""Celery tasks of the campaigns app: thin adapters over the services."""

from __future__ import annotations

from celery import shared_task

from campaigns import engagement, fanout, import_jobs, lifecycle
from campaigns.models import Campaign
from campaigns.progress import complete_if_finished
from core.outages import TASK_RETRY
from delivery.services import transitions


# Retried within seconds when PostgreSQL or the broker is briefly unreachable (core/outages.py).
@shared_task(name="campaigns.fan_out", acks_late=True, **TASK_RETRY)
def fan_out(campaign_id: int, requeue: bool = False) -> dict[str, int]:
    if requeue and Campaign.objects.filter(pk=campaign_id, status=Campaign.Status.SENDING).exists():
        transitions.republish_queued(campaign_id)
    report = fanout.fan_out(campaign_id)
    complete_if_finished([campaign_id])  # e.g. resumed after its last messages finished while paused
    return {"steps": report.steps, "members": report.members, "created": report.created}


@shared_task(name="campaigns.resume_stalled_fanouts", ignore_result=True)
def resume_stalled_fanouts() -> int:
    return lifecycle.resume_stalled_fanouts()


@shared_task(name="campaigns.run_import", acks_late=True, ignore_result=True)
def run_import(job_id: int) -> None:
    import_jobs.run_import_job(job_id)


@shared_task(name="campaigns.resume_stalled_imports", ignore_result=True)
def resume_stalled_imports() -> int:
    return import_jobs.resume_stalled_imports()


@shared_task(name="campaigns.refresh_engagement", ignore_result=True)
def refresh_engagement() -> int:
    return engagement.refresh_profiles().last_event_id
