"""An application's webhook endpoints, the deliveries of events to them, and each attempt.

Written only by this app's services: endpoints by `services.endpoints`, deliveries and attempts
by `services.dispatching` (created) and `services.delivering` (the state machine below).

    pending → delivering → succeeded | retry_wait → pending … | failed

A delivery is one request: one event, or up to 100 for an endpoint that asked for batches. Its
`webhook_id` is fixed when it is created, so every retry and a replay send the same id and the
application can de-duplicate.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now

from delivery.models import ApiKey


class Endpoint(models.Model):
    """Where an application wants to hear of its mail: a URL, the event types it wants (none
    listed: all), and the secret its requests are signed with."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    # Up to 100 events per request, as a JSON array (one signature), for high volumes.
    batch = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    # Every API key's messages and every campaign's (the key could `manage` when it registered);
    # else only the key's own messages.
    all_messages = models.BooleanField(default=False)
    secret = models.CharField(max_length=100)
    # The secret before the last rotation, still signing (beside the new one) until then.
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    # Why it was disabled (410 Gone, failing for days, by hand), and when.
    disabled_reason = models.CharField(max_length=300, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    # The first failed attempt since its last success; None while it succeeds.
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    # Reasons of a disabling by hand; any other is trouble (410, failing for days) and shows on
    # the operator's dashboard.
    DISABLED_BY_APPLICATION = "disabled by the application"
    DISABLED_BY_OPERATOR = "disabled by an operator"

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.url} (#{self.pk})"


class Delivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # to be sent when due
        DELIVERING = "delivering"  # claimed by a delivery task (claimed_at is its token)
        RETRY_WAIT = "retry_wait"  # failed; indexed in the schedule index for its next attempt
        SUCCEEDED = "succeeded"
        FAILED = "failed"  # every attempt used, or the endpoint answered 410

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_ids = ArrayField(models.BigIntegerField())
    webhook_id = models.CharField(max_length=64)
    # Sent as a JSON array (the endpoint asked for batches when it was made): fixed with the
    # delivery, so a retry or a replay sends the same body whatever the endpoint says now.
    batch = models.BooleanField(default=False, db_default=False)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    due_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "deliveries"
        indexes = [
            # A delivery task's claim: an endpoint's due pending deliveries, oldest first.
            models.Index(
                fields=["endpoint", "due_at", "id"],
                name="outbound_delivery_pending_idx",
                condition=models.Q(status="pending"),
            ),
            # The sweep and the reconciler: what waits or is in flight, whatever the endpoint.
            models.Index(
                fields=["status", "due_at"],
                name="outbound_delivery_live_idx",
                condition=models.Q(status__in=["pending", "delivering", "retry_wait"]),
            ),
            # Replay: an endpoint's failed deliveries since a time.
            models.Index(
                fields=["endpoint", "created_at"],
                name="outbound_delivery_failed_idx",
                condition=models.Q(status="failed"),
            ),
            # Replay of one event: the deliveries that carry it.
            GinIndex(fields=["event_ids"], name="outbound_delivery_events_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.webhook_id} → endpoint {self.endpoint_id} ({self.status})"


class Attempt(models.Model):
    """One request to an endpoint and what came of it: the delivery log."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    attempted_at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    succeeded = models.BooleanField()
    latency_ms = models.FloatField()
    response = models.TextField(blank=True, default="")  # the body's first 1 KiB
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["endpoint", "-id"], name="outbound_attempt_endpoint_idx")]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}: {self.status_code or self.error}"
