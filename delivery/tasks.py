"""Celery tasks: thin adapters that take ids and call one service."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_init, worker_process_init, worker_process_shutdown

import fastpaths
from core import outbox
from core.outages import TASK_RETRY
from delivery.breakers import reset_process_state
from delivery.providers import check_provider_settings, close_all
from delivery.services import probes, sweeps, tracking
from delivery.services.sending import send_messages as send_messages_service
from fastpaths import db_health

logger = logging.getLogger(__name__)


# Retried within seconds when PostgreSQL or the broker is briefly unreachable (core/outages.py).
@shared_task(name="delivery.send_messages", acks_late=True, **TASK_RETRY)
def send_messages(message_ids: list[int], priority: str | None = None, wake: bool = False) -> dict[str, int]:
    # `priority` and `wake` come with tasks published since the adaptive claim (send_tasks);
    # a task from before it names its ids only, and is sent as before.
    report = send_messages_service(message_ids, priority=priority, wake=wake)
    return vars(report)


@shared_task(name="delivery.relay_outbox", ignore_result=True)
def relay_outbox() -> int:
    return outbox.relay()


@shared_task(name="delivery.queue_probe", ignore_result=True, acks_late=False)
def queue_probe(queue: str, token: str) -> bool:
    # Published by the reconciler to one send queue; reaching a worker proves that every task
    # published before it has been delivered (delivery/services/probes.py).
    return probes.mark_consumed(queue, token)


@shared_task(name="delivery.requeue_stale_sending", ignore_result=True)
def requeue_stale_sending() -> int:
    return sweeps.requeue_stale_sending()


@worker_init.connect
def _check_providers(**_: object) -> None:
    # A worker whose provider chain cannot work must not start and take tasks it would only
    # fail; the error names the setting to fix.
    check_provider_settings()
    close_all()
    # The connection check at most once a second (fastpaths/db_health.py): connected here, in
    # the main process before the pool forks, so it runs after emailhub.celery's task_prerun
    # receiver (connected at import), which re-arms the check before every task.
    if fastpaths.enabled("db_health"):
        db_health.install_worker()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked child must not share its parent's provider or Redis sockets.
    close_all()
    reset_process_state()


@worker_process_shutdown.connect
def _close_connections(**_: object) -> None:
    close_all()


@shared_task(name="delivery.drain_tracking_hits", ignore_result=True)
def drain_tracking_hits() -> int:
    return tracking.drain_hits().hits
