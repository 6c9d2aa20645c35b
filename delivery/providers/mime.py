"""Building the MIME message every provider that takes raw mail sends (SMTP, SES), and the
address helpers every provider shares.

The structure is always the same: headers, then text/plain and text/html as
multipart/alternative (RFC 2046 §5.1.4: the preferred part last), both UTF-8 quoted-printable;
with attachments, that inside a multipart/mixed, and inline images with the HTML in a
multipart/related (`_entity` draws the tree).
Writing those bytes directly costs a few microseconds; the `email` package's EmailMessage
took ~40% of a worker's time per message (profiled with cProfile), almost all of it in its
header registry, which parses every header we have just generated. The tests parse what this
writes with `email.policy.default` and require zero defects.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from email.header import Header
from email.utils import format_datetime, formataddr, parseaddr
from urllib.parse import quote

from django.conf import settings

from delivery.providers.base import Attachment, OutgoingEmail

CRLF = b"\r\n"
# RFC 5322 §2.1.1: lines SHOULD be no longer than 78 characters.
_MAX_PLAIN_HEADER = 78
# Headers whose value is a list of <URI> (RFC 2369); List-Unsubscribe carries the one-click link.
_URI_LIST_HEADERS = {
    "list-unsubscribe",
    "list-help",
    "list-subscribe",
    "list-post",
    "list-owner",
    "list-archive",
}


def _header(name: str, value: str) -> bytes:
    if "\r" in value or "\n" in value:
        raise ValueError(f"header {name} must not contain line breaks")
    line = f"{name}: {value}"
    if value.isascii() and len(line) <= _MAX_PLAIN_HEADER:
        return line.encode("ascii")
    if name.lower() in _URI_LIST_HEADERS:
        # A list of <URI>s is structured: RFC 2047 encoded-words are not allowed in it (§5),
        # and a client would not read the URIs back. Fold between the URIs instead.
        if not value.isascii():
            raise ValueError(f"header {name} must be ASCII")
        folded = value.replace(", <", ",\r\n <")
        if max(len(part) for part in f"{name}: {folded}".split("\r\n")) > 998:
            raise ValueError(f"{name} is longer than an RFC 5322 line allows")
        return f"{name}: {folded}".encode("ascii")
    # RFC 2047 encoded-words, folded; Header knows both.
    encoded = Header(value, "utf-8", header_name=name).encode(linesep="\r\n")
    return f"{name}: {encoded}".encode("ascii")


def _addresses_header(name: str, values: Sequence[str]) -> bytes:
    """A header of several addresses (the API's cc), one per line: folded after each comma
    (RFC 5322 §3.2.2), so fifty addresses never make a line over 78 characters."""
    return (name + ": " + ",\r\n ".join(_mailbox(name, value) for value in values)).encode("ascii")


def _address_header(name: str, value: str) -> bytes:
    return f"{name}: {_mailbox(name, value)}".encode("ascii")


def _mailbox(name: str, value: str) -> str:
    """One address of header `name` as written: its display name encoded, its domain ASCII."""
    if "\r" in value or "\n" in value:
        raise ValueError(f"header {name} must not contain line breaks")
    display, address = _parse_address(value)
    if not address or "@" not in address:
        raise ValueError(f"{name} {value!r} is not an address")
    address = ascii_address(address)
    if display.isascii():
        # formataddr quotes a display name only where RFC 5322 needs it ("Ann, B"), as given.
        formatted = formataddr((display, address))
    else:
        # RFC 2047 §2: an encoded-word is at most 75 characters, so a long name is several,
        # folded; formataddr would write one word of any length.
        encoded = Header(display, "utf-8", maxlinelen=75, header_name=name).encode(linesep="\r\n")
        formatted = f"{encoded} <{address}>"
    if max(len(line) for line in f"{name}: {formatted}".split("\r\n")) > 998:
        raise ValueError(f"{name} is longer than an RFC 5322 line allows")
    return formatted


def _quoted_printable(text: str) -> bytes:
    normalised = text.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")
    encoded = binascii.b2a_qp(normalised, quotetabs=False, istext=True, header=False)
    # A line that is just "." (or starts with "From ") is safe: SMTP dot-stuffing handles the
    # first, and QP never produces the second unescaped at a line start (b2a_qp encodes "F").
    return encoded.replace(b"\n", CRLF)


def _part(content_type: str, body: str) -> bytes:
    return (
        f'Content-Type: {content_type}; charset="utf-8"\r\n'
        "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
    ).encode("ascii") + _quoted_printable(body)


# A plain dot-atom addr-spec (RFC 5322 §3.4.1), what nearly every recipient address is:
# parseaddr returns it unchanged with no display name, so it need not be parsed.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_PLAIN_ADDRESS = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")


@functools.lru_cache(maxsize=1024)
def _parse_named(value: str) -> tuple[str, str]:
    # A campaign's From is the same for every message: parsed once (parseaddr was ~40% of
    # rendering a message, profiled with cProfile).
    return parseaddr(value)


def _parse_address(value: str) -> tuple[str, str]:
    """parseaddr(value), without parsing a plain address and with the named ones cached."""
    if _PLAIN_ADDRESS.fullmatch(value):
        return "", value
    return _parse_named(value)


def bare_address(address: str) -> str:
    """`Shop <shop@example.com>` → `shop@example.com`."""
    return _parse_address(address)[1] or address


def ascii_address(address: str) -> str:
    """An internationalised domain becomes punycode (IDNA); a non-ASCII local part cannot be sent
    without SMTPUTF8 (RFC 6531), which we do not negotiate, so it is refused."""
    local, _, domain = address.rpartition("@")
    if not local.isascii():
        raise ValueError(f"address {address!r} has a non-ASCII local part; SMTPUTF8 is not supported")
    if not domain.isascii():
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"address {address!r} has an invalid international domain") from exc
    return f"{local}@{domain}"


def message_id_for(message_id: int, domain: str) -> str:
    """The Message-ID header of our message `message_id`: the same on every attempt and through
    every provider, so a receiver can drop a duplicate (RFC 5322 §3.6.4: one id per message,
    not per transmission). It is an HMAC of the id under SECRET_KEY, so it reveals neither the
    id nor how many messages we send, and cannot be forged for another message. 130 bits of the
    SHA-256 in lower-case base32: unique for all practical purposes, 26 characters."""
    digest = hmac.new(
        settings.SECRET_KEY.encode(), f"emailhub.message-id:{message_id}".encode(), hashlib.sha256
    ).digest()
    token = base64.b32encode(digest).decode("ascii")[:26].lower()
    return f"<{token}@{domain}>"


def render(email: OutgoingEmail, *, message_id_domain: str) -> tuple[str, bytes]:
    """(Message-ID, the message as CRLF bytes ready for SMTP DATA or SES raw content)."""
    message_id = message_id_for(email.message_id, message_id_domain)
    lines = [
        _header("Message-ID", message_id),
        _header("Date", format_datetime(datetime.now(UTC))),
        _address_header("From", email.from_email),
        _address_header("To", email.to),
        # Bcc is never written: the envelope (or the provider's API) alone carries it.
        *([_addresses_header("Cc", email.cc)] if email.cc else []),
        _header("Subject", email.subject),
    ]
    if email.reply_to:
        lines.append(_address_header("Reply-To", email.reply_to))
    lines.append(_header("X-Emailhub-Message", str(email.message_id)))
    for name, value in email.headers.items():
        lines.append(_header(name, value))
    lines.append(b"MIME-Version: 1.0")
    text = email.text or ("" if not email.html else "This message is best viewed in an HTML mail client.")
    if not email.html and not email.attachments:
        body = _part("text/plain", text)
        return message_id, CRLF.join(lines) + CRLF + body + CRLF
    # The entity's own Content-Type ends the message's headers; a blank line, then its parts.
    return message_id, CRLF.join(lines) + CRLF + _entity(email, text)


def _entity(email: OutgoingEmail, text: str) -> bytes:
    """The message's body as one MIME entity (its Content-Type header, a blank line, its body):

        multipart/mixed                      when there are attachments (not inline)
          multipart/alternative              when there is HTML
            text/plain
            multipart/related; type=text/html   when inline images go with the HTML
              text/html
              image/png (Content-ID)         each inline attachment
          application/pdf                    each other attachment

    Without HTML, an attachment with a content id has nothing to be inline in: it goes in the
    multipart/mixed like the others, still with its Content-ID and `inline` disposition."""
    content = _part("text/plain", text)
    attached = list(email.attachments)
    if email.html:
        html = _part("text/html", email.html)
        inline = [a for a in attached if a.content_id]
        if inline:
            # RFC 2387 §3.1: `type` names the root part's type.
            html = _multipart("related", [html, *map(_attachment_part, inline)], ';\r\n type="text/html"')
            attached = [a for a in attached if not a.content_id]
        content = _multipart("alternative", [content, html])
    if not attached:
        return content
    return _multipart("mixed", [content, *map(_attachment_part, attached)])


def _multipart(subtype: str, parts: list[bytes], parameters: str = "") -> bytes:
    boundary = f"=_emailhub_{uuid.uuid4().hex}"
    delimiter = f"--{boundary}".encode("ascii")
    # Folded before the boundary: the line stays within RFC 5322's 78 characters.
    head = f'Content-Type: multipart/{subtype};\r\n boundary="{boundary}"{parameters}'.encode("ascii")
    return (
        head + CRLF + CRLF
        + b"".join(delimiter + CRLF + part + CRLF for part in parts)
        + delimiter + b"--" + CRLF
    )  # fmt: skip


def _attachment_part(attachment: Attachment) -> bytes:
    """An attachment as a base64 body part (RFC 2045 §6.8: lines of at most 76 characters)."""
    disposition = "inline" if attachment.content_id else "attachment"
    head = [
        f"Content-Type: {attachment.content_type}{_parameter('name', attachment.filename)}",
        f"Content-Disposition: {disposition}{_parameter('filename', attachment.filename)}",
        "Content-Transfer-Encoding: base64",
    ]
    if attachment.content_id:
        head.append(f"Content-ID: <{attachment.content_id}>")
    # encodebytes writes 76-character lines, each ending in LF (the last one too).
    body = base64.encodebytes(attachment.content).rstrip(b"\n").replace(b"\n", CRLF)
    return "\r\n".join(head).encode("ascii") + CRLF + CRLF + body


# A quoted-string parameter that every client reads: printable ASCII, nothing to escape, short
# enough for its line.
_PLAIN_PARAMETER = re.compile(r"[ -!#-\[\]-~]{1,60}")
# RFC 2231 continuation pieces of at most 55 characters keep ` filename*0*=utf-8''` and its
# piece within the 78-character line RFC 5322 recommends.
_PIECE_LENGTH = 55
_ENCODED_CHARACTER = re.compile(r"%[0-9A-F]{2}|[^%]")


def _parameter(name: str, value: str) -> str:
    """`; name="value"` on a folded line of its own; a name that a quoted-string cannot carry
    (non-ASCII, a quote, longer than a line) is percent-encoded UTF-8 per RFC 2231 (§4), in
    numbered pieces (§3) when it is long."""
    if _PLAIN_PARAMETER.fullmatch(value):
        return f';\r\n {name}="{value}"'
    # quote() leaves letters, digits and _.-~ as they are: all RFC 2231 attribute-chars.
    encoded = quote(value, safe="")
    if len(encoded) <= _PIECE_LENGTH:
        return f";\r\n {name}*=utf-8''{encoded}"
    pieces = [""]
    for character in _ENCODED_CHARACTER.findall(encoded):  # a %XX escape is never split
        if len(pieces[-1]) + len(character) > _PIECE_LENGTH:
            pieces.append("")
        pieces[-1] += character
    charset = "utf-8''"  # on the first piece only (§4.1)
    return "".join(
        f";\r\n {name}*{index}*={charset if index == 0 else ''}{piece}" for index, piece in enumerate(pieces)
    )
