"""Send tasks through the outbox: `send_messages` with a batch of message ids, on its priority's queue.

Registered with core.outbox from DeliveryConfig.ready; every app that moves messages to
`queued` records their tasks through these functions, in the transaction that moved them.

The transactional pool's doorbell (docs/architecture.md "Adaptive claims"). A task of the
transactional pool (critical, high) claims the oldest waiting API messages of the pool, up to
EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT, sends them, and claims again until none waits; then it
lingers a moment for more (delivery.services.sending `_send_pooled`). So while such a task
waits on the broker or runs, the next accepted message needs no task of its own: the task
recorded for it carries `bell`, and core.outbox publishes it only if the pool's doorbell key was
not set (a publisher that finds it set pushes a wake-up instead, which ends a linger at once).
A task that finds nothing more unsets the key (`answer`) and claims once more: a message whose
publisher found the key set was committed before that, so one of the task's claims takes it.
Under a storm one task sends a stream of messages, a batch per claim, without a Celery task per
message; a message alone is still claimed alone, at once.
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


def _bell() -> outbox.Doorbell:
    return outbox.Doorbell(DOORBELL_KEY, settings.EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS)


def _doorbell(payload: dict[str, Any]) -> outbox.Doorbell | None:
    return _bell() if payload.get("bell") else None


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
            (
                SEND_MESSAGES,
                {"ids": message_ids[i : i + batch_size], "priority": priority, "wake": wake, "bell": wake},
            )
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


def insert_with_send(
    statement: str, params: Sequence[Any], priority: str, also: str = ""
) -> tuple[Any, ...] | None:
    """Run an `INSERT … RETURNING id, …` of one accepted API message and record its send task in
    the same statement (core.outbox.insert_with_task, with `also`); the payload is record_sends'."""
    return outbox.insert_with_task(
        statement,
        params,
        SEND_MESSAGES,
        "jsonb_build_object('ids', jsonb_build_array(inserted.id), 'priority', %s::text, 'wake', %s::boolean, 'bell', %s::boolean)",
        [priority, _wakes(priority), _wakes(priority)],
        also=also,
    )


# Unset the doorbell, and drop its wake-ups, only if `ARGV[1]` set it last (see `answer`).
_ANSWER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1], KEYS[2]) end
return 0
"""


def linger(seconds: float, token: str) -> bool:
    """A pooled task found nothing waiting: set the doorbell to its own `token` (a publisher that
    finds it set pushes a wake-up instead of publishing a task) and wait up to `seconds` for a
    wake-up, in one round trip; True when one came (claim again). Redis trouble: False."""
    bell = _bell()
    try:
        with redis_clients.send_path().pipeline(transaction=False) as pipe:
            pipe.set(bell.key, token, px=int(bell.seconds * 1000))
            pipe.blpop([bell.wake_key], timeout=seconds)
            return pipe.execute()[1] is not None
    except RedisError as exc:
        logger.warning("could not wait on the transactional doorbell (%s)", exc)
        return False


def answer(token: str) -> None:
    """A pooled task is done: unset the doorbell if it set it last (`token`), then claim once
    more, so every message whose publisher found it set is committed before that claim. Set by
    another task since, it is that task's to unset: it lingers on it now, and claims after it
    unsets it. (A failure leaves it to expire.)"""
    bell = _bell()
    try:
        redis_clients.send_path().eval(_ANSWER, 2, bell.key, bell.wake_key, token)
    except RedisError as exc:  # it expires within EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS
        logger.warning("could not unset the transactional doorbell (%s)", exc)


def ring(priority: str) -> None:
    """Another pooled task, for the next claim (a full claim's call for help, or a task handing
    on what is left when its time is up): published whatever the doorbell says, recorded in the
    outbox like any other."""
    outbox.record_many([(SEND_MESSAGES, {"ids": [], "priority": priority, "wake": True})])
