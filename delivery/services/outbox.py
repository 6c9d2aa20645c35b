"""The transactional outbox: a task is recorded with the change it announces, published after commit.

On the normal path the task goes to the broker right after the commit and its outbox row is
deleted, so latency stays low. If the process dies between commit and publish, or the broker
is unreachable, the row stays and the relay (a beat task every second) publishes it.
Publishing twice is harmless: every task starts with a conditional claim in PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Executor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from delivery.models import OutboxEvent
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

SEND_MESSAGES_TASK = "delivery.send_messages"
FAN_OUT_TASK = "campaigns.fan_out"


def _publish(kind: str, payload: dict[str, Any], producer: Any = None) -> None:
    if kind == OutboxEvent.Kind.SEND_MESSAGES:
        celery_app.send_task(
            SEND_MESSAGES_TASK,
            args=[payload["ids"]],
            queue=payload["priority"],
            retry=False,
            producer=producer,
        )
    elif kind == OutboxEvent.Kind.FAN_OUT:
        celery_app.send_task(
            FAN_OUT_TASK,
            args=[payload["campaign_id"]],
            kwargs={"requeue": bool(payload.get("requeue"))},
            queue="campaigns",
            retry=False,
            producer=producer,
        )
    else:
        raise ValueError(f"unknown outbox event kind {kind!r}")


def _publish_all(events: list[tuple[int, str, dict[str, Any]]], published: list[int]) -> None:
    """Publish over one producer connection, appending each id that went out to `published`;
    a failure stops the loop and propagates, `published` still says what went out."""
    with celery_app.producer_or_acquire() as producer:
        for event_id, kind, payload in events:
            _publish(kind, payload, producer)
            published.append(event_id)


def _publish_after_commit(events: list[tuple[int, str, dict[str, Any]]]) -> None:
    published: list[int] = []
    try:
        _publish_all(events, published)
    except Exception as exc:  # noqa: BLE001 - the relay publishes what we could not
        logger.warning("publishing %d outbox event(s) failed (%s); the relay will retry", len(events), exc)
    if published:
        _delete(published)


def _delete(event_ids: list[int]) -> None:
    # Plain SQL: QuerySet.delete() runs Django's deletion collector, ~1 ms per request here for
    # a table nothing references (profiled on POST /api/v1/messages).
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM delivery_outboxevent WHERE id = ANY(%s)", [event_ids])


def record_many(events: list[tuple[str, dict[str, Any]]], *, publisher: Executor | None = None) -> None:
    """Record events in the caller's transaction (one INSERT) and publish them after it commits.

    With `publisher` (an executor), publishing happens on its thread, so the caller can go on
    with its next transaction meanwhile (fan-out does); the caller waits for the executor before
    it finishes. A crash before they are published leaves the rows to the relay, as always.
    """
    if not events:
        return
    rows = OutboxEvent.objects.bulk_create(
        [OutboxEvent(kind=kind, payload=payload) for kind, payload in events]
    )
    pending = [(row.pk, row.kind, row.payload) for row in rows]
    if publisher is None:
        transaction.on_commit(lambda: _publish_after_commit(pending))
    else:
        transaction.on_commit(lambda: publisher.submit(_publish_after_commit, pending))


def record(kind: str, payload: dict[str, Any]) -> None:
    record_many([(kind, payload)])


def record_send(message_ids: list[int], priority: str) -> None:
    record_many([(OutboxEvent.Kind.SEND_MESSAGES, {"ids": message_ids, "priority": priority})])


def record_sends(
    message_ids: list[int], priority: str, batch_size: int, *, publisher: Executor | None = None
) -> None:
    """One send task per `batch_size` ids."""
    record_many(
        [
            (OutboxEvent.Kind.SEND_MESSAGES, {"ids": message_ids[i : i + batch_size], "priority": priority})
            for i in range(0, len(message_ids), batch_size)
        ],
        publisher=publisher,
    )


def record_sends_by_priority(rows: Iterable[tuple[int, str]]) -> None:
    """Send tasks for (message id, priority) rows: grouped by priority, each priority's batch size."""
    by_priority: dict[str, list[int]] = {}
    for message_id, priority in rows:
        by_priority.setdefault(priority, []).append(message_id)
    for priority, ids in by_priority.items():
        record_sends(ids, priority, settings.EMAILHUB_BATCH_SIZES[priority])


def record_fan_out(campaign_id: int, *, requeue: bool = False) -> None:
    """Fan-out (or, with `requeue`, first publish the campaign's queued messages again, then fan out)."""
    record(OutboxEvent.Kind.FAN_OUT, {"campaign_id": campaign_id, "requeue": requeue})


def relay(limit: int = 500) -> int:
    """Publish outbox rows that were committed but not published; return how many went out."""
    cutoff = timezone.now() - timedelta(seconds=settings.EMAILHUB_OUTBOX_GRACE_SECONDS)
    with transaction.atomic():
        events = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(created_at__lte=cutoff)
            .order_by("id")
            .values_list("id", "kind", "payload")[:limit]
        )
        published: list[int] = []
        try:
            _publish_all(events, published)
        except Exception as exc:  # noqa: BLE001 - leave the rest for the next tick
            logger.warning("outbox relay stopped after %d event(s): %s", len(published), exc)
        if published:
            _delete(published)
    if published:
        logger.info("outbox relay published %d event(s)", len(published))
    return len(published)
