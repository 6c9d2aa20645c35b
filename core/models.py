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
