"""The one way emailhub signs what it puts in a link: sealed tokens, with key rotation.

A sealed token is an authenticated encryption in the SIV shape: the tag is HMAC-SHA256, cut to
128 bits, over everything the token stands for (`signed`), under a MAC key; the `header` (the
ids a token carries) is XORed with an HMAC keystream derived from the tag under an encryption
key. So a token reveals no id, two consecutive ids' tokens share nothing, and none can be made
without the secret. Both keys are derived from the secret and a namespace per kind of token
(`emailhub.unsubscribe`, `emailhub.tracking`), so a token of one kind never verifies as another.
Verified in constant time (`hmac.compare_digest`).

Why not `django.core.signing`: its tokens carry the signed value in the clear (a message id in
every unsubscribe and tracking URL) and are about twice as long; links already in inboxes use
this format and must keep working.

**Rotation.** Tokens are sealed under SECRET_KEY and opened under SECRET_KEY, then each of
SECRET_KEY_FALLBACKS in turn (Django's own rule for its signer): to rotate, set the new
SECRET_KEY and move the old one to SECRET_KEY_FALLBACKS for as long as links sent under it
must work (at least EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS; tracking links do not expire, so keep it
as long as old clicks should still redirect).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable

from django.conf import settings

TAG_BYTES = 16


class BadToken(ValueError):
    """Not a token sealed under the current secret or a fallback (forged, tampered, malformed)."""


_keys: dict[tuple[str, tuple[str, ...]], list[tuple[bytes, bytes]]] = {}


def _derive(secret: str, namespace: str, purpose: str) -> bytes:
    return hmac.new(secret.encode(), f"{namespace}.{purpose}".encode(), hashlib.sha256).digest()


def keys(namespace: str) -> list[tuple[bytes, bytes]]:
    """(MAC key, encryption key) for SECRET_KEY, then for each SECRET_KEY_FALLBACKS entry; computed
    once per secret (a token per link per recipient: two extra HMACs each would double the cost)."""
    secrets = (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS)
    found = _keys.get((namespace, secrets))
    if found is None:
        found = [(_derive(s, namespace, "mac"), _derive(s, namespace, "enc")) for s in secrets]
        _keys[(namespace, secrets)] = found
    return found


def _xor(data: bytes, stream: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(data, stream, strict=True))


def seal(namespace: str, header: bytes, signed: bytes) -> bytes:
    """tag + the encrypted header, under the current secret (`signed` covers the header and
    whatever travels beside the token in the clear)."""
    mac, enc = keys(namespace)[0]
    tag = hmac.new(mac, signed, hashlib.sha256).digest()[:TAG_BYTES]
    return tag + _xor(header, hmac.new(enc, tag, hashlib.sha256).digest()[: len(header)])


def unseal(
    namespace: str, raw: bytes, size: int, signed: Callable[[bytes, bytes], bytes]
) -> tuple[bytes, bytes]:
    """(header, the rest) of `raw`, sealed by `seal` with a `size`-byte header and followed by the
    clear rest; `signed(header, rest)` rebuilds what the tag covers. Tries the current secret, then
    each fallback. Raises BadToken."""
    if len(raw) < TAG_BYTES + size:
        raise BadToken("token too short")
    tag, sealed, rest = raw[:TAG_BYTES], raw[TAG_BYTES : TAG_BYTES + size], raw[TAG_BYTES + size :]
    for mac, enc in keys(namespace):
        header = _xor(sealed, hmac.new(enc, tag, hashlib.sha256).digest()[:size])
        expected = hmac.new(mac, signed(header, rest), hashlib.sha256).digest()[:TAG_BYTES]
        if hmac.compare_digest(tag, expected):
            return header, rest
    raise BadToken("token does not verify")


def encode(raw: bytes) -> str:
    """Unpadded base64url: what goes in the URL."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode(token: str, max_chars: int) -> bytes:
    """The bytes of an `encode`d token, in its one spelling only (no stray bits, no '+' or '/',
    no padding). Raises BadToken."""
    if not token or len(token) > max_chars or not token.isascii():
        raise BadToken("malformed token")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise BadToken("malformed token") from None
    if encode(raw) != token:
        raise BadToken("malformed token")
    return raw
