"""Delivery status notifications (RFC 3464): the bounces of mail sent over SMTP.

An SMTP relay accepts our mail with a 250 and may fail to deliver it hours later; it then mails
a DSN to the envelope sender. No provider webhook reports these, so an operator collects them
in a mailbox and `manage.py ingest_bounces` reads it (an mbox file or a Maildir). This module
is the pure part: bytes in, one `Report` per recipient out; no database, no settings.

A DSN is `multipart/report; report-type=delivery-status` (RFC 6522) whose second part,
`message/delivery-status`, holds one block of per-message fields and then one block per
recipient (`Final-Recipient`, `Action`, `Status`, `Diagnostic-Code`, ...); the third part is the
returned message or just its headers (`message/rfc822` or `text/rfc822-headers`), where our
`X-Emailhub-Message` and `Message-ID` headers name the message that bounced.
"""

from __future__ import annotations

import base64
import binascii
import email
import hashlib
import json
import mailbox
import quopri
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage, Message
from email.parser import HeaderParser
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from delivery.exceptions import NotAMailbox

# RFC 3463 §3.1: the class digit of an enhanced status code. 5 is a permanent failure (the
# address is dead or refuses us), 4 a persistent transient one (mailbox full, greylisted, timed
# out): only 5 may suppress.
_STATUS = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})\b")
_MESSAGE_ID = re.compile(r"<([^<>\s]+)>")


@dataclass(frozen=True)
class Report:
    """What one DSN says about one recipient."""

    event_id: str  # the DSN's id + "/" + the recipient: the dedup key
    dsn_id: str  # the DSN's Message-ID, or a digest of what it reports when it has none
    recipient: str  # Final-Recipient (else Original-Recipient), lower-cased
    action: str  # failed | delayed | delivered | relayed | expanded (RFC 3464 §2.3.3)
    status: str  # the enhanced status code, e.g. "5.1.1"; "" when missing or malformed
    bounce: str  # for a failure: "permanent" (5.x.x) or "transient" (anything else); else ""
    diagnostic: str  # Diagnostic-Code, as the remote MTA said it
    occurred_at: datetime | None  # Last-Attempt-Date, else Arrival-Date, else the DSN's Date
    message_id: int | None  # our id, from the returned X-Emailhub-Message header
    original_message_id: str | None  # the returned Message-ID, without angle brackets
    fields: dict[str, str]  # the recipient block as received (kept as the event's payload)

    @property
    def kind(self) -> str | None:
        """The EmailEvent kind, or None for an action that says nothing about delivery to us.

        `failed` is a bounce (permanent or transient by its status), `delayed` a delay (never a
        suppression), `delivered` a success DSN (sent when NOTIFY=SUCCESS was asked for);
        `relayed` and `expanded` only say the mail left a DSN-capable path and are skipped."""
        return {"failed": "bounced", "delayed": "delayed", "delivered": "delivered"}.get(self.action)


def is_dsn(message: Message) -> bool:
    report_type = message.get_param("report-type", header="content-type")
    return (
        message.get_content_type() == "multipart/report"
        and str(report_type or "").lower() == "delivery-status"
    )


def parse(raw: bytes | Message) -> list[Report]:
    """The per-recipient reports of one DSN; [] when the message is not a delivery-status
    report (an auto-reply, spam, a feedback-loop report that reached the bounce address)."""
    message = email.message_from_bytes(raw, policy=policy.default) if isinstance(raw, bytes) else raw
    if not is_dsn(message):
        return []
    status_part = returned = None
    for part in message.walk():
        content_type = part.get_content_type()
        if (
            content_type in ("message/delivery-status", "message/global-delivery-status")
            and status_part is None
        ):
            status_part = part
        elif (
            content_type in ("text/rfc822-headers", "message/rfc822", "message/global-headers")
            and returned is None
        ):
            returned = part
    if status_part is None:
        return []
    blocks = _blocks(status_part)
    if not blocks:
        return []
    per_message, recipients = blocks[0], blocks[1:]
    headers = _returned_headers(returned)
    our_id = _our_id(_clean(headers.get("X-Emailhub-Message", "")))
    original = _bare_message_id(_clean(headers.get("Message-ID", "")))
    dsn_date = _date(_clean(message.get("Date", "")))
    dsn_id = _bare_message_id(_clean(message.get("Message-ID", ""))) or _digest(
        _clean(message.get("Date", "")), original, blocks
    )
    reports = []
    for block in recipients:
        recipient = _address(block.get("Final-Recipient", "")) or _address(
            block.get("Original-Recipient", "")
        )
        if not recipient:
            continue
        status_match = _STATUS.match(block.get("Status", ""))
        status = ".".join(status_match.groups()) if status_match else ""
        action = block.get("Action", "").strip().lower()
        # Only a failure is a bounce; a 5.x.x says the address is dead, anything else (4.x.x: the
        # relay gave up on a transient failure, or no usable status) never suppresses.
        bounce = ("permanent" if status.startswith("5") else "transient") if action == "failed" else ""
        reports.append(
            Report(
                event_id=f"{dsn_id}/{recipient}",
                dsn_id=dsn_id,
                recipient=recipient,
                action=action,
                status=status,
                bounce=bounce,
                diagnostic=_type_and_text(block.get("Diagnostic-Code", ""))[1],
                occurred_at=_date(block.get("Last-Attempt-Date", ""))
                or _date(per_message.get("Arrival-Date", ""))
                or dsn_date,
                message_id=our_id,
                original_message_id=original,
                fields=block,
            )
        )
    return reports


def open_mailbox(path: Path) -> mailbox.Mailbox[Any]:
    """The mbox file or Maildir at `path`; NotAMailbox (saying what was found) otherwise."""
    if path.is_dir():
        if all((path / sub).is_dir() for sub in ("cur", "new", "tmp")):
            return mailbox.Maildir(path, factory=None, create=False)
        raise NotAMailbox(f"{path} is a directory but not a Maildir (it has no cur/, new/ and tmp/)")
    if not path.exists():
        raise NotAMailbox(f"{path} does not exist")
    with path.open("rb") as handle:
        start = handle.read(5)
    # An mbox starts with its first message's "From " separator line (RFC 4155); an empty file
    # is an empty mbox.
    if start and start != b"From ":
        raise NotAMailbox(f"{path} is not an mbox file (it does not start with a 'From ' line)")
    return mailbox.mbox(path, factory=None, create=False)


def read_mailbox(path: Path) -> Iterator[EmailMessage]:
    """Every message of the mbox or Maildir at `path`, parsed, one at a time (never the whole
    mailbox in memory)."""
    box = open_mailbox(path)
    try:
        for key in box.iterkeys():
            with box.get_file(key) as handle:
                yield email.message_from_binary_file(handle, policy=policy.default)  # type: ignore[arg-type]
    finally:
        box.close()


def _blocks(part: Message) -> list[dict[str, str]]:
    """The header blocks of a delivery-status part. The email package parses them into a list
    of Message objects, reading the part's text as it stands; a part sent base64 (some Exchange
    servers do, though RFC 3464 asks for 7bit) is put back together here, decoded and parsed
    block by block. Quoted-printable is decoded the same way, best effort: the package has
    already split its soft line breaks into blocks, so a folded field may be cut short."""
    payload = part.get_payload()
    encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
    if isinstance(payload, list) and encoding not in ("base64", "quoted-printable"):
        return [
            {name: _clean(value) for name, value in block.items()}
            for block in payload
            if isinstance(block, Message)
        ]
    if isinstance(payload, list):
        encoded = "\n".join(b.as_string(policy=policy.compat32) for b in payload if isinstance(b, Message))
    else:
        encoded = str(payload)
    try:
        data = (
            base64.b64decode("".join(encoded.split()))
            if encoding == "base64"
            else quopri.decodestring(encoded.encode("ascii", "replace"))
        )
    except (binascii.Error, ValueError):
        return []
    blocks = re.split(r"\r?\n[ \t]*\r?\n", data.decode("utf-8", "replace").strip())
    parser = HeaderParser(policy=policy.default)
    return [
        {n: _clean(v) for n, v in parser.parsestr(block + "\n").items()} for block in blocks if block.strip()
    ]


def _returned_headers(part: Message | None) -> Message:
    if part is None:
        return Message()
    payload = part.get_payload()
    if isinstance(payload, list) and payload and isinstance(payload[0], Message):
        return payload[0]  # message/rfc822: the returned message itself
    data = part.get_payload(decode=True)
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(payload)
    return HeaderParser(policy=policy.default).parsestr(text)


def _clean(value: object) -> str:
    """Header text safe to store: bytes that were not UTF-8 (kept by the parser as surrogate
    escapes) become U+FFFD, NUL is dropped; PostgreSQL refuses both in text and jsonb."""
    text = str(value).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text.replace("\x00", "")


def _type_and_text(value: str) -> tuple[str, str]:
    """`rfc822; user@example.org` → ("rfc822", "user@example.org") (RFC 3464 §2.3.2)."""
    kind, sep, text = value.partition(";")
    return (kind.strip().lower(), text.strip()) if sep else ("", value.strip())


def _address(value: str) -> str:
    kind, text = _type_and_text(value)
    if kind not in ("", "rfc822", "utf-8"):
        return ""  # an X.400 or other non-Internet address names no contact of ours
    text = text.strip().strip("<>").strip()
    return text.lower() if "@" in text else ""


def _our_id(value: str) -> int | None:
    value = value.strip()
    # isascii: "²".isdigit() is true and int("²") raises (a header anyone can write).
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None


def _bare_message_id(value: str) -> str | None:
    match = _MESSAGE_ID.search(value)
    return match.group(1) if match else (value.strip() or None)


def _date(value: str) -> datetime | None:
    if not value.strip():
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:  # RFC 5322 "-0000": the zone is unknown; read it as UTC
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _digest(*parts: object) -> str:
    """A stable id for a DSN without a Message-ID: the digest of what it reports (its date, the
    returned message's id and every status block), so the same DSN read twice has one id."""
    canonical = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()[:32]
