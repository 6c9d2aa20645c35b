"""Amazon SES events through Amazon SNS: `POST /api/v1/webhooks/ses`.

SES publishes bounces, complaints, deliveries… to an SNS topic (identity notifications,
`notificationType`, or configuration-set event publishing, `eventType`); SNS POSTs each
notification to this endpoint as a JSON envelope whose `Message` is the SES event as a string.

What is verified, before anything is acted on (AWS, "Verifying the signatures of Amazon SNS
messages", https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html):

- `Type` is Notification, SubscriptionConfirmation or UnsubscribeConfirmation and every field
  the string-to-sign needs is a string;
- the `x-amz-sns-message-type` header is exactly that `Type`: SNS sends both ("HTTP/HTTPS
  headers", https://docs.aws.amazon.com/sns/latest/dg/http-header.html), so a request whose
  header is missing or says otherwise was put together by someone else;
- `TopicArn` is in `EMAILHUB_SES_SNS_TOPIC_ARNS` (empty refuses everything);
- `SigningCertURL` is, as a whole string, `https://sns.<region>.amazonaws.com[.cn]/
  SimpleNotificationService-<hex>.pem` (the shape of AWS's own example in "HTTP/HTTPS
  notification JSON format"), with no port, userinfo, query or fragment: a certificate on any
  other host, an S3 bucket on `amazonaws.com` included, is anyone's, and any other path on the
  SNS host (`….txt`, `x.txt?.pem`) is whatever that host answers, not a signing certificate;
- `Signature` is PKCS#1 v1.5 RSA over the string-to-sign with SHA1 (`SignatureVersion` 1) or
  SHA256 (2), by that certificate's key. The string-to-sign is "key\\nvalue\\n" for, in this
  order: Notification: Message, MessageId, Subject (only when present), Timestamp, TopicArn,
  Type; the two confirmations: Message, MessageId, SubscribeURL, Timestamp, Token, TopicArn, Type.

Certificates are fetched once (per process, and shared through Redis for a day) and only from
a URL that passed that rule; `EMAILHUB_SNS_CERT_FETCH_OVERRIDE` (tests) redirects that fetch to
a local server after the check, so the check itself is never relaxed (and `check --deploy`
refuses the setting: delivery.E002). No timestamp
window: a replayed notification is harmless (events are deduplicated on MessageId:recipient).

A SubscriptionConfirmation is confirmed through the SNS API (`ConfirmSubscription` with the
topic and token, `EMAILHUB_SNS_ENDPOINT_URL`), never by fetching `SubscribeURL`, which the
body names and which we would otherwise GET for anyone. An UnsubscribeConfirmation is logged
and answered, nothing recorded and nothing re-subscribed: someone unsubscribed the endpoint on
purpose (or the topic is gone), and fighting that would hide it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.conf import settings

from core import redis_clients
from delivery.exceptions import ForgedWebhook, InvalidWebhook, WebhookUnavailable
from delivery.models import EmailEvent
from delivery.services.events import ProviderEvent, RecordedEvents, storable_event_id
from delivery.webhooks.base import (
    BAD_RECIPIENT,
    MISSING_FIELD,
    EventBatch,
    Webhook,
    WebhookRequest,
    answer,
    decode_json,
)

logger = logging.getLogger(__name__)

Kind = EmailEvent.Kind
Bounce = EmailEvent.Bounce

NOTIFICATION = "Notification"
SUBSCRIBE = "SubscriptionConfirmation"
UNSUBSCRIBE = "UnsubscribeConfirmation"

# The string-to-sign's fields, in AWS's order. Subject is signed only when the envelope has it.
SIGNED_FIELDS = {
    NOTIFICATION: ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    SUBSCRIBE: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    UNSUBSCRIBE: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
OPTIONAL_FIELDS = {"Subject"}
HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}

# The header in which SNS repeats the message's Type (AWS, "HTTP/HTTPS headers").
MESSAGE_TYPE_HEADER = "x-amz-sns-message-type"

# The whole SigningCertURL: exactly the SNS endpoint of a region (`sns.eu-west-1.amazonaws.com`,
# GovCloud's `sns.us-gov-west-1…`, China's `.amazonaws.com.cn`) and the one file name SNS
# publishes its certificates under, as in AWS's example
# `https://sns.us-west-2.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem`
# ("HTTP/HTTPS notification JSON format",
# https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html). Not `*.amazonaws.com`:
# `s3.amazonaws.com/any-bucket/cert.pem` is anyone's certificate. Not any path on the endpoint:
# `/SimpleNotificationService-0123.txt` or `/x.txt?.pem` is whatever it answers there. Matched
# against the whole string (ASCII classes, no `\d`: "١" is a digit too), so userinfo, a port
# (even `:443`), a query (even an empty `?`), a fragment, a percent-escape or a trailing newline
# never passes.
CERT_URL = re.compile(
    r"https://sns\.[a-z]{2}(?:-[a-z]+)+-[0-9]+\.amazonaws\.com(?:\.cn)?"
    r"/SimpleNotificationService-[0-9a-fA-F]+\.pem"
)
# A PEM certificate is ~2 KiB; refuse to read megabytes from a misbehaving server.
CERT_MAX_BYTES = 64 * 1024
CERT_FETCH_TIMEOUT_SECONDS = 5.0
CERT_REDIS_TTL_SECONDS = 24 * 3600
CERT_REDIS_PREFIX = "emailhub:sns-cert:"


def string_to_sign(envelope: Mapping[str, Any]) -> bytes:
    """The bytes SNS signed for this envelope (fields checked to be strings beforehand)."""
    parts: list[str] = []
    for name in SIGNED_FIELDS[envelope["Type"]]:
        if name in OPTIONAL_FIELDS and name not in envelope:
            continue
        parts.append(f"{name}\n{envelope[name]}\n")
    return "".join(parts).encode("utf-8")


def check_cert_url(url: str) -> None:
    """Refuse (ForgedWebhook) a SigningCertURL that is not an SNS certificate file (CERT_URL)."""
    if not CERT_URL.fullmatch(url):
        raise ForgedWebhook(
            f"SigningCertURL {url[:200]!r} is not https://sns.<region>.amazonaws.com[.cn]/"
            "SimpleNotificationService-<hex>.pem (no port, userinfo, query or fragment); refused"
        )


class CertificateStore:
    """Signing certificates' public keys by URL: in this process, then Redis, then fetched."""

    def __init__(self) -> None:
        self._keys: dict[str, rsa.RSAPublicKey] = {}
        self._lock = threading.Lock()
        self.fetches = 0  # how many times a certificate was downloaded (tests, logs)

    def public_key(self, url: str) -> rsa.RSAPublicKey:
        """The key of the certificate at `url`, which `check_cert_url` has accepted."""
        key = self._keys.get(url)
        if key is not None:
            return key
        redis_key = CERT_REDIS_PREFIX + hashlib.sha256(url.encode()).hexdigest()
        pem = self._from_redis(redis_key)
        if pem is None:
            pem = self._fetch(url)
            self._to_redis(redis_key, pem)
        key = self._load(pem, url)
        with self._lock:
            self._keys[url] = key
        return key

    def _fetch(self, url: str) -> bytes:
        source = url
        for prefix, base in settings.EMAILHUB_SNS_CERT_FETCH_OVERRIDE.items():
            if url.startswith(prefix):
                source = base + url[len(prefix) :]
                break
        try:
            with urllib.request.urlopen(source, timeout=CERT_FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310
                pem = response.read(CERT_MAX_BYTES + 1)
        except OSError as exc:  # URLError, HTTPError, timeouts
            # Ours or the network's fault, not the sender's: 503, and SNS retries.
            raise WebhookUnavailable(f"could not fetch the SNS signing certificate {url}: {exc}") from exc
        if len(pem) > CERT_MAX_BYTES:
            raise ForgedWebhook(f"the signing certificate at {url} is larger than {CERT_MAX_BYTES} bytes")
        self.fetches += 1
        return pem

    @staticmethod
    def _load(pem: bytes, url: str) -> rsa.RSAPublicKey:
        try:
            certificate = x509.load_pem_x509_certificate(pem)
        except ValueError as exc:
            raise ForgedWebhook(f"the document at {url} is not a PEM certificate") from exc
        now = datetime.now(UTC)
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise ForgedWebhook(f"the signing certificate at {url} is not valid now")
        key = certificate.public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            raise ForgedWebhook(f"the signing certificate at {url} has no RSA key")
        return key

    @staticmethod
    def _from_redis(redis_key: str) -> bytes | None:
        # The Redis copy only saves a download; when Redis is down we fetch.
        try:
            value = redis_clients.send_path().get(redis_key)
        except Exception:  # noqa: BLE001 - any Redis trouble: fetch instead
            logger.warning("SNS certificate cache unavailable in Redis; fetching", exc_info=True)
            return None
        return value if isinstance(value, bytes) else None

    @staticmethod
    def _to_redis(redis_key: str, pem: bytes) -> None:
        try:
            redis_clients.send_path().set(redis_key, pem, ex=CERT_REDIS_TTL_SECONDS)
        except Exception:  # noqa: BLE001
            logger.warning("could not cache the SNS certificate in Redis", exc_info=True)

    def forget(self) -> None:
        with self._lock:
            self._keys.clear()


def verify_envelope(
    envelope: Any, topics: Sequence[str], certificates: CertificateStore, *, message_type: str | None
) -> None:
    """Raise ForgedWebhook unless `envelope` is an SNS message signed by SNS for an allowed topic
    and `message_type` (the MESSAGE_TYPE_HEADER's value, None when absent) is its Type."""
    if not isinstance(envelope, dict):
        raise ForgedWebhook("not an SNS message (a JSON object was expected)")
    kind = envelope.get("Type")
    if kind not in SIGNED_FIELDS:
        raise ForgedWebhook(f"unknown SNS message Type {kind!r}")
    if message_type != kind:
        # SNS always sends both; the signature covers only the body, so a header that disagrees
        # means someone re-used a signed body in a request of their own.
        raise ForgedWebhook(
            f"the {MESSAGE_TYPE_HEADER} header ({message_type!r}) is not the message's Type ({kind!r})"
        )
    for name in (*SIGNED_FIELDS[kind], "Signature", "SignatureVersion", "SigningCertURL"):
        if name in OPTIONAL_FIELDS and name not in envelope:
            continue
        if not isinstance(envelope.get(name), str):
            raise ForgedWebhook(f"SNS field {name} missing or not a string")
    algorithm = HASHES.get(envelope["SignatureVersion"])
    if algorithm is None:
        raise ForgedWebhook(f"unsupported SignatureVersion {envelope['SignatureVersion']!r}")
    if envelope["TopicArn"] not in topics:
        raise ForgedWebhook(
            f"topic {envelope['TopicArn']!r} is not in EMAILHUB_SES_SNS_TOPIC_ARNS; add it to accept it"
        )
    check_cert_url(envelope["SigningCertURL"])
    try:
        signature = base64.b64decode(envelope["Signature"], validate=True)
    except ValueError as exc:
        raise ForgedWebhook("Signature is not base64") from exc
    key = certificates.public_key(envelope["SigningCertURL"])
    try:
        key.verify(signature, string_to_sign(envelope), padding.PKCS1v15(), algorithm())
    except InvalidSignature as exc:
        raise ForgedWebhook("the SNS signature does not match the message") from exc


def _time(value: Any, fallback: datetime) -> datetime:
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
            if parsed.tzinfo is not None:
                return parsed.astimezone(UTC)
        except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 moved into UTC
            return fallback
    return fallback


def _header_message_id(mail: Mapping[str, Any]) -> int | None:
    """Our id from the X-Emailhub-Message header, when SES includes the original headers."""
    headers = mail.get("headers")
    for header in headers if isinstance(headers, list) else ():
        if isinstance(header, dict) and str(header.get("name", "")).lower() == "x-emailhub-message":
            value = str(header.get("value", "")).strip()
            # isascii: "²".isdigit() is true and int("²") raises.
            return int(value) if value.isascii() and value.isdigit() else None
    return None


def _bare(address: str) -> str:
    """`"Name" <a@b>` → a@b (SES's mail.destination may carry display names)."""
    match = re.search(r"<([^<>]+)>\s*$", address)
    return (match.group(1) if match else address).strip().lower()


# The SES events we record: their kind, the object holding their details, and the list of the
# recipients they concern inside it (None: every address of mail.destination, for events about
# the message rather than one address).
RECORDED: dict[str, tuple[str, str, str | None]] = {
    "Bounce": (Kind.BOUNCED, "bounce", "bouncedRecipients"),
    "Complaint": (Kind.COMPLAINED, "complaint", "complainedRecipients"),
    "Delivery": (Kind.DELIVERED, "delivery", "recipients"),
    "DeliveryDelay": (Kind.DELAYED, "deliveryDelay", "delayedRecipients"),
    "Reject": (Kind.REJECTED, "reject", None),
    "Open": (Kind.OPENED, "open", None),
    "Click": (Kind.CLICKED, "click", None),
}


def ses_events(
    sns_message_id: str, event: Mapping[str, Any], received_at: datetime, batch: EventBatch
) -> None:
    """Add the ProviderEvents of one SES event (the SNS Message) to `batch`, one per recipient.

    Event ids are `<SNS MessageId>:<recipient>` (hashed when longer than the column, e.g. for a
    254-character address): SNS gives each notification its own id and one notification may
    cover several recipients. Send, Rendering Failure, Subscription and test notifications
    (AmazonSnsSubscriptionSucceeded) have no consequence here and give no event. An event
    without what it needs is skipped; so is each recipient that is not an address or cannot be
    stored, and the others are recorded.
    """
    where = f"SNS message {sns_message_id}"
    kind_name = event.get("eventType") or event.get("notificationType")
    if not isinstance(kind_name, str):
        batch.skip(MISSING_FIELD, where, "the SES event has no eventType or notificationType")
        return
    if kind_name not in RECORDED:
        logger.info("SES %s notification %s: nothing to record", kind_name, sns_message_id)
        return
    kind, body_name, list_name = RECORDED[kind_name]
    mail, body = event.get("mail"), event.get(body_name)
    if not isinstance(mail, dict) or not isinstance(body, dict):
        missing = "mail" if not isinstance(mail, dict) else body_name
        batch.skip(MISSING_FIELD, where, f"the SES {kind_name} event has no {missing!r} object")
        return
    entries = body.get(list_name) if list_name else mail.get("destination")
    if not isinstance(entries, list):
        listed = f"{body_name}.{list_name}" if list_name else "mail.destination"
        batch.skip(MISSING_FIELD, where, f"the SES {kind_name} event has no {listed} list")
        return

    message_id = _header_message_id(mail)
    provider_message_id = mail.get("messageId") if isinstance(mail.get("messageId"), str) else None
    mail_summary = {k: mail[k] for k in ("messageId", "timestamp", "source", "sourceArn") if k in mail}
    occurred_at = _time(body.get("timestamp"), _time(mail.get("timestamp"), received_at))
    # This recipient's part only: a 50-recipient bounce does not store 50 copies of 50, and one
    # recipient's unstorable entry is not copied into the others' payloads.
    shared = {k: v for k, v in body.items() if k != list_name and not k.endswith("Recipients")}
    engagement = kind in (Kind.OPENED, Kind.CLICKED)

    for number, entry in enumerate(entries, 1):
        place = f"{where} recipient {number} of {len(entries)}"
        # Recipient lists hold objects ({emailAddress, …}) or, for Delivery, plain strings.
        if isinstance(entry, dict) and isinstance(entry.get("emailAddress"), str) and list_name:
            address, details = entry["emailAddress"], entry
        elif isinstance(entry, str):
            address, details = entry, {}
        else:
            batch.skip(BAD_RECIPIENT, place, "not an address")
            continue
        bounce, detail = _bounce_and_detail(kind_name, body, details)
        recipient = _bare(address)
        batch.add(
            ProviderEvent(
                provider="ses",
                event_id=storable_event_id(f"{sns_message_id}:{recipient}"),
                kind=kind,
                occurred_at=occurred_at,
                message_id=message_id,
                provider_message_id=provider_message_id,
                recipient=recipient,
                bounce=bounce,
                detail=detail,
                # Open and Click carry who fetched (classified by record_events, like our own hits).
                user_agent=str(body.get("userAgent") or "") if engagement else "",
                ip=str(body.get("ipAddress") or "") if engagement else "",
                payload={
                    "eventType": kind_name,
                    "mail": mail_summary,
                    kind_name.lower(): shared,
                    "recipient": dict(details),
                },
            ),
            place,
        )


def _bounce_and_detail(kind_name: str, body: Mapping[str, Any], entry: Mapping[str, Any]) -> tuple[str, str]:
    """The event's bounce type and its human-readable detail, from the event and the recipient."""
    if kind_name == "Bounce":
        bounce_type, subtype = str(body.get("bounceType", "")), str(body.get("bounceSubType", ""))
        diagnostic = entry.get("diagnosticCode") or entry.get("status") or ""
        # Undetermined: SES could not tell. Treated as transient: suppressing on a guess would
        # silence a good address for ever; a real hard bounce will come again.
        bounce = Bounce.PERMANENT if bounce_type == "Permanent" else Bounce.TRANSIENT
        return bounce, f"{bounce_type}/{subtype}" + (f": {diagnostic}" if diagnostic else "")
    if kind_name == "Complaint":
        return Bounce.NONE, "/".join(
            str(body[k]) for k in ("complaintFeedbackType", "complaintSubType") if body.get(k)
        )
    if kind_name == "Delivery":
        return Bounce.NONE, str(body.get("smtpResponse", ""))
    if kind_name == "DeliveryDelay":
        diagnostic = entry.get("diagnosticCode")
        return Bounce.NONE, str(body.get("delayType", "")) + (f": {diagnostic}" if diagnostic else "")
    if kind_name == "Reject":  # SES refused to send (a virus, usually): about the message, not the address
        return Bounce.NONE, str(body.get("reason", ""))
    if kind_name == "Click":
        return Bounce.NONE, str(body.get("link", ""))
    return Bounce.NONE, ""


class SESWebhook(Webhook):
    name = "ses"

    def __init__(self, topics: Sequence[str], endpoint_url: str, region: str) -> None:
        self.topics = tuple(topics)
        self.endpoint_url = endpoint_url
        self.region = region
        self.certificates = CertificateStore()

    @classmethod
    def from_settings(cls) -> SESWebhook:
        return cls(
            topics=settings.EMAILHUB_SES_SNS_TOPIC_ARNS,
            endpoint_url=settings.EMAILHUB_SNS_ENDPOINT_URL,
            region=settings.SES_REGION,
        )

    def verify(self, request: WebhookRequest) -> None:
        try:
            envelope = request.json()
        except InvalidWebhook as exc:  # unsigned garbage is a forgery, not an SES event
            raise ForgedWebhook(str(exc.detail)) from exc
        verify_envelope(
            envelope, self.topics, self.certificates, message_type=request.headers.get(MESSAGE_TYPE_HEADER)
        )

    def parse(self, request: WebhookRequest) -> EventBatch:
        envelope = request.json()
        batch = EventBatch(self.name)
        if envelope["Type"] != NOTIFICATION:
            return batch
        # A Message that is not JSON or not an object holds no event at all: a 400. What one
        # recipient's part cannot store (a NaN, a NUL, deep nesting) is found per recipient, so
        # it costs that recipient only.
        event = decode_json(envelope["Message"], "the SNS Message")
        if not isinstance(event, dict):
            raise InvalidWebhook("the SNS Message is not an SES event (a JSON object expected)")
        received_at = _time(envelope["Timestamp"], datetime.now(UTC))
        ses_events(envelope["MessageId"], event, received_at, batch)
        return batch

    def acknowledge(
        self, request: WebhookRequest, recorded: RecordedEvents | None, batch: EventBatch
    ) -> dict[str, Any]:
        envelope = request.json()
        if envelope["Type"] == SUBSCRIBE:
            return {"confirmed": self.confirm(envelope["TopicArn"], envelope["Token"])}
        if envelope["Type"] == UNSUBSCRIBE:
            logger.warning(
                "SNS: this endpoint was unsubscribed from %s; resubscribe it in SNS if that was a mistake",
                envelope["TopicArn"],
            )
            return {"unsubscribed": envelope["TopicArn"]}
        return answer(recorded, batch)

    def confirm(self, topic_arn: str, token: str) -> str:
        """ConfirmSubscription through the SNS API of the topic's region; the subscription ARN."""
        region = topic_arn.split(":")[3] if topic_arn.count(":") >= 5 else self.region
        client = boto3.client(
            "sns",
            region_name=region or self.region,
            endpoint_url=self.endpoint_url or None,
            aws_access_key_id=settings.SES_ACCESS_KEY_ID or None,
            aws_secret_access_key=settings.SES_SECRET_ACCESS_KEY or None,
            config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}),
        )
        try:
            response = client.confirm_subscription(TopicArn=topic_arn, Token=token)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            # SNS resends the confirmation for a while (and it can be confirmed by hand): 503.
            raise WebhookUnavailable(f"SNS ConfirmSubscription for {topic_arn} failed: {exc}") from exc
        arn = str(response.get("SubscriptionArn", ""))
        logger.info("SNS subscription confirmed: %s", arn)
        return arn
