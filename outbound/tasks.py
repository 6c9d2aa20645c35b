"""The outbound app's Celery tasks, all on the `webhooks` queue (their own worker: a slow or dead
receiver never holds a process that sends mail)."""

from __future__ import annotations

from celery import shared_task

from outbound.services import delivering, dispatching
from outbound.services.registration import DELIVER_TASK, DISPATCH_TASK


@shared_task(name=DISPATCH_TASK, ignore_result=True)
def dispatch_events() -> int:
    """New outbound events → deliveries (rung after the writers' commits, and by beat)."""
    return dispatching.dispatch()


@shared_task(name=DELIVER_TASK, ignore_result=True)
def deliver(endpoint_id: int) -> int:
    return delivering.deliver(endpoint_id)


@shared_task(name="outbound.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    swept = delivering.sweep()
    return {"released": swept.released, "requeued": swept.requeued, "kicked": swept.kicked}
