"""Open and click tokens: what `/t/o/<token>` and `/t/c/<token>` carry.

Both are authenticated encryptions in the shape of the unsubscribe token (campaigns/unsubscribe.py,
SIV): the tag is HMAC-SHA256, cut to 128 bits, over everything the token stands for, under a key
derived from SECRET_KEY; the message id (and link index) is XORed with an HMAC keystream derived
from the tag. So a token reveals no message id, two consecutive messages' tokens share nothing
(never sequential, never time-based), and none can be made for another message without SECRET_KEY.

- open token: (message id) → 16 + 8 bytes, 32 base64url characters.
- click token: (message id, link index, URL), all three under the tag; the URL travels in the clear
  after the sealed header (it is where the browser goes anyway). A click therefore redirects only
  to the URL signed for that message and link: there is no `?url=` and a changed byte is a 404.
  Only http and https URLs are ever signed, so the redirect can never become `javascript:`.

Verified in constant time (`hmac.compare_digest`). Tracking tokens do not expire: a link in a
years-old message must still lead where it said.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

_OPEN = struct.Struct(">Q")  # message id
_CLICK = struct.Struct(">QH")  # message id, link index
_TAG_BYTES = 16
# A URL longer than this is not rewritten (the token would make the link unwieldy; browsers and
# mail clients start to truncate around 2,000 characters).
MAX_URL_BYTES = 1800
MAX_LINKS = 2**16 - 1
_MAX_TOKEN_CHARS = 4 * (_TAG_BYTES + _CLICK.size + MAX_URL_BYTES) // 3 + 4


class InvalidToken(ValueError):
    """Not a token we issued (malformed, forged, tampered with, or under another SECRET_KEY)."""


@dataclass(frozen=True)
class Click:
    message_id: int
    link: int
    url: str


def _key(purpose: str) -> bytes:
    return hmac.new(
        settings.SECRET_KEY.encode(), f"emailhub.tracking.{purpose}".encode(), hashlib.sha256
    ).digest()


class _Keys:
    """The derived keys, computed once per SECRET_KEY (a token per link per recipient: the two
    extra HMACs per token would double the cost)."""

    secret: str | None = None
    mac: bytes = b""
    enc: bytes = b""

    @classmethod
    def get(cls) -> tuple[bytes, bytes]:
        if cls.secret != settings.SECRET_KEY:
            cls.mac, cls.enc, cls.secret = _key("mac"), _key("enc"), settings.SECRET_KEY
        return cls.mac, cls.enc


def _seal(header: bytes, signed: bytes) -> bytes:
    mac, enc = _Keys.get()
    tag = hmac.new(mac, signed, hashlib.sha256).digest()[:_TAG_BYTES]
    stream = hmac.new(enc, tag, hashlib.sha256).digest()[: len(header)]
    return tag + bytes(a ^ b for a, b in zip(header, stream, strict=True))


def _open(raw: bytes, size: int) -> tuple[bytes, bytes]:
    """(header, the rest) of a sealed token, before the tag is checked."""
    if len(raw) < _TAG_BYTES + size:
        raise InvalidToken("token too short")
    _, enc = _Keys.get()
    tag, sealed, rest = raw[:_TAG_BYTES], raw[_TAG_BYTES : _TAG_BYTES + size], raw[_TAG_BYTES + size :]
    stream = hmac.new(enc, tag, hashlib.sha256).digest()[:size]
    return bytes(a ^ b for a, b in zip(sealed, stream, strict=True)), rest


def _check(raw: bytes, signed: bytes) -> None:
    mac, _ = _Keys.get()
    expected = hmac.new(mac, signed, hashlib.sha256).digest()[:_TAG_BYTES]
    if not hmac.compare_digest(raw[:_TAG_BYTES], expected):
        raise InvalidToken("token does not verify")


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode(token: str) -> bytes:
    if not token or len(token) > _MAX_TOKEN_CHARS or not token.isascii():
        raise InvalidToken("malformed token")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed token") from None
    if _encode(raw) != token:
        raise InvalidToken("malformed token")  # one spelling only (no stray bits, no '+' or '/')
    return raw


def trackable(url: str) -> bool:
    """Whether a link may be rewritten: an absolute http(s) URL of reasonable length."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return (
        parts.scheme.lower() in ("http", "https")
        and bool(parts.netloc)
        and len(url.encode()) <= MAX_URL_BYTES
    )


def open_token(message_id: int) -> str:
    header = _OPEN.pack(message_id)
    return _encode(_seal(header, b"o" + header))


def read_open_token(token: str) -> int:
    """The message id of an open token. Raises InvalidToken."""
    raw = _decode(token)
    if len(raw) != _TAG_BYTES + _OPEN.size:
        raise InvalidToken("not an open token")
    header, _ = _open(raw, _OPEN.size)
    _check(raw, b"o" + header)
    return int(_OPEN.unpack(header)[0])


def click_token(message_id: int, link: int, url: str) -> str:
    """The token of link number `link` of message `message_id`, leading to `url` (trackable)."""
    header = _CLICK.pack(message_id, link)
    body = url.encode()
    return _encode(_seal(header, b"c" + header + body) + body)


def read_click_token(token: str) -> Click:
    """(message id, link index, URL) of a click token. Raises InvalidToken."""
    raw = _decode(token)
    header, body = _open(raw, _CLICK.size)
    _check(raw, b"c" + header + body)
    message_id, link = _CLICK.unpack(header)
    try:
        url = body.decode()
    except UnicodeDecodeError:
        raise InvalidToken("malformed URL") from None
    if not trackable(url):  # we never sign one, but a key leak must not make an open redirect
        raise InvalidToken("not an http(s) URL")
    return Click(message_id=message_id, link=link, url=url)


def open_url(message_id: int) -> str:
    return f"{settings.EMAILHUB_PUBLIC_URL.rstrip('/')}/t/o/{open_token(message_id)}"


def click_url(message_id: int, link: int, url: str) -> str:
    return f"{settings.EMAILHUB_PUBLIC_URL.rstrip('/')}/t/c/{click_token(message_id, link, url)}"
