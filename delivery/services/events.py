"""Recording what providers and recipients report after sending: events, once, and their
consequences (suppressions and campaign feedback counters).

Every source (the SES and SendGrid webhooks, `ingest_bounces` for SMTP DSNs, the one-click
unsubscribe endpoint) turns what it received into `ProviderEvent`s and calls `record_events`
once per request. The batch is written by ONE set-based statement, `INSERT … SELECT FROM
unnest(…) ON CONFLICT (provider, provider_event_id) DO NOTHING RETURNING`, which also resolves
each event's message (by our id, else by the provider's message id). Only the rows really
inserted have consequences, so a replayed webhook (providers retry until they see a 2xx) changes
nothing.

Consequences, per inserted event (the rule is `consequence_of`):

- bounced + permanent, or dropped/rejected + permanent (the source sets `bounce="permanent"`
  on a SendGrid drop whose reason is a bounced or invalid address): suppress the address
  (`bounced`) and count the message in its campaign's `bounced_count`;
- complained: suppress (`complained`), `complained_count`;
- unsubscribed: suppress (`unsubscribed`), `unsubscribed_count`. An `unsubscribed`
  suppression stops marketing mail only (campaigns.selectors.suppressed_sql);
- everything else (delivered, a transient bounce, deferred, delayed, opened, clicked, a drop or
  reject that is not about the address): recorded, no consequence.

A campaign counter moves once per message and category, however many events report it (SES and
a DSN for the same bounce, a click on the unsubscribe link twice). A message's own status does
not change: a `sent` message that later hard-bounces stays `sent` (it was handed over; the
bounce is an event about it), so MessageStatus and the campaign's sent/failed/suppressed counts
keep meaning "what emailhub did". Messages still queued to a suppressed address become
`suppressed` when a worker claims them (the claim checks the suppression list).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from campaigns.models import Suppression
from campaigns.progress import move_feedback_counters
from campaigns.suppressions import stronger, suppress
from core import metrics, outbound_events
from core.validators import json_storage_problem, unstorable_reason
from delivery.exceptions import InvalidEvent
from delivery.models import EmailEvent
from delivery.services import transitions
from delivery.services.event_classes import ENGAGEMENT_KINDS, classes_of
from delivery.services.transitions import record_first_engagement

Kind = EmailEvent.Kind

# Provider names used in EmailEvent.provider by the event sources.
PROVIDERS = ("ses", "sendgrid", "smtp", "emailhub")

# EmailEvent.provider_event_id and recipient columns' sizes. An id is never cut (two ids sharing
# a 255-character prefix would collide and one event would be lost): sources pass what the
# provider gave through `storable_event_id`, which hashes a longer one; record_events refuses it.
EVENT_ID_MAX_CHARS = 255
# RFC 5321 §4.5.3.1.3: a path is at most 256 octets with its angle brackets, so no deliverable
# address is longer (Message.to_email and Suppression.email have the same size).
RECIPIENT_MAX_CHARS = 254
# EmailEvent.detail is free text from a provider (a DSN's diagnostic can be long); keep rows small.
DETAIL_MAX_CHARS = 2000
# How deep a payload may nest: json.dumps of it (in `_columns`) recurses once per level and runs
# out of stack near 1,000; a provider's events nest a few levels (SES: Message → bounce →
# bouncedRecipients → entry).
MAX_JSON_DEPTH = 64

# Why `unusable` says the provider's data in an event cannot be stored (metric label values).
RECIPIENT_TOO_LONG = "recipient_too_long"
UNSTORABLE = "unstorable"

# The three feedback categories: the suppression reason and the campaign counter they move.
BOUNCED = Suppression.Reason.BOUNCED.value
COMPLAINED = Suppression.Reason.COMPLAINED.value
UNSUBSCRIBED = Suppression.Reason.UNSUBSCRIBED.value


@dataclass(frozen=True)
class ProviderEvent:
    """One thing a provider (or a recipient) reported about one message and one recipient."""

    provider: str  # "ses", "sendgrid", "smtp" (DSN), "emailhub" (our unsubscribe link)
    event_id: str  # unique per provider and per recipient: the dedup key
    kind: str  # an EmailEvent.Kind value
    occurred_at: datetime  # aware, UTC
    # Our Message id when known (SendGrid custom_args emailhub_id, the X-Emailhub-Message
    # header, SES mail.headers). An id that matches no message is treated as unknown.
    message_id: int | None = None
    provider_message_id: str | None = None  # fallback lookup (Message.provider_message_id)
    recipient: str = ""  # the address concerned; lower-cased here; the message's if empty
    bounce: str = ""  # EmailEvent.Bounce: "permanent" | "transient" | ""
    detail: str = ""  # subtype / diagnostic / complaint type, human readable
    payload: dict[str, Any] = field(default_factory=dict)  # the provider's event (as received)
    # Opens and clicks only: who made the hit (delivery/tracking/classify.py). A source that
    # knows the class sets it; otherwise record_events classifies from these three fields.
    classification: str = ""
    user_agent: str = ""
    ip: str = ""
    machine_open: bool = False  # SendGrid's sg_machine_open


@dataclass(frozen=True)
class RecordedEvents:
    received: int  # events in the batch
    new: int  # events inserted (the rest were already recorded: duplicates)
    duplicates: int
    suppressed: int  # distinct addresses this batch asked to suppress (new events only)
    unmatched: int  # new events that matched no message (kept, with the recipient)


def storable_event_id(value: str) -> str:
    """A provider's event id as EmailEvent.provider_event_id: itself when it fits the column and
    PostgreSQL can store it, else `hashed_event_id` of it. The same input always gives the same
    id, so a provider's retry of the event is still a duplicate."""
    if len(value) <= EVENT_ID_MAX_CHARS and unstorable_reason(value) is None:
        return value
    return hashed_event_id(value)


def hashed_event_id(text: str) -> str:
    """The id `sha256:<hex SHA-256 of text>` (71 characters): for ids too long to store (an SES
    `MessageId:recipient` with a 254-character address is 291) and for events that carry no id
    of their own (their canonical JSON). surrogatepass: two different texts, even with lone
    surrogates (a DSN's undecodable bytes), never hash alike."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def unusable(event: ProviderEvent) -> tuple[str, str] | None:
    """(reason, why) when what the provider reported cannot be stored as `event`, else None: an
    address longer than any deliverable one (RECIPIENT_TOO_LONG), or (UNSTORABLE) text
    PostgreSQL refuses (U+0000, a lone surrogate) or a payload jsonb refuses (NaN, Infinity) or
    nested past MAX_JSON_DEPTH. A webhook skips such an event and records the others
    (delivery.webhooks.base.EventBatch); record_events refuses it. `why` never quotes the data."""
    if len(event.recipient) > RECIPIENT_MAX_CHARS:
        return (
            RECIPIENT_TOO_LONG,
            f"the address is {len(event.recipient)} characters, more than {RECIPIENT_MAX_CHARS}",
        )
    for name in ("event_id", "recipient", "detail", "provider_message_id"):  # the text columns
        reason = unstorable_reason(getattr(event, name) or "")
        if reason:
            return UNSTORABLE, f"its {name} {reason}"
    problem = json_storage_problem(event.payload, max_depth=MAX_JSON_DEPTH)
    if problem:
        return UNSTORABLE, f"its payload: {problem}"
    return None


def consequence_of(kind: str, bounce: str) -> str | None:
    """The feedback category (a Suppression.Reason) an event of `kind`/`bounce` has, or None."""
    permanent = bounce == EmailEvent.Bounce.PERMANENT
    if kind in (Kind.BOUNCED, Kind.DROPPED, Kind.REJECTED) and permanent:
        return BOUNCED
    if kind == Kind.COMPLAINED:
        return COMPLAINED
    if kind == Kind.UNSUBSCRIBED:
        return UNSUBSCRIBED
    return None


# The same rule as SQL over an EmailEvent row aliased `e`, for the "already counted" check.
_CATEGORY_SQL = """
CASE WHEN e.kind IN ('bounced', 'dropped', 'rejected') AND e.bounce = 'permanent' THEN 'bounced'
     WHEN e.kind = 'complained' THEN 'complained'
     WHEN e.kind = 'unsubscribed' THEN 'unsubscribed'
END
""".strip()

# One statement for the whole batch. `resolved` finds each event's message by our id, else by
# the provider's message id (the newest message with it; COALESCE evaluates the second lookup
# only when the first found nothing). ON CONFLICT names the partial unique index's predicate
# so PostgreSQL can infer it. The outer SELECT adds the campaign of each inserted row.
# The outbound event of each new event of a message of ours (core.outbound_events): the
# message's data (transitions.MESSAGE_DATA_SQL) and the event's own fields: what the provider
# (or our tracking) reported, the bounce type, an open's or a click's class (and whether that is
# a person), a click's URL (cut to 2,048 characters).
_FEEDBACK_TYPE = """CASE kind WHEN 'delivered' THEN 'message.delivered' WHEN 'deferred' THEN 'message.deferred'
    WHEN 'delayed' THEN 'message.deferred' WHEN 'bounced' THEN 'message.bounced'
    WHEN 'dropped' THEN 'message.rejected' WHEN 'rejected' THEN 'message.rejected'
    WHEN 'complained' THEN 'message.complained' WHEN 'opened' THEN 'message.opened'
    WHEN 'clicked' THEN 'message.clicked' WHEN 'unsubscribed' THEN 'contact.unsubscribed' END"""
_FEEDBACK_DATA = (
    transitions.MESSAGE_DATA_SQL
    + """ || jsonb_strip_nulls(jsonb_build_object(
    'event', kind, 'source', source, 'recipient', recipient,
    'bounce', NULLIF(bounce, ''), 'classification', NULLIF(classification, ''),
    'human', CASE WHEN kind IN ('opened', 'clicked') THEN classification = 'human' END,
    'url', CASE WHEN kind = 'clicked' THEN NULLIF(left(detail, 2048), '') END,
    'detail', CASE WHEN kind <> 'clicked' THEN NULLIF(left(detail, 1000), '') END))"""
)
_ANNOUNCE = outbound_events.insert_sql(
    f"""(SELECT {transitions.EVENT_COLUMNS},
               ins.kind, ins.provider AS source, ins.recipient, ins.bounce,
               ins.classification, ins.detail, ins.occurred_at
          FROM inserted AS ins JOIN delivery_message AS m ON m.id = ins.message_id) AS f""",
    type_sql=_FEEDBACK_TYPE,
    owner_sql="api_key_id",
    data_sql=_FEEDBACK_DATA,
    at_sql="occurred_at",
    message_sql="id",
)

_INSERT_SQL = f"""
WITH incoming AS (
    SELECT *
      FROM unnest(%(provider)s::text[], %(event_id)s::text[], %(kind)s::text[],
                  %(occurred_at)s::timestamptz[], %(message_id)s::bigint[],
                  %(provider_message_id)s::text[], %(recipient)s::text[], %(bounce)s::text[],
                  %(detail)s::text[], %(payload)s::jsonb[], %(classification)s::text[])
           WITH ORDINALITY AS i(provider, event_id, kind, occurred_at, message_id,
                                provider_message_id, recipient, bounce, detail, payload,
                                classification, n)
), resolved AS (
    SELECT i.*, COALESCE(
               (SELECT m.id FROM delivery_message AS m WHERE m.id = i.message_id),
               (SELECT m.id FROM delivery_message AS m
                 WHERE i.provider_message_id IS NOT NULL
                   AND m.provider_message_id = i.provider_message_id
                 ORDER BY m.id DESC LIMIT 1)
           ) AS resolved_id
      FROM incoming AS i
), inserted AS (
    INSERT INTO delivery_emailevent
           (message_id, kind, provider, provider_event_id, recipient, bounce, detail,
            occurred_at, payload, created_at, classification)
    SELECT r.resolved_id, r.kind, r.provider, r.event_id,
           COALESCE(NULLIF(r.recipient, ''),
                    (SELECT lower(m.to_email) FROM delivery_message AS m WHERE m.id = r.resolved_id),
                    ''),
           r.bounce, r.detail, r.occurred_at, r.payload, now(),
           -- NOT NULL with no database default (Django's AddField drops it): a raw INSERT names it.
           r.classification
      FROM resolved AS r
     ORDER BY r.n
    ON CONFLICT (provider, provider_event_id) WHERE provider_event_id IS NOT NULL DO NOTHING
    RETURNING id, message_id, kind, recipient, bounce, detail, classification, occurred_at, provider
), announced AS (
    {_ANNOUNCE}
)
SELECT ins.id, ins.message_id, m.campaign_id, ins.kind, ins.recipient, ins.bounce, ins.detail,
       ins.classification, ins.occurred_at, ins.provider, (SELECT count(*) FROM announced)
  FROM inserted AS ins
  LEFT JOIN delivery_message AS m ON m.id = ins.message_id
"""

# Which (message, category) pairs were already reported by events other than this batch's.
_ALREADY_COUNTED_SQL = f"""
SELECT DISTINCT e.message_id, {_CATEGORY_SQL}
  FROM delivery_emailevent AS e
 WHERE e.message_id = ANY(%s) AND NOT (e.id = ANY(%s))
"""

# First key of the two-key advisory lock space for feedback counting ("EVT"); the second is the
# campaign id. Two requests reporting the same message concurrently would otherwise each see no
# earlier event of the other (not yet committed) and both count it.
LOCK_CLASS = 0x455654


def _classified(events: list[ProviderEvent]) -> list[ProviderEvent]:
    """Every open and click with its class: the source's, or delivery/services/event_classes.py's."""
    classes = classes_of(events)
    return [replace(e, classification=classes[i]) if i in classes else e for i, e in enumerate(events)]


def _validated(event: ProviderEvent) -> ProviderEvent:
    if event.kind not in Kind.values:
        raise InvalidEvent(f"unknown event kind {event.kind!r}")
    if event.bounce not in EmailEvent.Bounce.values:
        raise InvalidEvent(f"unknown bounce type {event.bounce!r}")
    if not event.provider or len(event.provider) > 20:
        raise InvalidEvent(f"bad provider {event.provider!r}")
    if not event.event_id or len(event.event_id) > EVENT_ID_MAX_CHARS:
        raise InvalidEvent(f"event id must be 1 to {EVENT_ID_MAX_CHARS} characters")
    problem = unusable(event)
    if problem is not None:
        raise InvalidEvent(problem[1])
    if event.occurred_at.tzinfo is None or event.occurred_at.utcoffset() is None:
        raise InvalidEvent("occurred_at must be timezone-aware")
    if event.classification not in EmailEvent.Classification.values:
        raise InvalidEvent(f"unknown classification {event.classification!r}")
    if event.classification and event.kind not in ENGAGEMENT_KINDS:
        raise InvalidEvent("only opens and clicks are classified")
    if event.message_id is not None and not 0 < event.message_id < 2**63:
        # Not a message of ours (a forged or foreign custom arg): look up by provider id instead.
        return ProviderEvent(**{**event.__dict__, "message_id": None})
    return event


def _columns(events: Sequence[ProviderEvent]) -> dict[str, list[Any]]:
    return {
        "provider": [e.provider for e in events],
        "event_id": [e.event_id for e in events],
        "kind": [e.kind for e in events],
        "occurred_at": [e.occurred_at for e in events],
        "message_id": [e.message_id for e in events],
        "provider_message_id": [e.provider_message_id or None for e in events],
        "recipient": [e.recipient.strip().lower() for e in events],
        "bounce": [e.bounce for e in events],
        "detail": [e.detail[:DETAIL_MAX_CHARS] for e in events],
        # json.dumps with default=str: a payload is what the provider sent, already JSON; the
        # default only guards against a datetime a source put in.
        "payload": [json.dumps(e.payload, default=str) for e in events],
        "classification": [e.classification for e in events],
    }


# A row `_INSERT_SQL` returns, one per event of the batch really inserted (not a duplicate):
# (id, message_id or None when unmatched, campaign_id or None, kind, recipient, bounce, detail,
# classification, occurred_at, provider). Plain tuples, unpacked in each step rather than made
# into NamedTuples: building one per row made these steps 25-40% slower (1.6 → 2.0-2.2 ms for
# 1,000 rows, measured in-process).
_Inserted = tuple[int, int | None, int | None, str, str, str, str, str, datetime, str]


def record_events(events: Sequence[ProviderEvent]) -> RecordedEvents:
    """Record a batch once, in one transaction, and apply the consequences of the new events.

    Raises InvalidEvent (nothing written) if any event is malformed.
    """
    batch = _classified([_validated(e) for e in events])
    if not batch:
        return RecordedEvents(received=0, new=0, duplicates=0, suppressed=0, unmatched=0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, _columns(batch))
        returned = cursor.fetchall()
        outbound_events.ring_after_commit(returned[0][-1] if returned else 0)
        inserted: list[_Inserted] = [row[:-1] for row in returned]
        to_suppress, counted = _feedback(inserted)
        _count_feedback(cursor, counted, [row[0] for row in inserted])
        opened, clicked = _first_engagement(inserted)
        record_first_engagement(opened, clicked)
        _suppress_all(to_suppress)
        received, engagement = _event_counts(batch, inserted)
        # After the commit: a batch rolled back (and retried by the provider) counts once.
        transaction.on_commit(lambda: metrics.count_events(received, engagement))

    new = len(inserted)
    return RecordedEvents(
        received=len(batch),
        new=new,
        duplicates=len(batch) - new,
        suppressed=len(to_suppress),
        unmatched=sum(1 for row in inserted if row[1] is None),
    )


def _feedback(inserted: list[_Inserted]) -> tuple[dict[str, tuple[str, str]], dict[tuple[int, str], int]]:
    """The consequences (`consequence_of`) of the inserted events: address → (reason, detail) to
    suppress, the strongest reason, else the first; and (message, category) → campaign to count."""
    to_suppress: dict[str, tuple[str, str]] = {}
    counted: dict[tuple[int, str], int] = {}
    for _, message_id, campaign_id, kind, recipient, bounce, detail, _, _, _ in inserted:
        category = consequence_of(kind, bounce)
        if category is None:
            continue
        if recipient:
            # One batch may bounce and unsubscribe the same address: the bounce wins.
            earlier = to_suppress.get(recipient)
            if earlier is None or stronger(earlier[0], category) != earlier[0]:
                to_suppress[recipient] = (category, detail)
        if message_id is not None and campaign_id is not None:
            counted[(message_id, category)] = campaign_id
    return to_suppress, counted


def _count_feedback(cursor: CursorWrapper, counted: dict[tuple[int, str], int], new_ids: list[int]) -> None:
    """Move the campaigns' feedback counters for the (message, category) pairs in `counted` that
    no event outside this batch (`new_ids`) reported already, under each campaign's advisory lock
    (LOCK_CLASS). Drops the pairs already counted from `counted`."""
    if not counted:
        return
    campaigns = sorted(set(counted.values()))  # a fixed order: no deadlocks
    for campaign_id in campaigns:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, campaign_id])
    cursor.execute(_ALREADY_COUNTED_SQL, [sorted({m for m, _ in counted}), new_ids])
    for message_id, category in cursor.fetchall():
        counted.pop((message_id, category), None)
    feedback: Counter[tuple[int, str]] = Counter(
        (campaign_id, category) for (_, category), campaign_id in counted.items()
    )
    move_feedback_counters(feedback)


def _first_engagement(inserted: list[_Inserted]) -> tuple[dict[int, datetime], dict[int, datetime]]:
    """The earliest human open and click of each message among the inserted events, for
    record_first_engagement."""
    opened: dict[int, datetime] = {}
    clicked: dict[int, datetime] = {}
    for _, message_id, _, kind, _, _, _, cls, at, _ in inserted:
        if cls == EmailEvent.Classification.HUMAN and message_id is not None:
            # A person's click is also an open: images may be blocked, the link was read.
            opened[message_id] = min(at, opened.get(message_id, at))
            if kind == Kind.CLICKED:
                clicked[message_id] = min(at, clicked.get(message_id, at))
    return opened, clicked


def _suppress_all(to_suppress: dict[str, tuple[str, str]]) -> None:
    """Suppress the addresses: one `suppress` per reason, the reasons in a fixed order."""
    by_reason: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for address, (reason, detail) in to_suppress.items():
        by_reason[reason].append((address, detail))
    for reason, addresses in sorted(by_reason.items()):
        suppress(addresses, reason)


def _event_counts(
    batch: list[ProviderEvent], inserted: list[_Inserted]
) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str, str]]]:
    """metrics.count_events' figures: the batch's events by (provider, kind, "new" or
    "duplicate"), and the inserted opens and clicks by (provider, kind, classification)."""
    received: Counter[tuple[str, str, str]] = Counter((e.provider, e.kind, "duplicate") for e in batch)
    engagement: Counter[tuple[str, str, str]] = Counter()
    for _, _, _, kind, _, _, _, cls, _, provider in inserted:
        received[(provider, kind, "duplicate")] -= 1
        received[(provider, kind, "new")] += 1
        if kind in ENGAGEMENT_KINDS:
            engagement[(provider, kind, cls)] += 1
    return received, engagement
