"""SendGrid's signed Event Webhook (`POST /api/v1/webhooks/sendgrid`).

SendGrid posts a JSON array of events, batched, and signs each request with ECDSA P-256 over
the `X-Twilio-Email-Event-Webhook-Timestamp` header followed by the raw body (SHA-256), the
base64 DER signature in `X-Twilio-Email-Event-Webhook-Signature`
(https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features).
The public key, shown base64 DER (SubjectPublicKeyInfo) in SendGrid's Mail Settings, is
`EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY`. A timestamp further than
`EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS` from our clock is refused, so a captured request
cannot be replayed later; within the window a replay is recorded once (dedup on `sg_event_id`).

Events map to our messages through the `emailhub_id` custom arg that
`delivery/providers/sendgrid.py` sets on every personalization: SendGrid copies custom args
into every event of that recipient, including asynchronous bounces that carry no
`sg_message_id`. `X-Message-Id` is shared by every personalization of one request, so it can
name no single message and is not used to match.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core.validators import json_storage_problem
from delivery.exceptions import ForgedWebhook, InvalidWebhook, WebhookUnavailable
from delivery.models import EmailEvent
from delivery.services.events import (
    MAX_JSON_DEPTH,
    UNSTORABLE,
    ProviderEvent,
    RecordedEvents,
    hashed_event_id,
    storable_event_id,
)
from delivery.webhooks.base import (
    BAD_RECIPIENT,
    MISSING_FIELD,
    NOT_AN_OBJECT,
    EventBatch,
    Webhook,
    WebhookRequest,
    answer,
)

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"

Kind = EmailEvent.Kind
Bounce = EmailEvent.Bounce

# SendGrid event → our kind. `processed` (SendGrid accepted the message for delivery) is not
# recorded: our own `sent` with the 202 already says it, and one row per recipient per campaign
# would double the event table for nothing. `group_resubscribe` and account events are not
# delivery events of a message. What is not listed here is skipped and counted as ignored.
KINDS: dict[str, str] = {
    "delivered": Kind.DELIVERED,
    "deferred": Kind.DEFERRED,
    "bounce": Kind.BOUNCED,
    "dropped": Kind.DROPPED,
    "spamreport": Kind.COMPLAINED,
    "unsubscribe": Kind.UNSUBSCRIBED,
    "group_unsubscribe": Kind.UNSUBSCRIBED,
    "open": Kind.OPENED,
    "click": Kind.CLICKED,
}
IGNORED = frozenset({"processed", "group_resubscribe"})

# Drop reasons that say the address itself is dead: SendGrid already holds it on its bounce or
# invalid list, so it refuses to try. These are permanent (and suppress); the other reasons
# (unsubscribed or spam-reporting address, spam content, over quota, invalid SMTPAPI header)
# concern SendGrid's lists or our message, not whether the address exists.
PERMANENT_DROP_REASONS = frozenset({"bounced address", "invalid"})
# SendGrid says a `blocked` bounce is the receiving server refusing the message for now
# (reputation, content, rate): transient, never a suppression, unless SendGrid itself classifies
# the address as invalid.
PERMANENT_BLOCK_CLASSIFICATIONS = frozenset({"invalid address"})


@functools.lru_cache(maxsize=4)
def load_public_key(value: str) -> ec.EllipticCurvePublicKey:
    """The verification key from its setting: base64 DER SubjectPublicKeyInfo as SendGrid shows
    it (a PEM block is accepted too). Anything but a P-256 key is a configuration error."""
    text = value.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode("ascii"))
        else:
            key = serialization.load_der_public_key(base64.b64decode("".join(text.split()), validate=True))
    except (ValueError, binascii.Error, UnsupportedAlgorithm) as exc:
        raise ImproperlyConfigured(
            "EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY is not a base64 DER public key "
            f"(copy the verification key from SendGrid's Mail Settings → Signed Event Webhook): {exc}"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ImproperlyConfigured("EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY must be an ECDSA P-256 key")
    return key


def verify_signature(
    *,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    public_key: ec.EllipticCurvePublicKey,
    tolerance: float,
    now: float,
) -> None:
    """Raise ForgedWebhook unless `signature` is the key's ECDSA signature of timestamp + body
    and the timestamp is within `tolerance` seconds of `now` (either side: a clock ahead of
    ours is as suspect as one behind). Exactly `tolerance` away still passes."""
    if not signature or not timestamp:
        raise ForgedWebhook(f"the {SIGNATURE_HEADER} and {TIMESTAMP_HEADER} headers are required")
    stamp = timestamp.strip()
    # isascii: the header is attacker-controlled and "²".isdigit() is true, int("²") raises.
    if not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 12:
        raise ForgedWebhook(f"{TIMESTAMP_HEADER} is not a Unix time in seconds")
    if abs(now - int(stamp)) > tolerance:
        raise ForgedWebhook(
            f"{TIMESTAMP_HEADER} is {int(now - int(stamp))} s from our clock; "
            f"more than EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS ({tolerance:g} s)"
        )
    try:
        der = base64.b64decode(signature.strip(), validate=True)
        # The header's exact bytes are what SendGrid signed, not the parsed integer.
        public_key.verify(der, timestamp.encode("ascii") + body, ec.ECDSA(hashes.SHA256()))
    except (binascii.Error, ValueError, UnicodeEncodeError, InvalidSignature) as exc:
        raise ForgedWebhook("the SendGrid signature does not match this body and timestamp") from exc


def parse_events(data: Any, *, received_at: datetime) -> EventBatch:
    """SendGrid's batch as ProviderEvents, one per event. A body that is not an array is an
    InvalidWebhook. Inside it each event stands alone: an event type we do not record
    (processed, account events, a type SendGrid adds later) is ignored on purpose, and an event
    we cannot use (not an object, no type, no address, data PostgreSQL cannot store) is skipped,
    so one odd event never makes SendGrid retry, and after 24 hours drop, the whole batch."""
    if not isinstance(data, list):
        raise InvalidWebhook("a SendGrid Event Webhook body is a JSON array of event objects")
    batch = EventBatch("sendgrid")
    for number, item in enumerate(data, 1):
        where = f"event {number} of {len(data)}"
        if not isinstance(item, dict):
            batch.skip(NOT_AN_OBJECT, where, f"a {type(item).__name__}, not an event object")
            continue
        parse_event(item, received_at=received_at, batch=batch, where=where)
    return batch


def parse_event(item: dict[str, Any], *, received_at: datetime, batch: EventBatch, where: str) -> None:
    """Add one SendGrid event to `batch` as a ProviderEvent, unless we do not record it."""
    name = item.get("event")
    if not isinstance(name, str):
        batch.skip(MISSING_FIELD, where, "no event type")
        return
    kind = KINDS.get(name)
    if kind is None:
        return  # IGNORED, or a type SendGrid added later: not a delivery event of ours
    recipient = item.get("email")
    if not isinstance(recipient, str) or "@" not in recipient:
        batch.skip(BAD_RECIPIENT, where, "no email address")
        return
    event_id = _event_id(item)
    if event_id is None:
        batch.skip(UNSTORABLE, where, "no sg_event_id, and its JSON cannot be read for one")
        return
    bounce, detail = _bounce_and_detail(name, item)
    engagement = kind in (EmailEvent.Kind.OPENED, EmailEvent.Kind.CLICKED)
    event = ProviderEvent(
        provider="sendgrid",
        event_id=event_id,
        kind=kind,
        occurred_at=_occurred_at(item.get("timestamp"), received_at),
        message_id=_our_id(item.get("emailhub_id")),
        recipient=recipient.strip().lower(),
        bounce=bounce,
        detail=detail,
        payload=item,
        # Opens and clicks are classified by record_events like our own hits; SendGrid marks
        # Apple Mail Privacy Protection's prefetches itself.
        user_agent=str(item.get("useragent") or "") if engagement else "",
        ip=str(item.get("ip") or "") if engagement else "",
        machine_open=kind == EmailEvent.Kind.OPENED and item.get("sg_machine_open") is True,
    )
    batch.add(event, where)  # an address too long, or data PostgreSQL cannot store: skipped


class SendGridWebhook(Webhook):
    name = "sendgrid"

    def __init__(
        self, *, public_key: str, tolerance: float = 300.0, clock: Callable[[], float] = time.time
    ) -> None:
        # An empty or unusable key leaves the webhook closed (every request refused with the
        # reason), never open, and never a 500.
        self.public_key: ec.EllipticCurvePublicKey | None = None
        self.unavailable = (
            "EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY is not set; unsigned SendGrid events are not accepted"
        )
        if public_key:
            try:
                self.public_key = load_public_key(public_key)
            except ImproperlyConfigured as exc:
                logger.error("the SendGrid webhook refuses every request: %s", exc)
                self.unavailable = str(exc)
        self.tolerance = tolerance
        self.clock = clock

    @classmethod
    def from_settings(cls) -> SendGridWebhook:
        return cls(
            public_key=settings.EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY,
            tolerance=settings.EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS,
        )

    def verify(self, request: WebhookRequest) -> None:
        if self.public_key is None:
            # Our configuration, not the sender's fault: 503, so SendGrid keeps the batch and
            # retries it (for up to 24 hours) once the key is set.
            raise WebhookUnavailable(self.unavailable)
        verify_signature(
            body=request.body,
            signature=request.headers.get(SIGNATURE_HEADER),
            timestamp=request.headers.get(TIMESTAMP_HEADER),
            public_key=self.public_key,
            tolerance=self.tolerance,
            now=self.clock(),
        )

    def parse(self, request: WebhookRequest) -> EventBatch:
        return parse_events(request.json(), received_at=datetime.fromtimestamp(self.clock(), UTC))

    def acknowledge(
        self, request: WebhookRequest, recorded: RecordedEvents | None, batch: EventBatch
    ) -> dict[str, Any]:
        # What is neither recorded nor skipped was left out on purpose (IGNORED, unknown types).
        result = answer(recorded, batch)
        return {**result, "ignored": len(request.json()) - result["received"] - result["skipped"]}


def _bounce_and_detail(name: str, item: dict[str, Any]) -> tuple[str, str]:
    if name == "bounce":
        kind = str(item.get("type") or "bounce").lower()
        classification = str(item.get("bounce_classification") or "")
        permanent = kind != "blocked" or classification.lower() in PERMANENT_BLOCK_CLASSIFICATIONS
        parts = [kind, str(item.get("status") or ""), str(item.get("reason") or ""), classification]
        return (Bounce.PERMANENT if permanent else Bounce.TRANSIENT), _join(parts)
    if name == "dropped":
        reason = str(item.get("reason") or item.get("type") or "")
        return (Bounce.PERMANENT if reason.strip().lower() in PERMANENT_DROP_REASONS else Bounce.NONE), reason
    if name in ("deferred", "delivered"):
        return Bounce.NONE, _join([str(item.get("response") or ""), _attempt(item)])
    if name == "group_unsubscribe":
        return Bounce.NONE, f"unsubscribe group {item.get('asm_group_id', '')}".strip()
    if name == "click":
        return Bounce.NONE, str(item.get("url") or "")
    if name == "open" and item.get("sg_machine_open"):
        return Bounce.NONE, "machine open (mail privacy proxy)"
    return Bounce.NONE, ""


def _attempt(item: dict[str, Any]) -> str:
    return f"attempt {item['attempt']}" if item.get("attempt") else ""


def _join(parts: list[str]) -> str:
    return "; ".join(part.strip() for part in parts if part and part.strip())


def _event_id(item: dict[str, Any]) -> str | None:
    """`sg_event_id`, SendGrid's unique id of this event (hashed when too long to store). Every
    event carries one; should one not, the digest of the event's canonical JSON still makes a
    replay of it a duplicate (None when that JSON cannot be written: nested too deep, NaN)."""
    value = item.get("sg_event_id")
    if isinstance(value, str) and value.strip():
        return storable_event_id(value.strip())
    # Checked first: json.dumps recurses once per level and would run out of stack.
    if json_storage_problem(item, max_depth=MAX_JSON_DEPTH):
        return None
    return hashed_event_id(json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=True))


def _our_id(value: Any) -> int | None:
    """custom_args arrive as strings; anything not a plausible id of ours matches no message."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def _occurred_at(value: Any, received_at: datetime) -> datetime:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            pass
    return received_at
