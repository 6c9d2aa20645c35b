"""Endpoints: registration, changes, secret rotation, disabling, and replays. Every write to
`outbound_endpoint` is here (deliveries' effects on their endpoint are services.delivering's)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from core import outbox
from delivery.models import ApiKey, ApiKeyScope
from outbound.exceptions import BeingDelivered, NotReplayable
from outbound.models import Delivery, Endpoint
from outbound.services import addresses, signing
from outbound.services.registration import DELIVER_KIND


def create(
    api_key: ApiKey,
    url: str,
    *,
    event_types: Sequence[str] = (),
    batch: bool = False,
    description: str = "",
    enabled: bool = True,
) -> tuple[Endpoint, str]:
    """Register an endpoint for `api_key`; returns it and its secret (shown this once). A key
    that may `manage` hears of every key's messages and of campaigns; any other of its own.
    Raises UnsafeUrl (nothing written) for a URL that may not be called."""
    addresses.check(url)
    secret = signing.new_secret()
    endpoint = Endpoint.objects.create(
        api_key=api_key,
        url=url,
        event_types=sorted(set(event_types)),
        batch=batch,
        description=description,
        enabled=enabled,
        all_messages=ApiKeyScope.MANAGE in api_key.scopes,
        secret=secret,
    )
    return endpoint, secret


def update(endpoint: Endpoint, **changes: object) -> Endpoint:
    """Change an endpoint's url, event types, batch, description or enabled flag. Enabling one
    clears why it was disabled and sends what waited meanwhile."""
    if "url" in changes and changes["url"] != endpoint.url:
        addresses.check(str(changes["url"]))
    if "event_types" in changes:
        changes["event_types"] = sorted(set(changes["event_types"]))  # type: ignore[call-overload]
    enabling = changes.get("enabled") is True and not endpoint.enabled
    if changes.get("enabled") is False and endpoint.enabled:
        changes.setdefault("disabled_reason", Endpoint.DISABLED_BY_APPLICATION)
        changes.setdefault("disabled_at", timezone.now())
    if enabling:
        changes.update(disabled_reason="", disabled_at=None, failing_since=None)
    for name, value in changes.items():
        setattr(endpoint, name, value)
    with transaction.atomic():
        # Only what changed: the row's other columns may have moved since it was read (a worker
        # set failing_since, a 410 disabled it), and a full save would write them back.
        endpoint.save(update_fields=[*changes, "updated_at"])
        if enabling:
            kick(endpoint.pk)
    return endpoint


def rotate_secret(endpoint: Endpoint, *, now: datetime | None = None) -> str:
    """A new secret, returned this once; the old one keeps signing (a second signature) for
    EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS so the application can switch without losing events."""
    now = now or timezone.now()
    secret = signing.new_secret()
    Endpoint.objects.filter(pk=endpoint.pk).update(
        previous_secret=endpoint.secret,
        previous_secret_until=now + timedelta(seconds=settings.EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS),
        secret=secret,
        updated_at=now,
    )
    endpoint.refresh_from_db()
    return secret


def secrets_in_use(endpoint: Endpoint, now: datetime) -> list[str]:
    """The secrets a request to `endpoint` is signed with at `now`: its own, and the one before
    the last rotation during its grace period."""
    found = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_until and endpoint.previous_secret_until > now:
        found.append(endpoint.previous_secret)
    return found


def disable(endpoint_id: int, reason: str, *, now: datetime | None = None) -> bool:
    """Disable an enabled endpoint (conditional: once), saying why; True if this disabled it."""
    return bool(
        Endpoint.objects.filter(pk=endpoint_id, enabled=True).update(
            enabled=False, disabled_reason=reason[:300], disabled_at=now or timezone.now()
        )
    )


def kick(*endpoint_ids: int) -> None:
    """Publish a delivery task for each endpoint once the caller's transaction commits."""
    outbox.record_many([(DELIVER_KIND, {"endpoint": endpoint_id}) for endpoint_id in endpoint_ids])


# Replays: the delivery again as it was (same webhook-id), from its first attempt's schedule.
_REPLAY_SQL = """
UPDATE outbound_delivery
   SET status = 'pending', attempts = 0, due_at = %s, claimed_at = NULL, finished_at = NULL
 WHERE endpoint_id = %s AND status IN ('succeeded', 'failed') AND {condition}
RETURNING id
"""


def replay_event(endpoint: Endpoint, event_id: int, *, now: datetime | None = None) -> int:
    """Send one event to the endpoint again: the finished delivery (or deliveries) that carried
    it, as it was. Raises NotReplayable if the endpoint was never given that event, and
    BeingDelivered if its delivery is under way. Returns the deliveries replayed."""
    return _replay_one(
        endpoint,
        Delivery.objects.filter(endpoint=endpoint, event_ids__contains=[event_id]),
        ("event_ids @> ARRAY[%s]::bigint[]", [event_id]),
        f"event {event_id}",
        now,
    )


def replay_webhook(endpoint: Endpoint, webhook_id: str, *, now: datetime | None = None) -> int:
    """Send again the delivery the application saw as `webhook_id` (one event's `evt_<id>` or a
    batch's), as it was. Raises as replay_event does."""
    return _replay_one(
        endpoint,
        Delivery.objects.filter(endpoint=endpoint, webhook_id=webhook_id),
        ("webhook_id = %s", [webhook_id]),
        f"webhook-id {webhook_id}",
        now,
    )


def _replay_one(
    endpoint: Endpoint,
    carrying: QuerySet[Delivery],
    condition: tuple[str, list[Any]],
    named: str,
    now: datetime | None,
) -> int:
    if not carrying.exists():
        raise NotReplayable(f"{named} was never delivered to this endpoint")
    replayed = _replay(endpoint, *condition, now)
    if not replayed:
        raise BeingDelivered(f"{named} is being delivered to this endpoint right now")
    return replayed


def replay_failed(endpoint: Endpoint, since: datetime, *, now: datetime | None = None) -> int:
    """Send again every delivery to the endpoint that failed (gave up) and was created since
    `since`; returns how many."""
    return _replay(endpoint, "status = 'failed' AND created_at >= %s", [since], now)


def _replay(endpoint: Endpoint, condition: str, params: list[Any], now: datetime | None) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_REPLAY_SQL.format(condition=condition), [now or timezone.now(), endpoint.pk, *params])
        replayed = cursor.rowcount
        if replayed:
            kick(endpoint.pk)
    return replayed
