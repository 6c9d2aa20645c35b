"""Open and click tokens: what `/t/o/<token>` and `/t/c/<token>` carry.

Both are sealed by core/signing.py, as the unsubscribe token is (authenticated encryption in the
SIV shape): the tag is HMAC-SHA256, cut to 128 bits, over everything the token stands for, under
a key derived from SECRET_KEY (or a SECRET_KEY_FALLBACKS entry, when the secret was rotated); the
message id (and link index) is XORed with an HMAC keystream derived from the tag. So a token
reveals no message id, two consecutive messages' tokens share nothing
(never sequential, never time-based), and none can be made for another message without SECRET_KEY.

- open token: (message id) → 16 + 8 bytes, 32 base64url characters.
- click token: (message id, link index, URL), all three under the tag; the URL travels in the clear
  after the sealed header (it is where the browser goes anyway). A click therefore redirects only
  to the URL signed for that message and link: there is no `?url=` and a changed byte is a 404.
  Only http and https URLs are ever signed, so the redirect can never become `javascript:`.

Tracking tokens do not expire: a link in a
years-old message must still lead where it said.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from core import signing
from delivery.exceptions import InvalidToken

_NAMESPACE = "emailhub.tracking"  # core/signing.py derives this kind's keys from it
_OPEN = struct.Struct(">Q")  # message id
_CLICK = struct.Struct(">QH")  # message id, link index
_TAG_BYTES = signing.TAG_BYTES
# A URL longer than this is not rewritten (the token would make the link unwieldy; browsers and
# mail clients start to truncate around 2,000 characters).
MAX_URL_BYTES = 1800
MAX_LINKS = 2**16 - 1
_MAX_TOKEN_CHARS = 4 * (_TAG_BYTES + _CLICK.size + MAX_URL_BYTES) // 3 + 4


@dataclass(frozen=True)
class Click:
    message_id: int
    link: int
    url: str


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


def _unseal(token: str, size: int, signed: Callable[[bytes, bytes], bytes]) -> tuple[bytes, bytes]:
    try:
        return signing.unseal(_NAMESPACE, signing.decode(token, _MAX_TOKEN_CHARS), size, signed)
    except signing.BadToken as exc:
        raise InvalidToken(str(exc)) from None


def open_token(message_id: int) -> str:
    header = _OPEN.pack(message_id)
    return signing.encode(signing.seal(_NAMESPACE, header, b"o" + header))


def read_open_token(token: str) -> int:
    """The message id of an open token. Raises InvalidToken."""
    header, rest = _unseal(token, _OPEN.size, lambda header, _: b"o" + header)
    if rest:
        raise InvalidToken("not an open token")
    return int(_OPEN.unpack(header)[0])


def click_token(message_id: int, link: int, url: str) -> str:
    """The token of link number `link` of message `message_id`, leading to `url` (trackable)."""
    header = _CLICK.pack(message_id, link)
    body = url.encode()
    return signing.encode(signing.seal(_NAMESPACE, header, b"c" + header + body) + body)


def read_click_token(token: str) -> Click:
    """(message id, link index, URL) of a click token. Raises InvalidToken."""
    header, body = _unseal(token, _CLICK.size, lambda header, body: b"c" + header + body)
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
