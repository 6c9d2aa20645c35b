"""The steps every provider webhook goes through, in this order (django-anymail's
`webhooks/base.py` shape, one module per provider beside `delivery/providers/`):

1. `verify(request)`: authenticity, from the RAW body and headers, before anything is
   interpreted. A failure raises `ForgedWebhook` (400) and nothing is written.
2. `parse(request)`: the authentic body as an `EventBatch` of `ProviderEvent`s (one per
   recipient and event). A body we cannot read as a whole (not JSON, not the provider's
   container) raises `InvalidWebhook` (400); inside it, an event we cannot use (not an object, a
   field missing, no address, an address too long, data PostgreSQL cannot store) is skipped,
   logged with its place and why and counted, and never costs the other events: the provider
   cannot fix a signed body by retrying it, and a 400 would lose the whole batch.
3. `delivery.services.events.record_events(batch.events)`: one set-based insert, deduplicated
   on the provider's event id, with the consequences (suppression, counters) of the rows really
   new.
4. `acknowledge(request, recorded, batch)`: whatever the provider needs beyond recording (SNS
   subscription confirmation), and the JSON answer.

A subclass declares its `name` (the `{provider}` of `POST /api/v1/webhooks/{provider}`) and
`from_settings()`, and is named in `EMAILHUB_WEBHOOK_CLASSES`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core import metrics
from delivery.exceptions import InvalidEvent, InvalidWebhook
from delivery.services.events import (
    RECIPIENT_TOO_LONG,
    UNSTORABLE,
    ProviderEvent,
    RecordedEvents,
    record_events,
    unusable,
)

logger = logging.getLogger(__name__)


def decode_json(text: str | bytes, what: str = "the body") -> Any:
    """`text` as JSON: strict UTF-8, and not nested so deep that the decoder recurses out of
    stack; anything else is an InvalidWebhook (400), never a 500. For the body and for JSON a
    provider nests inside it as a string (SNS's Message). What PostgreSQL cannot store inside it
    (NaN, U+0000, deep nesting: `delivery.services.events.unusable`) is found event by event
    when the batch is built, so that it costs only its own event."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidWebhook(f"{what} is not JSON: {exc}") from exc
    except RecursionError as exc:  # `[[[[…` a thousand deep: the C decoder's stack limit
        raise InvalidWebhook(f"{what} is JSON nested too deeply") from exc


# Why an event of an authentic request was left out: the values of the `reason` label of
# emailhub_webhook_events_skipped_total, a bounded set. The last two are `unusable`'s.
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
BAD_RECIPIENT = "bad_recipient"
SKIP_REASONS = frozenset({NOT_AN_OBJECT, MISSING_FIELD, BAD_RECIPIENT, RECIPIENT_TOO_LONG, UNSTORABLE})


@dataclass
class EventBatch:
    """What `parse` made of one authentic request: the events to record, and how many were left
    out, by reason (SKIP_REASONS). Each one left out is logged as a warning naming where it was
    (its position, never its address) and why."""

    provider: str
    events: list[ProviderEvent] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    def add(self, event: ProviderEvent, where: str) -> None:
        """Keep `event`, or skip it when `unusable` says it cannot be stored as it is."""
        problem = unusable(event)
        if problem is None:
            self.events.append(event)
        else:
            self.skip(problem[0], where, problem[1])

    def skip(self, reason: str, where: str, why: str) -> None:
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}; add it to SKIP_REASONS")
        self.skipped[reason] += 1
        logger.warning("webhook %s: skipped %s (%s): %s", self.provider, where, reason, why)


@dataclass
class WebhookRequest:
    """What a webhook may look at: the raw body and the headers (case-insensitive)."""

    body: bytes
    headers: Mapping[str, str]
    _json: Any = field(default=None, repr=False)
    _decoded: bool = field(default=False, repr=False)

    def json(self) -> Any:
        """The body as JSON, decoded once (`decode_json`). Verifiers whose signature lives
        inside the JSON (SNS) read it from here too; nothing acts on it before `verify` has
        passed."""
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

    def parse(self, request: WebhookRequest) -> EventBatch:
        raise NotImplementedError

    def acknowledge(
        self, request: WebhookRequest, recorded: RecordedEvents | None, batch: EventBatch
    ) -> dict[str, Any]:
        """The answer's JSON body. Override to act on non-event messages (and call super)."""
        return answer(recorded, batch)

    def handle(self, request: WebhookRequest) -> dict[str, Any]:
        """The fixed order of steps; subclasses fill them in, never reorder them."""
        self.verify(request)
        batch = self.parse(request)
        try:
            recorded = record_events(batch.events) if batch.events else None
        except InvalidEvent as exc:  # a source built an event wrongly: nothing is written
            raise InvalidWebhook(str(exc)) from exc
        metrics.count_webhook_skips(self.name, batch.skipped)
        return self.acknowledge(request, recorded, batch)


def answer(recorded: RecordedEvents | None, batch: EventBatch) -> dict[str, Any]:
    """What the webhook tells the provider (and a human replaying a request) it did."""
    counts = (
        dataclasses.asdict(recorded)
        if recorded is not None
        else {"received": 0, "new": 0, "duplicates": 0, "suppressed": 0, "unmatched": 0}
    )
    return {**counts, "skipped": sum(batch.skipped.values())}
