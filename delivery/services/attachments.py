"""Attachment contents: every write to `delivery_attachmentcontent`, and the worker's one read.

A content is stored once, keyed by its SHA-256: the messages that attach it name it in their
`attachments` metadata (transitions.NEW_COLUMNS), so a batch of 1,000 messages with the same
PDF writes one row, and a content already stored by an earlier message is not written again.
Rows never change, so neither the accepting INSERT nor the worker's SELECT needs a lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import connection


@dataclass(frozen=True)
class NewAttachment:
    """An attachment as the API gave it, its content decoded once (delivery/api/serializers.py)."""

    filename: str
    content_type: str
    content: bytes
    content_id: str | None = None
    # Hashed once, here: the row's metadata and the content's key both use it.
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", hashlib.sha256(self.content).hexdigest())


def metadata(attachments: Iterable[NewAttachment]) -> list[dict[str, Any]] | None:
    """What a message row stores of its attachments (Message.attachments); None for none."""
    described = [
        {
            "filename": a.filename,
            "content_type": a.content_type,
            "size": len(a.content),
            "sha256": a.sha256,
            "content_id": a.content_id,
        }
        for a in attachments
    ]
    return described or None


_STORE_SQL = """
INSERT INTO delivery_attachmentcontent (sha256, content, size)
SELECT u.sha256, u.content, octet_length(u.content)
  FROM unnest(%s::text[], %s::bytea[]) AS u(sha256, content)
ON CONFLICT (sha256) DO NOTHING
"""


def store_contents(attachments: Iterable[NewAttachment]) -> int:
    """The distinct contents of `attachments` not stored yet, in one INSERT on the caller's
    connection and in its transaction (the messages naming them commit with them). Returns how
    many distinct contents were given (0: no statement ran)."""
    contents: dict[str, bytes] = {}
    for attachment in attachments:
        contents.setdefault(attachment.sha256, attachment.content)
    if contents:
        with connection.cursor() as db:
            db.execute(_STORE_SQL, [list(contents), list(contents.values())])
    return len(contents)


def load_contents(hashes: Iterable[str]) -> Mapping[str, bytes]:
    """The stored contents of these hashes, by hash: one SELECT for a whole batch (none when
    `hashes` is empty). A hash with no row is absent."""
    wanted = sorted(set(hashes))
    if not wanted:
        return {}
    with connection.cursor() as db:
        db.execute("SELECT sha256, content FROM delivery_attachmentcontent WHERE sha256 = ANY(%s)", [wanted])
        return {sha256: bytes(content) for sha256, content in db.fetchall()}
