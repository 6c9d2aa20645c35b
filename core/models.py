"""The outbox's table: a task to publish, written with the change it announces."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class OutboxTask(models.Model):
    """A task to publish, written in the same transaction as the change it announces.

    The row is deleted once the task is on the broker; a row that is still here a couple of
    seconds after its commit is published by the relay (core.outbox.relay). `kind` names an
    entry of core.outbox's registry, which an app fills in from its AppConfig.ready.
    """

    kind = models.CharField(max_length=20)
    payload = models.JSONField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.payload}"


class OutboundEvent(models.Model):
    """Something an application may want to hear of (a message sent, bounced, opened…), written by
    the statement that made it happen, to be delivered to the application's webhook endpoints.

    Rows are written set-based inside the statements that move messages (core.outbound_events),
    only when some enabled endpoint wants them (the database function `emailhub_event_interest`,
    which the outbound app defines). `payload` is the Standard Webhooks body, `{type, timestamp,
    data}`, exactly as it will be sent. The table is an outbox of its own: a row not yet
    `dispatched` to the endpoints' deliveries is found by the outbound app's sweep if the
    doorbell rung after its commit was lost.
    """

    type = models.CharField(max_length=40)
    # The API key whose message it is; None for campaign mail and anything else no key sent.
    owner_key_id = models.BigIntegerField(null=True, blank=True)
    # The message it tells of (None: a campaign's own event): what an erasure scrubs.
    message_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField()
    dispatched = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The dispatcher's claim, oldest first: only the rows still waiting are indexed.
            models.Index(
                fields=["id"], name="outbound_event_waiting_idx", condition=models.Q(dispatched=False)
            ),
            # An erasure finds the events of the erased address's messages.
            models.Index(
                fields=["message_id"],
                name="outbound_event_message_idx",
                condition=models.Q(message_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"
