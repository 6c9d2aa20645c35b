"""Outbound events: what an application hears of by its webhook endpoints, written with the change.

A statement that moves rows an application may care about (a message sent, bounced, opened, a
campaign completed) records the events in the same statement, one CTE over the rows it moved:

    WITH moved AS (UPDATE delivery_message … RETURNING …),
         announced AS ({insert_sql("moved", type_sql=…, owner_sql=…, data_sql=…)})
    SELECT …, (SELECT count(*) FROM announced) FROM moved

So an event exists exactly when its change committed (none for a change rolled back, none lost to
a process killed after the commit), and a batch of 500 sends writes its events in one statement.
A row is written only when some enabled endpoint wants it. `emailhub_event_interest()` is a SQL
function the outbound app defines over its endpoints (core names no app's table; until the app's
migration runs it answers nobody): the `owner:type` keys wanted, `*` for any. A statement reads
it once, not per row: with no endpoint the moved rows are never read again; with some, each
row costs an array overlap.

The table is its own outbox: after the commit the writer rings the dispatcher's doorbell
(`ring_after_commit`), and the outbound app's beat tick dispatches whatever a lost ring left.
`take` is the dispatcher's claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import connection
from django.db.models import Min

from core import outbox
from core.models import OutboundEvent

# The vocabulary, django-anymail's normalised event types under `message.`, plus two of our own.
TYPES = (
    "message.queued",  # accepted (now or for later)
    "message.sent",  # accepted by a provider
    "message.delivered",
    "message.deferred",  # waiting to be tried again (by us, or by the provider)
    "message.bounced",
    "message.complained",
    "message.rejected",  # refused by the provider before sending
    "message.failed",  # given up: a permanent error, or every attempt used
    "message.suppressed",  # not sent: the address is on the suppression list
    "message.cancelled",
    "message.opened",
    "message.clicked",
    "contact.unsubscribed",
    "campaign.completed",
)

# The outbox kind of the dispatcher's doorbell; the outbound app registers its task for it.
DISPATCH_KIND = "outbound.dispatch"

# An instant as Standard Webhooks' examples write it: RFC 3339, UTC, microseconds.
_ISO = """to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def iso_sql(at: str) -> str:
    """`at` (a timestamptz SQL expression) as RFC 3339 text in UTC."""
    return _ISO.format(at=at)


def insert_sql(
    source: str,
    *,
    type_sql: str,
    owner_sql: str,
    data_sql: str,
    at_sql: str = "clock_timestamp()",
    message_sql: str = "NULL::bigint",
) -> str:
    """An `INSERT … SELECT … RETURNING id` of one event per row of `source` (a CTE or table name)
    that an endpoint wants, to be used as a CTE of the statement that changed those rows. The
    expressions are SQL over `source`'s columns: the event's type (NULL: no event for that row),
    the API key it belongs to, its `data` object (jsonb), when it happened and the message it
    tells of."""
    return f"""INSERT INTO core_outboundevent (type, owner_key_id, message_id, payload)
    SELECT e.type, e.owner, e.message_id,
           jsonb_build_object('type', e.type, 'timestamp', {iso_sql("e.at")}, 'data', e.data)
      -- The interest, read once (OFFSET 0 keeps the subquery from being pulled up, which would
      -- call the function once per row); when it is empty the rows are never read.
      FROM (SELECT emailhub_event_interest() AS keys OFFSET 0) AS i
     CROSS JOIN LATERAL (SELECT {type_sql} AS type, {owner_sql} AS owner, {data_sql} AS data,
                                {at_sql} AS at, {message_sql} AS message_id
                           FROM {source}) AS e
     WHERE cardinality(i.keys) > 0 AND e.type IS NOT NULL
       AND i.keys && ARRAY['*:*', '*:' || e.type, e.owner || ':*', e.owner || ':' || e.type]
    RETURNING id"""


def ring_after_commit(written: int) -> None:
    """Wake the dispatcher once the caller's transaction commits, if it wrote events (a
    statement run in autocommit has committed already: the ring goes at once)."""
    if written:
        outbox.ring_after_commit(DISPATCH_KIND, {})


def take(limit: int) -> list[tuple[int, str, int | None]]:
    """Claim up to `limit` undispatched events, oldest first, in the caller's transaction:
    (id, type, owner key id). Concurrent claimers skip each other's rows; a rollback gives them
    back."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE core_outboundevent SET dispatched = true
             WHERE id IN (SELECT id FROM core_outboundevent WHERE NOT dispatched
                           ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
            RETURNING id, type, owner_key_id
            """,
            [limit],
        )
        return sorted(cursor.fetchall())


def bodies(event_ids: Sequence[int]) -> dict[int, str]:
    """The JSON text of each event, as it is sent and signed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, payload::text FROM core_outboundevent WHERE id = ANY(%s)", [list(event_ids)]
        )
        return dict(cursor.fetchall())


def erase(message_ids: Sequence[int], placeholder: str) -> int:
    """Scrub the events of these messages (a recipient's erasure, in the caller's transaction):
    their address becomes `placeholder`, and what may quote the person (metadata, an error, a
    bounce's detail, a click's URL) goes. An event not delivered yet is sent scrubbed. Returns
    how many events were rewritten."""
    if not message_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE core_outboundevent
               SET payload = jsonb_set(
                       jsonb_set(payload, '{data,to}', to_jsonb(%s::text)),
                       '{data,metadata}', '{}'::jsonb)
                   #- '{data,recipient}' #- '{data,error}' #- '{data,detail}' #- '{data,url}'
             WHERE message_id = ANY(%s)
            """,
            [placeholder, list(message_ids)],
        )
        return cursor.rowcount


def oldest_waiting() -> datetime | None:
    """When the oldest event not yet dispatched was written (None: none waits)."""
    return OutboundEvent.objects.filter(dispatched=False).aggregate(oldest=Min("created_at"))["oldest"]
