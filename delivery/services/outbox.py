"""The transactional outbox: a task is recorded with the change it announces, published after commit.

On the normal path the task goes to the broker right after the commit and its outbox row is
deleted, so latency stays low. If the process dies between commit and publish, or the broker
is unreachable, the row stays and the relay (a beat task every second) publishes it.
Publishing twice is harmless: every task starts with a conditional claim in PostgreSQL.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delivery.models import OutboxEvent
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

SEND_MESSAGES_TASK = "delivery.send_messages"
FAN_OUT_TASK = "campaigns.fan_out"


def _publish(kind: str, payload: dict[str, Any]) -> None:
    if kind == OutboxEvent.Kind.SEND_MESSAGES:
        celery_app.send_task(
            SEND_MESSAGES_TASK, args=[payload["ids"]], queue=payload["priority"], retry=False
        )
    elif kind == OutboxEvent.Kind.FAN_OUT:
        celery_app.send_task(FAN_OUT_TASK, args=[payload["campaign_id"]], queue="campaigns", retry=False)
    else:
        raise ValueError(f"unknown outbox event kind {kind!r}")


def _publish_after_commit(event_id: int, kind: str, payload: dict[str, Any]) -> None:
    try:
        _publish(kind, payload)
    except Exception as exc:  # noqa: BLE001 - the relay publishes what we could not
        logger.warning("publish of outbox event %s failed (%s); the relay will retry", event_id, exc)
        return
    OutboxEvent.objects.filter(pk=event_id).delete()


def record(kind: str, payload: dict[str, Any]) -> OutboxEvent:
    """Record an event in the caller's transaction and publish it once that transaction commits."""
    event = OutboxEvent.objects.create(kind=kind, payload=payload)
    transaction.on_commit(lambda: _publish_after_commit(event.pk, kind, payload))
    return event


def record_send(message_ids: list[int], priority: str) -> OutboxEvent:
    return record(OutboxEvent.Kind.SEND_MESSAGES, {"ids": message_ids, "priority": priority})


def relay(limit: int = 500) -> int:
    """Publish outbox rows that were committed but not published; return how many went out."""
    cutoff = timezone.now() - timedelta(seconds=settings.EMAILHUB_OUTBOX_GRACE_SECONDS)
    with transaction.atomic():
        events = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(created_at__lte=cutoff)
            .order_by("id")[:limit]
        )
        published: list[int] = []
        for event in events:
            try:
                _publish(event.kind, event.payload)
            except Exception as exc:  # noqa: BLE001 - leave the rest for the next tick
                logger.warning("outbox relay could not publish event %s: %s", event.pk, exc)
                break
            published.append(event.pk)
        if published:
            OutboxEvent.objects.filter(pk__in=published).delete()
    if published:
        logger.info("outbox relay published %d event(s)", len(published))
    return len(published)
