"""Accepting transactional messages from the API."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from campaigns.models import Template
from campaigns.unsubscribe import CONTEXT_FLAG
from core.schedule_index import index_after_commit, message_unit
from delivery.exceptions import IdempotencyConflict
from delivery.models import ApiKey, Message, MessageStatus
from delivery.services import send_events, transitions
from delivery.tracking.links import CONTEXT_CLICKS, CONTEXT_OPENS


@dataclass(frozen=True)
class NewMessage:
    to: str
    priority: str
    from_email: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    html: str | None = None
    text: str | None = None
    template: Template | None = None
    context: dict[str, Any] | None = None
    send_at: datetime | None = None
    # Carry a one-click unsubscribe link (List-Unsubscribe headers, {{ unsubscribe_url }}), as
    # campaign messages do; an `unsubscribed` suppression then stops this message too.
    unsubscribe: bool = False
    # Open pixel and tracked links (delivery/tracking/), flags in the context like unsubscribe.
    track_opens: bool = False
    track_clicks: bool = False


def request_fingerprint(body: Any) -> str:
    """A stable hash of a request body, to tell a retried request from a different one."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def accept_message(
    new: NewMessage,
    *,
    api_key: ApiKey | None,
    idempotency_key: str | None = None,
    fingerprint: str | None = None,
) -> tuple[Message, bool]:
    """Store a message durably and hand it to its priority queue after commit.

    Returns (message, created). With an idempotency key already used by this API key, the
    earlier message is returned and nothing new is sent; a different body under the same key
    raises IdempotencyConflict. Concurrent requests with one key serialise on the unique index:
    the losers wait for the winner's commit, then read its row.
    """
    now = timezone.now()
    scheduled = new.send_at is not None and new.send_at > now
    # No column for the flag: it rides in the context under a key no template can name.
    context = {**(new.context or {}), CONTEXT_FLAG: True} if new.unsubscribe else new.context
    flags = {
        flag: True
        for flag, wanted in ((CONTEXT_OPENS, new.track_opens), (CONTEXT_CLICKS, new.track_clicks))
        if wanted
    }
    if flags:
        context = {**(context or {}), **flags}
    message = Message(
        api_key=api_key,
        to_email=new.to,
        from_email=new.from_email or settings.EMAILHUB_DEFAULT_FROM,
        reply_to=new.reply_to,
        subject=new.subject,
        html=new.html,
        text=new.text,
        template=new.template,
        context=context or None,
        priority=new.priority,
        status=MessageStatus.SCHEDULED if scheduled else MessageStatus.QUEUED,
        due_at=new.send_at if scheduled else None,
        queued_at=None if scheduled else now,
        idempotency_key=idempotency_key,
        request_fingerprint=fingerprint if idempotency_key else None,
    )
    try:
        if connection.in_atomic_block:
            # Inside the caller's transaction a duplicate key must not break it: a savepoint.
            with transaction.atomic():
                _insert(message, scheduled)
        else:
            # Outside one (a web request), the INSERT and its outbox event are one statement
            # in autocommit: its own transaction, no BEGIN, SAVEPOINT or COMMIT round trips.
            # A duplicate idempotency key waits on the unique index for the other request's
            # commit, then fails, and the row it read is the winner's committed one.
            _insert(message, scheduled)
    except IntegrityError:
        if not idempotency_key:
            raise
        existing = Message.objects.get(api_key=api_key, idempotency_key=idempotency_key)
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request body"
            ) from None
        return existing, False
    return message, True


def _insert(message: Message, scheduled: bool) -> None:
    """The message row with, in the same statement, its send task's outbox event (published
    after commit); a scheduled one instead goes to the schedule index after commit."""
    if scheduled:
        transitions.insert(message)
        assert message.due_at is not None  # `scheduled` means send_at is in the future
        index_after_commit([(message_unit(message.pk), message.due_at)])
    else:
        transitions.insert(
            message, run=lambda sql, params: send_events.insert_with_send(sql, params, message.priority)
        )
