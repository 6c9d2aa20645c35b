"""Delivery errors. Transient ones are retried (another provider, or later); permanent ones stop."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status

from core.api_json import RequestTooLarge


class DeliveryError(Exception):
    """Base of every delivery error."""


class ProviderError(DeliveryError):
    """A provider-wide refusal, carrying what the provider said (django-anymail's habit): the
    provider's name, its status (HTTP status or SMTP reply code), its response body, and how long
    it asked us to wait (`Retry-After`), when it said so. The message is what gets logged and
    stored as a message's `last_error`; the fields are for code that decides what to do."""

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        body: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.body = body
        self.retry_after = retry_after


class ProviderUnavailable(ProviderError):
    """The provider as a whole could not take mail (refused connection, timeout, HTTP 5xx, 401).

    Counts as a failure for the provider's circuit breaker and moves the batch to the next
    provider in the chain.
    """


class ProviderThrottled(ProviderError):
    """The provider is rate limiting us (HTTP 429, SES throttling, SMTP 421/451 "try later").

    It is up, so this is not a circuit-breaker failure: the provider is paused for
    `retry_after` seconds (shared by every worker through Redis) and the batch fails over or
    waits. `partial` maps our message id → SendResult for what the provider dealt with before
    it started refusing (accepted mail must never be sent again elsewhere); the provider base
    class fills it in.
    """

    partial: dict[int, Any]

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.partial = {}


class ProviderConfigurationError(DeliveryError):
    """A provider setting is missing or wrong. Never retried: the message names the setting."""


class UnsupportedFeature(DeliveryError):
    """The message asks for something this provider cannot do (django-anymail's
    AnymailUnsupportedFeature): the message is refused by this provider, never sent with the
    feature quietly dropped."""

    def __init__(self, message: str, *, provider: str = "", feature: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.feature = feature


class IdempotencyConflict(DeliveryError):
    """An Idempotency-Key was reused with a different request body."""


class BatchConflict(IdempotencyConflict):
    """Items of an all-or-nothing batch reuse an idempotency key with another body; `indexes`
    names them. Nothing of the batch was stored."""

    def __init__(self, indexes: list[int]) -> None:
        super().__init__(f"item(s) {', '.join(map(str, indexes))} reuse an idempotency_key with another body")
        self.indexes = indexes


class MessageNotChangeable(DeliveryError):
    """An application asked to cancel or reschedule a message that is past it: handed to a
    provider (`sending`), finished, or a campaign's (its campaign schedules it). The API's 409."""

    def __init__(self, message_id: int, status: str, why: str) -> None:
        super().__init__(f"message {message_id} is {status}: {why}")
        self.status = status


class InvalidTestSend(DeliveryError):
    """An operator's test send that cannot go out as asked; `errors` maps each field to why."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


class NotAMailbox(ValueError):
    """The path is neither an mbox file nor a Maildir directory."""


class InvalidEvent(ValueError):
    """An event a source built wrongly (unknown kind, naive time, id too long) or one `unusable`
    refuses: a bug in the source, never stored. Webhooks leave unusable events out beforehand."""


class CircuitOpen(Exception):
    """The provider's breaker is open (or another process is probing it): skip it.

    `retry_after`: seconds until this provider could be tried again (the probe is due, or the
    other process's probe has had time to finish).
    """

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


BATCH_LIMIT_SETTING = "EMAILHUB_API_BATCH_MAX_MESSAGES"


class BatchTooLarge(RequestTooLarge):
    def __init__(self, count: int, limit: int) -> None:
        message = f"a batch holds at most {limit} messages ({BATCH_LIMIT_SETTING}); this one has {count}"
        super().__init__(limit, BATCH_LIMIT_SETTING, message=message)


class BatchConflictError(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_conflict"


class ForgedWebhook(exceptions.APIException):
    """The request is not provably from the provider: bad or missing signature, untrusted
    certificate, unknown topic, stale timestamp. 400, nothing written."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid_signature"


class InvalidWebhook(exceptions.APIException):
    """An authentic request whose body we cannot read as the provider's events. 400."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"


class WebhookUnavailable(exceptions.APIException):
    """We could not finish checking an authentic-looking request for a reason of ours or the
    network's (a signing certificate we could not fetch). 503, so the provider retries."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "webhook_unavailable"


class WebhookTooLarge(RequestTooLarge):
    """A body beyond `EMAILHUB_WEBHOOK_MAX_BODY_BYTES`: 413, naming the setting."""

    def __init__(self, max_bytes: int) -> None:
        message = f"the webhook body is larger than {max_bytes} bytes"
        super().__init__(max_bytes, "EMAILHUB_WEBHOOK_MAX_BODY_BYTES", message=message)


class InvalidToken(ValueError):
    """Not a token we issued (malformed, forged, tampered with, or under a secret no longer kept)."""


class ProviderSkipped(Exception):
    """The provider did not try the batch (open circuit, paused after a 429, no send quota left):
    use the next one. `retry_after` is how long until it could be tried again; a message that
    every provider skipped waits that long and keeps its attempt (nothing was tried)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
