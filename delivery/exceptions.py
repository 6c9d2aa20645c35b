"""Delivery errors. Transient ones are retried (another provider, or later); permanent ones stop."""

from __future__ import annotations


class DeliveryError(Exception):
    """Base of every delivery error."""


class ProviderUnavailable(DeliveryError):
    """The provider as a whole could not take mail (refused connection, timeout, HTTP 5xx/429).

    Counts as a failure for the provider's circuit breaker and moves the batch to the next
    provider in the chain.
    """


class ProviderConfigurationError(DeliveryError):
    """A provider setting is missing or wrong. Never retried: the message names the setting."""


class UnsupportedFeature(DeliveryError):
    """The message asks for something this provider cannot do; it is refused, never dropped."""


class IdempotencyConflict(DeliveryError):
    """An Idempotency-Key was reused with a different request body."""
