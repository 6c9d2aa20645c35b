"""Reads of the outbound app's tables for the API, the admin, the dashboard and the metrics."""

from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from core import outbound_events
from delivery.models import ApiKey, ApiKeyScope
from outbound.models import Endpoint


def endpoints_for(key: ApiKey) -> QuerySet[Endpoint]:
    """The endpoints a key may see and change: its own, or every one for a `manage` key."""
    found = Endpoint.objects.all()
    return found if ApiKeyScope.MANAGE in key.scopes else found.filter(api_key=key)


# Disabled on purpose, not by trouble.
BY_HAND = ("", Endpoint.DISABLED_BY_APPLICATION, Endpoint.DISABLED_BY_OPERATOR)


def troubled_endpoints(limit: int = 20) -> list[Endpoint]:
    """Endpoints disabled by what happened to them (410, failing for days), newest first, then
    enabled ones failing now, longest first: the operator's dashboard shows them."""
    disabled = (
        Endpoint.objects.filter(enabled=False)
        .exclude(disabled_reason__in=BY_HAND)
        .order_by("-disabled_at")[:limit]
    )
    failing = Endpoint.objects.filter(enabled=True, failing_since__isnull=False).order_by("failing_since")[
        :limit
    ]
    return [*disabled, *failing][:limit]


def backlog_ages() -> list[tuple[tuple[str], float]]:
    """Per enabled endpoint, the age in seconds of its oldest delivery waiting (pending or
    retrying; 0 when none): the `emailhub_webhook_backlog_age_seconds` gauge."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.id, (SELECT min(d.created_at) FROM outbound_delivery AS d
                           WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'delivering', 'retry_wait'))
              FROM outbound_endpoint AS e WHERE e.enabled
            """
        )
        now = timezone.now()
        return [
            ((str(i),), (now - oldest).total_seconds() if oldest else 0.0) for i, oldest in cursor.fetchall()
        ]


def undispatched_age() -> list[tuple[tuple[()], float]]:
    """Seconds since the oldest event not yet turned into deliveries was written (0: none): the
    `emailhub_webhook_events_waiting_seconds` gauge; more than a few means no dispatcher runs."""
    oldest = outbound_events.oldest_waiting()
    return [((), (timezone.now() - oldest).total_seconds() if oldest else 0.0)]
