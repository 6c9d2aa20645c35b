"""A stand-in for Amazon SNS's signing, with real crypto: an RSA key and a self-signed
certificate made here, the certificate served from a loopback HTTP server, and envelopes signed
exactly as SNS signs them (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA).

The certificate's official-looking URL (`https://sns.us-east-1.amazonaws.com/
SimpleNotificationService-<hex>.pem`) passes the webhook's SigningCertURL rule; `override` is the `EMAILHUB_SNS_CERT_FETCH_OVERRIDE` entry that makes the
webhook fetch it from this server instead. Used by tests and bench/webhooks.py.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from delivery.testing.http_server import BackgroundHTTPServer

REGION = "us-east-1"
OFFICIAL_BASE = f"https://sns.{REGION}.amazonaws.com/"
TOPIC_ARN = f"arn:aws:sns:{REGION}:123456789012:emailhub-ses-events"

_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
    "UnsubscribeConfirmation": (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
}


def http_headers(envelope: dict[str, Any]) -> dict[str, str]:
    """The headers SNS posts an envelope with ("HTTP/HTTPS headers",
    https://docs.aws.amazon.com/sns/latest/dg/http-header.html): its JSON as text/plain, and the
    Type again in x-amz-sns-message-type, which the webhook checks against the signed body."""
    return {
        "Content-Type": "text/plain; charset=UTF-8",
        "x-amz-sns-message-type": str(envelope.get("Type", "")),
        "x-amz-sns-message-id": str(envelope.get("MessageId", "")),
        "x-amz-sns-topic-arn": str(envelope.get("TopicArn", "")),
    }


def make_certificate(key: rsa.RSAPrivateKey, common_name: str = "sns.amazonaws.com") -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


class _CertHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        owner: SNSSigner = self.server.owner.signer  # type: ignore[attr-defined]
        with owner.lock:
            owner.requests.append(self.path)
            body = owner.documents.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-pem-file")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class SNSSigner:
    """Signs SNS envelopes and serves the signing certificate; a context manager."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.lock = threading.Lock()
        self.requests: list[str] = []  # paths fetched from the certificate server
        # A random name, so a certificate cached (in Redis) by an earlier run is never this one.
        self.cert_path = f"/SimpleNotificationService-{secrets.token_hex(8)}.pem"
        self.documents: dict[str, bytes] = {self.cert_path: make_certificate(self.key)}
        self._server = BackgroundHTTPServer(_CertHandler)
        self._server.signer = self  # type: ignore[attr-defined]

    def __enter__(self) -> SNSSigner:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def cert_url(self) -> str:
        return OFFICIAL_BASE + self.cert_path.lstrip("/")

    @property
    def override(self) -> dict[str, str]:
        """The EMAILHUB_SNS_CERT_FETCH_OVERRIDE setting that sends fetches here."""
        return {OFFICIAL_BASE: self._server.url + "/"}

    def sign(
        self, envelope: dict[str, Any], version: str = "2", *, signed_as: dict[str, Any] | None = None
    ) -> None:
        """Add SignatureVersion, SigningCertURL (unless set) and Signature to `envelope`,
        signing `signed_as` (default: the envelope itself) as SNS does."""
        envelope.setdefault("SigningCertURL", self.cert_url)
        envelope["SignatureVersion"] = version
        source = signed_as if signed_as is not None else envelope
        text = "".join(
            f"{name}\n{source[name]}\n" for name in _FIELDS[source["Type"]] if name in source
        ).encode()
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
        envelope["Signature"] = base64.b64encode(self.key.sign(text, padding.PKCS1v15(), algorithm)).decode()

    def notification(
        self,
        message: dict[str, Any] | str,
        *,
        topic_arn: str = TOPIC_ARN,
        subject: str | None = None,
        version: str = "2",
        message_id: str | None = None,
    ) -> dict[str, Any]:
        envelope: dict[str, Any] = {
            "Type": "Notification",
            "MessageId": message_id or str(uuid.uuid4()),
            "TopicArn": topic_arn,
            "Message": message if isinstance(message, str) else json.dumps(message),
            "Timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "UnsubscribeURL": f"{OFFICIAL_BASE}?Action=Unsubscribe&SubscriptionArn={topic_arn}:x",
        }
        if subject is not None:
            envelope["Subject"] = subject
        self.sign(envelope, version)
        return envelope

    def confirmation(
        self, kind: str, *, topic_arn: str = TOPIC_ARN, subscribe_url: str | None = None, version: str = "2"
    ) -> dict[str, Any]:
        token = secrets.token_hex(32)
        envelope: dict[str, Any] = {
            "Type": kind,
            "MessageId": str(uuid.uuid4()),
            "Token": token,
            "TopicArn": topic_arn,
            "Message": f"You have chosen to subscribe to the topic {topic_arn}.",
            "SubscribeURL": subscribe_url
            or f"{OFFICIAL_BASE}?Action=ConfirmSubscription&TopicArn={topic_arn}&Token={token}",
            "Timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        }
        self.sign(envelope, version)
        return envelope


def ses_bounce(
    recipients: list[str],
    *,
    bounce_type: str = "Permanent",
    subtype: str = "General",
    ses_message_id: str = "",
    emailhub_id: int | None = None,
    event_publishing: bool = False,
) -> dict[str, Any]:
    """An SES Bounce event as SNS carries it in `Message`."""
    body = {
        "bounceType": bounce_type,
        "bounceSubType": subtype,
        "bouncedRecipients": [
            {
                "emailAddress": r,
                "action": "failed",
                "status": "5.1.1",
                "diagnosticCode": "smtp; 550 5.1.1 user unknown",
            }
            for r in recipients
        ],
        "timestamp": "2024-05-01T12:00:01.000Z",
        "feedbackId": str(uuid.uuid4()),
    }
    return ses_event("Bounce", "bounce", body, recipients, ses_message_id, emailhub_id, event_publishing)


def ses_event(
    kind: str,
    key: str,
    body: dict[str, Any],
    destination: list[str],
    ses_message_id: str = "",
    emailhub_id: int | None = None,
    event_publishing: bool = False,
) -> dict[str, Any]:
    mail: dict[str, Any] = {
        "timestamp": "2024-05-01T12:00:00.000Z",
        "messageId": ses_message_id or f"0100{uuid.uuid4().hex}-000000",
        "source": "news@example.com",
        "destination": destination,
    }
    if emailhub_id is not None:
        mail["headersTruncated"] = False
        mail["headers"] = [
            {"name": "From", "value": "news@example.com"},
            {"name": "X-Emailhub-Message", "value": str(emailhub_id)},
        ]
    return {("eventType" if event_publishing else "notificationType"): kind, "mail": mail, key: body}
