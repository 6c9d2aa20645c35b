"""The steps every provider webhook goes through, in this order (django-anymail's
`webhooks/base.py` shape, one module per provider beside `delivery/providers/`):

1. `verify(request)`: authenticity, from the RAW body and headers, before anything is
   interpreted. A failure raises `ForgedWebhook` (400) and nothing is written.
2. `parse(request)`: the authentic body as `ProviderEvent`s (one per recipient and event). An
   authentic body we cannot read raises `InvalidWebhook` (400).
3. `delivery.services.events.record_events(events)`: one set-based insert, deduplicated on the
   provider's event id, with the consequences (suppression, counters) of the rows really new.
4. `acknowledge(request, recorded)`: whatever the provider needs beyond recording (SNS
   subscription confirmation), and the JSON answer.

A subclass declares its `name` (the `{provider}` of `POST /api/v1/webhooks/{provider}`) and
`from_settings()`, and is named in `EMAILHUB_WEBHOOK_CLASSES`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from rest_framework import exceptions, status

from core.validators import validate_storable_json
from delivery.services.events import InvalidEvent, ProviderEvent, RecordedEvents, record_events


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


class WebhookTooLarge(exceptions.APIException):
    """A body beyond `EMAILHUB_WEBHOOK_MAX_BODY_BYTES`: 413, naming the setting."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the webhook body is larger than {max_bytes} bytes")
        self.limit = {"name": "EMAILHUB_WEBHOOK_MAX_BODY_BYTES", "value": max_bytes}


def _no_constants(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON for a webhook")


# Provider events nest a few levels (SES: Message → bounce → bouncedRecipients → entry); far
# below Python's recursion limit, which json.dumps of a stored payload must stay under.
MAX_JSON_DEPTH = 64


def _depth(value: Any) -> int:
    deepest, pending = 0, [(value, 1)]
    while pending:  # no recursion, like validate_storable_json
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                pending.extend(
                    (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
                )
    return deepest


def decode_json(text: str | bytes, what: str = "the body") -> Any:
    """`text` as JSON we can store: strict UTF-8, no NaN/Infinity (jsonb refuses them), no NUL or
    lone surrogate anywhere (they fail the batch's jsonb INSERT), and not nested so deep that
    the decoder recurses out of stack. Anything else is an InvalidWebhook (400), never a 500.
    For the body and for JSON a provider nests inside it as a string (SNS's Message)."""
    try:
        value = json.loads(
            text.decode("utf-8") if isinstance(text, bytes) else text, parse_constant=_no_constants
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidWebhook(f"{what} is not JSON: {exc}") from exc
    except RecursionError as exc:  # `[[[[…` a thousand deep: the C decoder's stack limit
        raise InvalidWebhook(f"{what} is JSON nested too deeply") from exc
    if _depth(value) > MAX_JSON_DEPTH:
        # Decodable, but json.dumps of the payload, deeper in the stack, would hit the limit.
        raise InvalidWebhook(f"{what} is JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        validate_storable_json(value)
    except ValidationError as exc:
        raise InvalidWebhook(f"{what} cannot be stored: {'; '.join(exc.messages)}") from exc
    return value


@dataclass
class WebhookRequest:
    """What a webhook may look at: the raw body and the headers (case-insensitive)."""

    body: bytes
    headers: Mapping[str, str]
    _json: Any = field(default=None, repr=False)
    _decoded: bool = field(default=False, repr=False)

    def json(self) -> Any:
        """The body as JSON, decoded once (strict UTF-8, no NaN/Infinity, which jsonb refuses).
        Verifiers whose signature lives inside the JSON (SNS) read it from here too; nothing
        acts on it before `verify` has passed."""
        if not self._decoded:
            self._json = decode_json(self.body)
            self._decoded = True
        return self._json


class Webhook:
    name: ClassVar[str] = ""

    @classmethod
    def from_settings(cls) -> Webhook:
        return cls()

    def verify(self, request: WebhookRequest) -> None:
        raise NotImplementedError

    def parse(self, request: WebhookRequest) -> Sequence[ProviderEvent]:
        raise NotImplementedError

    def acknowledge(self, request: WebhookRequest, recorded: RecordedEvents | None) -> dict[str, Any]:
        """The answer's JSON body. Override to act on non-event messages (and call super)."""
        return answer(recorded)

    def handle(self, request: WebhookRequest) -> dict[str, Any]:
        """The fixed order of steps; subclasses fill them in, never reorder them."""
        self.verify(request)
        events = self.parse(request)
        try:
            recorded = record_events(events) if events else None
        except InvalidEvent as exc:  # an authentic event we cannot store (an id too long…)
            raise InvalidWebhook(str(exc)) from exc
        return self.acknowledge(request, recorded)


def answer(recorded: RecordedEvents | None) -> dict[str, Any]:
    """What the webhook tells the provider (and a human replaying a request) it did."""
    if recorded is None:
        return {"received": 0, "new": 0, "duplicates": 0}
    return dataclasses.asdict(recorded)
