"""Reads for the API and the admin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis as redis_lib
from django.conf import settings
from django.db import connection
from django.db.models import QuerySet

from campaigns.selectors import campaign_status_sql, suppressed_sql
from delivery.breakers import snapshot
from delivery.models import ApiKey, EmailEvent, Message
from delivery.permissions import can_manage
from delivery.ratelimit import bucket_for
from delivery.services.sending import BULK, TRANSACTIONAL, provider_chain
from delivery.services.transitions import MARKETING_SQL


def provider_health() -> list[dict[str, Any]]:
    """Every configured provider: the pools using it, its breaker, its send-rate bucket."""
    pools: dict[str, list[str]] = {}
    for pool in (TRANSACTIONAL, BULK):
        for name in provider_chain(pool):
            pools.setdefault(name, []).append(pool)
    health = []
    for name, used_by in pools.items():
        bucket = bucket_for(name)
        rate: dict[str, Any] | None = None
        if bucket is not None:
            try:
                tokens: float | None = round(bucket.level(), 2)
            except redis_lib.RedisError:
                tokens = None
            rate = {
                "per_second": bucket.rate,
                "tokens": tokens,
                "reserved_for_transactional": bucket.reserved,
            }
        health.append(
            {
                "name": name,
                "pools": used_by,
                "position": {pool: provider_chain(pool).index(name) + 1 for pool in used_by},
                "circuit": snapshot(name),
                "rate_limit": rate,
            }
        )
    return health


def provider_chains() -> dict[str, list[str]]:
    return {
        TRANSACTIONAL: list(settings.EMAILHUB_PROVIDERS_TRANSACTIONAL),
        BULK: list(settings.EMAILHUB_PROVIDERS_BULK),
    }


def messages_visible_to(key: ApiKey) -> QuerySet[Message]:
    """The messages a key may read: its own, or every message if it may manage.

    Another key's message is simply absent (a 404, not a 403), so ids are not an oracle. A
    key's own list is served by message_api_key_idx.
    """
    messages = Message.objects.select_related("template")
    return messages if can_manage(key) else messages.filter(api_key=key)


def message_states(message_ids: Sequence[int]) -> dict[int, tuple[str, bool, str | None]]:
    """id → (status, address suppressed, campaign status or None), for the ids that exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT m.id, m.status, {suppressed_sql("m.to_email", marketing=MARKETING_SQL)}, {campaign_status_sql("m.campaign_id")}
              FROM delivery_message AS m
             WHERE m.id = ANY(%s)
            """,
            [list(message_ids)],
        )
        return {row[0]: (row[1], row[2], row[3]) for row in cursor.fetchall()}


def unsent_message_ids_to(email: str, statuses: Sequence[str]) -> list[int]:
    """Ids of the messages to `email` (any case, through the UPPER(to_email) index) in `statuses`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM delivery_message WHERE UPPER(to_email) = UPPER(%s) AND status = ANY(%s)",
            [email, list(statuses)],
        )
        return [row[0] for row in cursor.fetchall()]


def pending_message_units() -> list[tuple[str, float]]:
    """The schedule-index units PostgreSQL says are pending, with their scores (epoch seconds):
    `m:<id>` per retrying message and per scheduled transactional one, `c:<campaign>:<epoch>`
    per local-time slot that still has scheduled messages."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT 'm:' || id, extract(epoch FROM due_at) FROM delivery_message
             WHERE status IN ('scheduled', 'retry_wait') AND (campaign_id IS NULL OR status = 'retry_wait')
            UNION ALL
            SELECT 'c:' || campaign_id || ':' || extract(epoch FROM due_at)::bigint, extract(epoch FROM due_at)
              FROM delivery_message WHERE status = 'scheduled' AND campaign_id IS NOT NULL
             GROUP BY campaign_id, due_at
            """
        )
        return [(unit, float(score)) for unit, score in cursor.fetchall()]


def pending_and_sending_by_priority() -> dict[str, tuple[int, int]]:
    """Per priority, in messages: (pending, sending). Pending = `queued` plus due but not yet
    dispatched (`scheduled`/`retry_wait` with `due_at <= now`).

    No index serves `status = 'queued'` (it would cost every fan-out insert), so this is one
    sequential scan of delivery_message; see docs/scheduling.md for the measured cost."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT priority,
                   count(*) FILTER (WHERE status = 'queued'
                                       OR (status IN ('scheduled', 'retry_wait') AND due_at <= now())),
                   count(*) FILTER (WHERE status = 'sending')
              FROM delivery_message
             WHERE status IN ('queued', 'scheduled', 'retry_wait', 'sending')
             GROUP BY priority
            """
        )
        return {priority: (pending, sending) for priority, pending, sending in cursor.fetchall()}


def events_of(message: Message) -> QuerySet[EmailEvent]:
    """A message's events, newest first (served by the event table's message index)."""
    return EmailEvent.objects.filter(message=message)


def events_matching(filters: dict[str, Any]) -> QuerySet[EmailEvent]:
    """Every event matching the validated filters of GET /api/v1/events (all optional): kind,
    provider, bounce, message, campaign (its messages' events), recipient (lower-case), since
    (occurred_at >= since) and until (occurred_at < until)."""
    events = EmailEvent.objects.all()
    exact = {"kind": "kind", "provider": "provider", "bounce": "bounce", "recipient": "recipient"}
    for name, lookup in exact.items():
        if name in filters:
            events = events.filter(**{lookup: filters[name]})
    if "message" in filters:
        events = events.filter(message_id=filters["message"])
    if "campaign" in filters:
        events = events.filter(message__campaign_id=filters["campaign"])
    if "since" in filters:
        events = events.filter(occurred_at__gte=filters["since"])
    if "until" in filters:
        events = events.filter(occurred_at__lt=filters["until"])
    return events


def _rate(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "—"


def feedback_rates_by_provider(days: int = 30) -> dict[str, Any]:
    """Per provider, over messages sent in the last `days`: how many were sent, and how many of
    them hard-bounced or drew a complaint (distinct messages), with the rates as percentages.

    For the admin's provider page only: it reads every message sent in the window (no index on
    sent_at), ~1 s per million rows.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT m.provider, count(*),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM delivery_emailevent AS e WHERE e.message_id = m.id
                          AND e.kind IN ('bounced', 'dropped', 'rejected') AND e.bounce = 'permanent')),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM delivery_emailevent AS e WHERE e.message_id = m.id
                          AND e.kind = 'complained'))
              FROM delivery_message AS m
             WHERE m.status = 'sent' AND m.sent_at >= now() - make_interval(days => %s)
             GROUP BY m.provider ORDER BY m.provider
            """,
            [days],
        )
        rows = [
            {
                "provider": provider or "—",
                "sent": sent,
                "bounced": bounced,
                "bounce_rate": _rate(bounced, sent),
                "complained": complained,
                "complaint_rate": _rate(complained, sent),
            }
            for provider, sent, bounced, complained in cursor.fetchall()
        ]
    return {"days": days, "rows": rows}
