"""Standard Webhooks signatures (v1.0.0): `webhook-signature: v1,<base64 HMAC-SHA256 of
"{webhook-id}.{webhook-timestamp}.{body}">`, keyed by the secret's bytes (`whsec_` + base64).

Several signatures, space-separated, while an old secret is still valid after a rotation: a
receiver that knows either secret accepts the request (the specification's own rule)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

PREFIX = "whsec_"
SECRET_BYTES = 32  # the specification allows 24 to 64


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def key_of(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key_of(secret), signed, hashlib.sha256).digest()).decode()


def headers(secrets_in_use: Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one request, signed by every secret in use."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, webhook_id, timestamp, body) for s in secrets_in_use),
    }
