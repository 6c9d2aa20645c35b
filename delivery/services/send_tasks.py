"""Send tasks through the outbox: `send_messages` with a batch of message ids, on its priority's queue.

Registered with core.outbox from DeliveryConfig.ready; every app that moves messages to
`queued` records their tasks through these functions, in the transaction that moved them.

The transactional pool's doorbell (docs/architecture.md "Adaptive claims"). A task that sends an
API message of the transactional pool (critical, high) claims the oldest waiting messages of the
pool, up to EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT, not just its own (transitions.claim_pool). So
while one such task waits on the broker unstarted, the next accepted message needs none of its
own: the task published for it is a doorbell (`wake` in its payload), and core.outbox publishes
it only if the pool's doorbell key was not already set. The worker deletes the key when the task
starts, before its claim (`answer`), so a message committed before the key was found set is
committed before that claim: it is claimed by it, or, when the claim is full, by the next one,
which the full claim asks for (`ring`). Under a backlog this turns one task per message into one
per claim; a message alone still gets its task at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from campaigns.models import Priority
from core import outbox, redis_clients

logger = logging.getLogger(__name__)

SEND_MESSAGES = "send_messages"
SEND_MESSAGES_TASK = "delivery.send_messages"

# The priorities whose API messages a pool claim takes (the transactional workers' queues).
POOLED = (Priority.CRITICAL, Priority.HIGH)
DOORBELL_KEY = "emailhub:send-doorbell:transactional"


def pooling() -> bool:
    """Whether accepted messages of the pool ring its doorbell (EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT
    above 1); at 1 every message gets a task of its own, as the source design's batch_size 1."""
    return bool(settings.EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT > 1)


def _doorbell(payload: dict[str, Any]) -> outbox.Doorbell | None:
    if not payload.get("wake"):
        return None
    return outbox.Doorbell(DOORBELL_KEY, settings.EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS)


def _kwargs(payload: dict[str, Any]) -> dict[str, Any]:
    # The task's queue is its priority; `wake` says the worker claims from the pool however its
    # own setting reads: the process that rang may not have published a task for every row.
    return {"priority": payload["priority"], "wake": bool(payload.get("wake"))}


def register() -> None:
    outbox.register_kind(
        SEND_MESSAGES,
        SEND_MESSAGES_TASK,
        args=lambda payload: [payload["ids"]],
        kwargs=_kwargs,
        queue=lambda payload: payload["priority"],
        doorbell=_doorbell,
    )


def _wakes(priority: str) -> bool:
    return priority in POOLED and pooling()


def record_send(message_ids: list[int], priority: str) -> None:
    outbox.record_many([(SEND_MESSAGES, {"ids": message_ids, "priority": priority})])


def record_sends(
    message_ids: list[int],
    priority: str,
    batch_size: int,
    *,
    publish_on: Executor | None = None,
    accepted: bool = False,
) -> None:
    """One send task per `batch_size` ids; `accepted`: the ids are API messages just accepted,
    whose tasks ring the pool's doorbell when their priority is pooled."""
    wake = accepted and _wakes(priority)
    outbox.record_many(
        [
            (SEND_MESSAGES, {"ids": message_ids[i : i + batch_size], "priority": priority, "wake": wake})
            for i in range(0, len(message_ids), batch_size)
        ],
        publish_on=publish_on,
    )


def record_sends_by_priority(rows: Iterable[tuple[int, str]], *, accepted: bool = False) -> None:
    """Send tasks for (message id, priority) rows: grouped by priority, each priority's batch size."""
    by_priority: dict[str, list[int]] = {}
    for message_id, priority in rows:
        by_priority.setdefault(priority, []).append(message_id)
    for priority, ids in by_priority.items():
        record_sends(ids, priority, settings.EMAILHUB_BATCH_SIZES[priority], accepted=accepted)


def insert_with_send(statement: str, params: Sequence[Any], priority: str) -> tuple[Any, ...] | None:
    """Run an `INSERT … RETURNING id, …` of one accepted API message and record its send task in
    the same statement (core.outbox.insert_with_task); the payload is record_sends'."""
    return outbox.insert_with_task(
        statement,
        params,
        SEND_MESSAGES,
        "jsonb_build_object('ids', jsonb_build_array(inserted.id), 'priority', %s::text, 'wake', %s)",
        [priority, _wakes(priority)],
    )


def answer() -> None:
    """A pooled task starts: unset the doorbell before claiming, so every message whose publisher
    found it set is committed before this claim (a failure leaves it to expire)."""
    try:
        redis_clients.send_path().delete(DOORBELL_KEY)
    except RedisError as exc:  # it expires within EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS
        logger.warning("could not unset the transactional doorbell (%s)", exc)


def ring(priority: str) -> None:
    """A full pool claim: more may be waiting. A doorbell task for the next claim (published
    unless one is already waiting), recorded in the outbox like any other."""
    outbox.record_many([(SEND_MESSAGES, {"ids": [], "priority": priority, "wake": True})])
