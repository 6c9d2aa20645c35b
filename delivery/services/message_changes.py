"""What an application may change about a message after it was accepted: cancel it, cancel all it
tagged (or sent under one idempotency key), or move its send time.

Each is one conditional UPDATE through delivery.services.transitions, which moves only rows that
have not been handed to a provider yet (`scheduled`, `queued`, `retry_wait`). A worker's claim
and these statements lock the same row, so whichever commits first wins and the other sees the
outcome: a message is either sent once or cancelled, never both. Whatever a change leaves in the
schedule index (a unit at the old due instant) is tidied after commit, and is harmless if it
stays: dispatch's own conditional UPDATE (transitions.queue_due) moves only a row that is still
waiting and due, and puts an early one back at its real time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.schedule_index import message_unit, move_after_commit, unindex_after_commit
from delivery.exceptions import MessageNotChangeable
from delivery.models import ApiKey, Message, MessageStatus
from delivery.services import operator, send_tasks, transitions

CANCELLED_BY_API = "cancelled through the API"
_PAST_CANCELLING = "only scheduled, queued or retry_wait messages can be cancelled"
_PAST_RESCHEDULING = "only scheduled, queued or retry_wait messages can be rescheduled"


def cancel_message(message: Message) -> Message:
    """Cancel `message` unless it was handed to a provider; cancelling a cancelled one again is
    no error. Raises MessageNotChangeable naming the status it has."""
    report = operator.cancel_messages([message.pk], reason=CANCELLED_BY_API)
    message.refresh_from_db()
    if message.pk in report.moved or message.status == MessageStatus.CANCELLED:
        return message
    raise MessageNotChangeable(message.pk, message.status, _PAST_CANCELLING)


@dataclass(frozen=True)
class CancelReport:
    cancelled: int  # moved to `cancelled` by this request
    already_cancelled: int
    past_cancelling: int  # sending, sent, failed or suppressed: too late


def cancel_carrying(
    api_key: ApiKey, *, tag: str | None = None, idempotency_key: str | None = None
) -> CancelReport:
    """Cancel every message of `api_key` that carries `tag` (or was accepted under
    `idempotency_key`) and has not been handed to a provider: one statement, however many."""
    what, value = ("tag", tag) if tag is not None else ("idempotency_key", idempotency_key)
    assert value is not None
    with transaction.atomic():
        result = transitions.cancel_carrying(api_key.pk, what, value, CANCELLED_BY_API)
        if result.indexed:
            unindex_after_commit([message_unit(message_id) for message_id in result.indexed])
    return CancelReport(
        cancelled=result.cancelled,
        already_cancelled=result.already_cancelled,
        past_cancelling=result.matched - result.cancelled - result.already_cancelled,
    )


def reschedule(message: Message, send_at: datetime) -> Message:
    """Move a message that has not been handed to a provider to `send_at`: `scheduled` at that
    instant, or `queued` now when it is not in the future (its send task recorded in the same
    transaction). Raises MessageNotChangeable naming the status it has."""
    later = send_at > timezone.now()
    with transaction.atomic():
        moved = transitions.reschedule(message.pk, send_at if later else None)
        if moved is not None:
            had, priority = moved
            unit = message_unit(message.pk)
            if later:
                move_after_commit([(unit, send_at)])  # the unit's one score: the old one is gone
            elif had != MessageStatus.QUEUED:  # a queued one has its send task already
                send_tasks.record_sends_by_priority([(message.pk, priority)])
                unindex_after_commit([unit])
    message.refresh_from_db()
    if moved is None:
        if message.campaign_id is not None:
            raise MessageNotChangeable(
                message.pk, message.status, "a campaign's messages follow its schedule"
            )
        raise MessageNotChangeable(message.pk, message.status, _PAST_RESCHEDULING)
    return message
