"""The webhook registry, the mirror of `delivery.providers`: plug-ins named by
`EMAILHUB_WEBHOOK_CLASSES`, one instance per name per process (an instance may cache, e.g. the
SNS signing certificates).

Adding a provider's webhook is one module with a `Webhook` subclass (its `name`, its
`from_settings()`, `verify` and a `parse` that fills an `EventBatch`) plus its dotted path in
`EMAILHUB_WEBHOOK_CLASSES`; it is then served at `POST /api/v1/webhooks/{name}`.
"""

from __future__ import annotations

from delivery.exceptions import ForgedWebhook, InvalidWebhook, WebhookTooLarge, WebhookUnavailable
from delivery.plugins import named_classes
from delivery.webhooks.base import EventBatch, Webhook, WebhookRequest

__all__ = [
    "EventBatch",
    "ForgedWebhook",
    "InvalidWebhook",
    "Webhook",
    "WebhookRequest",
    "WebhookTooLarge",
    "WebhookUnavailable",
    "forget_webhooks",
    "get_webhook",
    "webhook_classes",
]

_instances: dict[str, Webhook] = {}


def webhook_classes() -> dict[str, type[Webhook]]:
    """name → class of every webhook in `EMAILHUB_WEBHOOK_CLASSES`, read on each call so a
    settings override takes effect."""
    return named_classes("EMAILHUB_WEBHOOK_CLASSES", Webhook, "webhook")


def get_webhook(name: str) -> Webhook | None:
    """The webhook serving `name`, or None when no registered webhook has that name."""
    webhook = _instances.get(name)
    if webhook is None:
        cls = webhook_classes().get(name)
        if cls is None:
            return None
        webhook = _instances[name] = cls.from_settings()
    return webhook


def forget_webhooks() -> None:
    """Drop this process's instances (and their caches); the next request builds afresh from
    the settings. For tests that change webhook settings."""
    _instances.clear()
