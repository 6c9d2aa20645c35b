"""Send tasks through the outbox: `send_messages` with a batch of message ids, on its priority's queue.

Registered with core.outbox from DeliveryConfig.ready; every app that moves messages to
`queued` records their tasks through these functions, in the transaction that moved them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

from django.conf import settings

from core import outbox

SEND_MESSAGES = "send_messages"
SEND_MESSAGES_TASK = "delivery.send_messages"


def register() -> None:
    outbox.register_kind(
        SEND_MESSAGES,
        SEND_MESSAGES_TASK,
        args=lambda payload: [payload["ids"]],
        queue=lambda payload: payload["priority"],
    )


def record_send(message_ids: list[int], priority: str) -> None:
    outbox.record_many([(SEND_MESSAGES, {"ids": message_ids, "priority": priority})])


def record_sends(
    message_ids: list[int], priority: str, batch_size: int, *, publish_on: Executor | None = None
) -> None:
    """One send task per `batch_size` ids."""
    outbox.record_many(
        [
            (SEND_MESSAGES, {"ids": message_ids[i : i + batch_size], "priority": priority})
            for i in range(0, len(message_ids), batch_size)
        ],
        publish_on=publish_on,
    )


def record_sends_by_priority(rows: Iterable[tuple[int, str]]) -> None:
    """Send tasks for (message id, priority) rows: grouped by priority, each priority's batch size."""
    by_priority: dict[str, list[int]] = {}
    for message_id, priority in rows:
        by_priority.setdefault(priority, []).append(message_id)
    for priority, ids in by_priority.items():
        record_sends(ids, priority, settings.EMAILHUB_BATCH_SIZES[priority])


def insert_with_send(statement: str, params: Sequence[Any], priority: str) -> tuple[Any, ...] | None:
    """Run an `INSERT … RETURNING id, …` of one message and record its send task in the same
    statement (core.outbox.insert_with_task); the payload is record_send's."""
    return outbox.insert_with_task(
        statement,
        params,
        SEND_MESSAGES,
        "jsonb_build_object('ids', jsonb_build_array(inserted.id), 'priority', %s::text)",
        [priority],
    )
