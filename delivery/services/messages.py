"""Accepting transactional messages from the API."""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone

from campaigns.models import Template
from core.schedule_index import index_after_commit, message_unit
from delivery.exceptions import BatchConflict, IdempotencyConflict
from delivery.models import ApiKey, Message, MessageStatus
from delivery.services import attachments as attachment_contents
from delivery.services import send_tasks, transitions
from delivery.services.attachments import NewAttachment


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
    # Open pixel and tracked links (delivery/tracking/).
    track_opens: bool = False
    track_clicks: bool = False
    # An operator's test send (delivery.services.test_sends): their user name.
    test_send_by: str | None = None
    # What the application attaches to recognise the message (never sent in a header).
    tags: tuple[str, ...] = ()
    metadata: dict[str, str] | None = None
    # Extra headers, sent unchanged (delivery.headers says which may be given).
    headers: dict[str, str] | None = None
    # Copies: cc in the Cc header, bcc in none.
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    # Files sent with it, decoded (delivery.attachments says which may be given).
    attachments: tuple[NewAttachment, ...] = ()


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
    columns = _columns(new, idempotency_key, fingerprint, timezone.now())
    row = {**columns, "template_id": new.template.pk if new.template is not None else None}
    api_key_id = api_key.pk if api_key is not None else None
    scheduled = row["status"] == MessageStatus.SCHEDULED
    # One statement (ON CONFLICT DO NOTHING on the idempotency key, so no error and no savepoint
    # even inside a caller's transaction). Outside one (a web request) it runs in autocommit:
    # the row and its outbox task are their own transaction, no BEGIN or COMMIT round trips. A
    # concurrent request with the same key waits on the unique index for the other's commit,
    # inserts nothing, and then reads the winner's committed row. A message with attachments
    # adds their contents' INSERT, in one transaction with the row that names them.
    with transaction.atomic() if new.attachments else nullcontext():
        attachment_contents.store_contents(new.attachments)
        if scheduled:
            inserted = transitions.insert_one(api_key_id, row)
        else:
            inserted = transitions.insert_one(
                api_key_id,
                row,
                run=lambda sql, params, also: send_tasks.insert_with_send(sql, params, new.priority, also),
            )
        if inserted is None:
            existing = Message.objects.get(api_key=api_key, idempotency_key=idempotency_key)
            if existing.request_fingerprint != fingerprint:
                raise IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request body"
                )
            return existing, False
    message = _stored(columns, api_key, new.template, *inserted)
    if scheduled:
        index_after_commit([(message_unit(message.pk), row["due_at"])])
    return message, True


def _stored(
    columns: dict[str, Any], api_key: ApiKey | None, template: Template | None, pk: int, created_at: datetime
) -> Message:
    """The Message the INSERT stored, as if loaded (Model.from_db): every column from what was
    written and what RETURNING gave back, no query; the key and template it was given attached."""
    values = {**columns, "id": pk, "created_at": created_at, "api_key_id": None, "template_id": None}
    fields = Message._meta.concrete_fields
    message = Message.from_db(
        DEFAULT_DB_ALIAS,
        [f.attname for f in fields],
        [values[f.attname] if f.attname in values else f.get_default() for f in fields],
    )
    message.api_key, message.template = api_key, template
    return message


def _columns(
    new: NewMessage, idempotency_key: str | None, fingerprint: str | None, now: datetime
) -> dict[str, Any]:
    """The column values of `new`'s row, but its api_key and template (transitions.NEW_COLUMNS)."""
    scheduled = new.send_at is not None and new.send_at > now
    return {
        "to_email": new.to,
        "cc": list(new.cc) or None,
        "bcc": list(new.bcc) or None,
        "from_email": new.from_email or settings.EMAILHUB_DEFAULT_FROM,
        "reply_to": new.reply_to,
        "subject": new.subject,
        "html": new.html,
        "text": new.text,
        "context": new.context or None,
        "list_unsubscribe": new.unsubscribe,
        "track_opens": new.track_opens,
        "track_clicks": new.track_clicks,
        "test_send_by": new.test_send_by,
        "tags": list(new.tags) or None,
        "metadata": new.metadata or None,
        "headers": new.headers or None,
        "attachments": attachment_contents.metadata(new.attachments),
        "priority": new.priority,
        "status": MessageStatus.SCHEDULED if scheduled else MessageStatus.QUEUED,
        "due_at": new.send_at if scheduled else None,
        "queued_at": None if scheduled else now,
        "idempotency_key": idempotency_key,
        "request_fingerprint": fingerprint if idempotency_key else None,
    }


# --- batches --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchItem:
    """One message of a batch, with its own optional idempotency key (scoped to the API key,
    shared with the single-message endpoint's Idempotency-Key) and its body's fingerprint."""

    message: NewMessage
    idempotency_key: str | None = None
    fingerprint: str | None = None


@dataclass
class BatchAccepted:
    """Per item, in order: the message id (None for an item in `conflicts`), its status, and
    whether it is an earlier message returned again for its idempotency key."""

    ids: list[int | None]
    statuses: list[str | None]
    replayed: list[bool]
    conflicts: list[int] = field(default_factory=list)  # indexes: key used with another body


def accept_batch(items: list[BatchItem], *, api_key: ApiKey | None, partial: bool = False) -> BatchAccepted:
    """Store a batch of messages in one transaction and hand them to their queues after commit:
    one INSERT for every row, one outbox INSERT for the send tasks (one task per priority's
    batch size, as campaigns do: a `normal` batch of 1,000 is 10 tasks, critical ones stay one
    per message on their own queue), and the scheduled ones indexed after commit.

    An item whose idempotency key was used before (by this API key, in this batch or earlier)
    with the same body gets that message again (`replayed`); with another body it is a
    conflict: the whole batch raises BatchConflict and writes nothing, or with `partial` only
    that item is left out (its index in `conflicts`).
    """
    now = timezone.now()
    count = len(items)
    accepted = BatchAccepted(ids=[None] * count, statuses=[None] * count, replayed=[False] * count)
    leaders, follows = _key_leaders(items)
    rows = _leader_rows(items, leaders, now)
    api_key_id = api_key.pk if api_key is not None else None
    with transaction.atomic():
        # Each distinct content once for the whole batch (none: no statement).
        attachment_contents.store_contents(a for i in leaders for a in items[i].message.attachments)
        inserted = transitions.insert_many(api_key_id, rows)
        fresh, scheduled, taken = _place_inserted(items, leaders, rows, inserted, accepted)
        if taken:
            _replay_earlier(items, taken, api_key_id, accepted)
        _replay_followers(items, follows, accepted)
        accepted.conflicts.sort()
        if accepted.conflicts and not partial:
            raise BatchConflict(accepted.conflicts)  # rolls the batch back: nothing was accepted
        send_tasks.record_sends_by_priority(fresh, accepted=True)
        index_after_commit(scheduled)
    return accepted


def _key_leaders(items: list[BatchItem]) -> tuple[list[int], dict[int, int]]:
    """The indexes of the items that get a row (the leaders), and each other item's leader."""
    # A key repeated inside the batch: the first item carries it, the others follow it.
    first_with_key: dict[str, int] = {}
    follows: dict[int, int] = {}
    for index, item in enumerate(items):
        if item.idempotency_key is not None:
            first = first_with_key.setdefault(item.idempotency_key, index)
            if first != index:
                follows[index] = first
    leaders = [index for index in range(len(items)) if index not in follows]
    return leaders, follows


def _leader_rows(items: list[BatchItem], leaders: list[int], now: datetime) -> list[dict[str, Any]]:
    """The leaders' rows for transitions.insert_many (NEW_COLUMNS), in the leaders' order."""
    rows = [_columns(items[i].message, items[i].idempotency_key, items[i].fingerprint, now) for i in leaders]
    for i, row in zip(leaders, rows, strict=True):
        template = items[i].message.template
        row["template_id"] = template.pk if template is not None else None
    return rows


def _place_inserted(
    items: list[BatchItem],
    leaders: list[int],
    rows: list[dict[str, Any]],
    inserted: list[tuple[int, str | None]],
    accepted: BatchAccepted,
) -> tuple[list[tuple[int, str]], list[tuple[str, datetime]], list[int]]:
    """Each leader's inserted row put in `accepted`; returns the rows to send (`fresh`), the
    units to index (`scheduled`) and the leaders nothing was inserted for (`taken`)."""
    by_key = {key: message_id for message_id, key in inserted if key is not None}
    unkeyed = iter(message_id for message_id, key in inserted if key is None)
    fresh: list[tuple[int, str]] = []  # (id, priority) of the queued rows inserted now
    scheduled: list[tuple[str, datetime]] = []
    taken: list[int] = []  # leaders whose key an earlier message holds
    for i, row in zip(leaders, rows, strict=True):
        key = items[i].idempotency_key
        message_id = next(unkeyed) if key is None else by_key.get(key)
        if message_id is None:
            taken.append(i)
            continue
        accepted.ids[i], accepted.statuses[i] = message_id, row["status"]
        if row["status"] == MessageStatus.SCHEDULED:
            scheduled.append((message_unit(message_id), row["due_at"]))
        else:
            fresh.append((message_id, row["priority"]))
    return fresh, scheduled, taken


def _replay_earlier(
    items: list[BatchItem], taken: list[int], api_key_id: int | None, accepted: BatchAccepted
) -> None:
    """The `taken` leaders, whose key an earlier message holds, read in one SELECT: the same
    body gets that message again (`replayed`), another is a conflict."""
    earlier = {
        key: (message_id, fingerprint, status)
        for key, message_id, fingerprint, status in Message.objects.filter(
            api_key_id=api_key_id, idempotency_key__in=[items[i].idempotency_key for i in taken]
        ).values_list("idempotency_key", "id", "request_fingerprint", "status")
    }
    for i in taken:
        message_id, fingerprint, status = earlier[items[i].idempotency_key]
        if fingerprint != items[i].fingerprint:
            accepted.conflicts.append(i)
        else:
            accepted.ids[i], accepted.statuses[i], accepted.replayed[i] = message_id, status, True


def _replay_followers(items: list[BatchItem], follows: dict[int, int], accepted: BatchAccepted) -> None:
    """Each follower gets its leader's message again (`replayed`), or is a conflict when its
    body differs from its leader's or its leader is one."""
    for i, first in follows.items():
        if items[i].fingerprint != items[first].fingerprint or first in accepted.conflicts:
            accepted.conflicts.append(i)
        else:
            accepted.ids[i], accepted.statuses[i], accepted.replayed[i] = (
                accepted.ids[first],
                accepted.statuses[first],
                True,
            )
