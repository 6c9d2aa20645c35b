"""The webhook registry, the mirror of `delivery.providers`: plug-ins named by
`EMAILHUB_WEBHOOK_CLASSES`, one instance per name per process (an instance may cache, e.g. the
SNS signing certificates).

Adding a provider's webhook is one module with a `Webhook` subclass (its `name`, its
`from_settings()`) plus its dotted path in `EMAILHUB_WEBHOOK_CLASSES`; it is then served at
`POST /api/v1/webhooks/{name}`.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from delivery.exceptions import ProviderConfigurationError
from delivery.webhooks.base import (
    ForgedWebhook,
    InvalidWebhook,
    Webhook,
    WebhookRequest,
    WebhookTooLarge,
    WebhookUnavailable,
)

__all__ = [
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
    classes: dict[str, type[Webhook]] = {}
    for path in settings.EMAILHUB_WEBHOOK_CLASSES:
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ProviderConfigurationError(
                f"EMAILHUB_WEBHOOK_CLASSES: cannot import {path!r}: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, Webhook)) or not cls.name:
            raise ProviderConfigurationError(
                f"EMAILHUB_WEBHOOK_CLASSES: {path!r} is not a Webhook subclass with a name"
            )
        if cls.name in classes:
            raise ProviderConfigurationError(
                f"EMAILHUB_WEBHOOK_CLASSES: {path!r} and {classes[cls.name].__module__} both declare "
                f"the webhook name {cls.name!r}"
            )
        classes[cls.name] = cls
    return classes


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
