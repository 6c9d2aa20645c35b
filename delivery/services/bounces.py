"""SMTP bounces: the DSNs of a mailbox (mbox or Maildir) recorded as events.

`manage.py ingest_bounces PATH` is the adapter; `delivery/dsn.py` parses. Each recipient of a
DSN becomes one `ProviderEvent` (provider "smtp", event id = the DSN's Message-ID + the
recipient), recorded by `delivery.services.events.record_events` in batches, so reading the same
mailbox again records nothing twice and has no consequence twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path

from delivery import dsn
from delivery.providers.mime import message_id_for
from delivery.services.events import ProviderEvent, record_events, storable_event_id

PROVIDER = "smtp"
# Events per record_events call: one statement each, and a mailbox of any size never sits in
# memory at once.
BATCH_SIZE = 1000


@dataclass
class IngestSummary:
    messages: int = 0  # messages read from the mailbox
    not_dsn: int = 0  # auto-replies, spam, anything that is not a delivery-status report
    reports: int = 0  # per-recipient reports found in the DSNs
    skipped: int = 0  # reports whose action says nothing about delivery (relayed, expanded)
    new: int = 0
    duplicates: int = 0
    suppressed: int = 0
    unmatched: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # "bounced/permanent" → new or not


def ingest_mailbox(path: Path, *, now: datetime | None = None) -> IngestSummary:
    """Record every DSN of the mbox or Maildir at `path`. Raises dsn.NotAMailbox for a path that
    is neither."""
    received_at = now or datetime.now(UTC)
    summary = IngestSummary()
    box = dsn.open_mailbox(path)  # fails here, before anything is read, for a bad path
    box.close()
    batch: list[ProviderEvent] = []
    for event in _events(dsn.read_mailbox(path), summary, received_at):
        batch.append(event)
        if len(batch) >= BATCH_SIZE:
            _record(batch, summary)
            batch = []
    if batch:
        _record(batch, summary)
    return summary


def events_of(reports: Iterable[dsn.Report], *, received_at: datetime) -> list[ProviderEvent]:
    """The events a DSN's reports become (reports of no delivery kind are left out)."""
    events = []
    for report in reports:
        kind = report.kind
        if kind is None:
            continue
        events.append(
            ProviderEvent(
                provider=PROVIDER,
                # Message-IDs may be up to 998 characters: a longer id is hashed, never cut.
                event_id=storable_event_id(report.event_id),
                kind=kind,
                occurred_at=report.occurred_at or received_at,
                message_id=_trusted_id(report),
                provider_message_id=report.original_message_id,
                recipient=report.recipient,
                bounce=report.bounce,
                detail="; ".join(part for part in (report.status, report.diagnostic) if part),
                payload={"dsn": report.dsn_id, **report.fields},
            )
        )
    return events


def _events(
    messages: Iterator[Message], summary: IngestSummary, received_at: datetime
) -> Iterator[ProviderEvent]:
    for message in messages:
        summary.messages += 1
        reports = dsn.parse(message)
        if not reports:
            summary.not_dsn += 1
            continue
        summary.reports += len(reports)
        events = events_of(reports, received_at=received_at)
        summary.skipped += len(reports) - len(events)
        for event in events:
            key = f"{event.kind}/{event.bounce}" if event.bounce else event.kind
            summary.kinds[key] = summary.kinds.get(key, 0) + 1
        yield from events


def _record(batch: list[ProviderEvent], summary: IngestSummary) -> None:
    recorded = record_events(batch)
    summary.new += recorded.new
    summary.duplicates += recorded.duplicates
    summary.suppressed += recorded.suppressed
    summary.unmatched += recorded.unmatched


def _trusted_id(report: dsn.Report) -> int | None:
    """Our message id from the returned X-Emailhub-Message header, unless the returned
    Message-ID contradicts it. Our Message-ID is an HMAC of the id under SECRET_KEY, so a DSN
    that names a message by a header anyone can write is believed only when the unforgeable
    Message-ID agrees (or is absent: some MTAs return only a few headers)."""
    if report.message_id is None:
        return None
    if report.original_message_id is None:
        return report.message_id
    token = message_id_for(report.message_id, "x").strip("<>").split("@")[0]
    return report.message_id if report.original_message_id.split("@")[0].lower() == token else None
