"""The message state machine: every write to `delivery_message` outside migrations is here.

    scheduled → queued → sending → sent | failed | suppressed | cancelled, plus retry_wait

One function per transition, each a set-based conditional statement (`UPDATE … WHERE status =
<expected>`, `INSERT … ON CONFLICT DO NOTHING`) that moves only the rows still in the state the
caller expects and returns exactly the rows it moved. Callers act on those rows only: that is why
a task delivered twice, two workers racing for one batch or two schedulers polling at once move
each message once.

Each function runs on the caller's connection and inside the caller's transaction, so whatever
the caller writes about the moved rows (campaign counters through `campaigns.progress`, outbox
events, the schedule index after commit) commits or rolls back with them. The two republish
walks are the exception: they run their own keyset steps, one transaction each, and record the
send events themselves.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper

from campaigns.models import Campaign, Priority
from campaigns.selectors import (
    AUDIENCE_STEP_CTES,
    WindowPlan,
    audience_step_ctes,
    best_hour_sql,
    campaign_status_sql,
    campaign_tags_sql,
    holdout_sql,
    suppressed_sql,
)
from core import outbound_events
from core.metrics import NO_PROVIDER
from core.sql import literals
from delivery.models import MessageStatus
from delivery.services import send_tasks

logger = logging.getLogger(__name__)

# The statuses the statements below name, as SQL literals from the models' enums (core.sql):
# `{MSG.QUEUED}` is `'queued'`. Formatted into the statements' text rather than passed as
# parameters: PostgreSQL receives the same statements as when they were written out by hand.
MSG = literals(MessageStatus)
CAMPAIGN = literals(Campaign.Status)
PRIORITY = literals(Priority)

# --- outbound events (core.outbound_events): what a move tells the application -----------------

# The columns of a moved row that its event is made of (MESSAGE_DATA_SQL reads them): a statement
# returns them into a CTE (`moved`, `inserted`, `created`) and `_announce` writes the events from
# it, in the same statement as the move. events.py selects them for its feedback events.
EVENT_COLUMNS = (
    "m.id, m.api_key_id, m.to_email, m.status, m.priority, m.provider, m.provider_message_id, "
    "m.campaign_id, m.tags, m.metadata, m.attempts, m.last_error, m.due_at"
)
# A row's event type from the status it reached: `retry_wait` is waiting to be tried again, a
# `scheduled` message is queued for later; the rest are named by their status.
_TYPE_OF_STATUS = f"""CASE status WHEN {MSG.RETRY_WAIT} THEN 'message.deferred'
                                WHEN {MSG.SCHEDULED} THEN 'message.queued'
                                ELSE 'message.' || status END"""
# What an application is told of a message: who, where it is, its tags and metadata (as given at
# accept, echoed on every event; a campaign's message has its campaign's tags), its last error
# cut to 1,000 characters. Under 20 kB with the limits on tags and metadata (outbound/checks.py).
MESSAGE_DATA_SQL = (
    """jsonb_build_object(
    'message_id', id, 'to', to_email, 'status', status, 'priority', priority,
    'provider', provider, 'provider_message_id', provider_message_id, 'campaign_id', campaign_id,
    'tags', coalesce(tags, """
    + campaign_tags_sql("campaign_id")
    + """, '[]'::jsonb), 'metadata', coalesce(metadata, '{}'::jsonb),
    'attempts', attempts, 'error', left(last_error, 1000),
    'due_at', """
    + outbound_events.iso_sql("due_at")
    + """)"""
)


def _announce(source: str, type_sql: str = _TYPE_OF_STATUS) -> str:
    """The CTE body that records an outbound event for each row of `source` (which holds
    EVENT_COLUMNS), typed by the status each reached unless `type_sql` says otherwise."""
    return outbound_events.insert_sql(
        source, type_sql=type_sql, owner_sql="api_key_id", data_sql=MESSAGE_DATA_SQL, message_sql="id"
    )


# --- accept -------------------------------------------------------------------------------------


# The columns a batch of new messages gives (the rest take their defaults), with their SQL types.
NEW_COLUMNS = {
    "template_id": "bigint",
    "to_email": "text",
    "cc": "jsonb",
    "bcc": "jsonb",
    "from_email": "text",
    "reply_to": "text",
    "subject": "text",
    "html": "text",
    "text": "text",
    "context": "jsonb",
    "list_unsubscribe": "boolean",
    "track_opens": "boolean",
    "track_clicks": "boolean",
    "test_send_by": "text",
    "tags": "jsonb",
    "metadata": "jsonb",
    "headers": "jsonb",
    "attachments": "jsonb",
    "priority": "text",
    "status": "text",
    "due_at": "timestamptz",
    "queued_at": "timestamptz",
    "idempotency_key": "text",
    "request_fingerprint": "text",
}
# Positions of the jsonb columns in NEW_COLUMNS: their values travel as JSON text.
_JSONB = [index for index, kind in enumerate(NEW_COLUMNS.values()) if kind == "jsonb"]
_INSERT_MANY_SQL = f"""
WITH inserted AS (
INSERT INTO delivery_message AS m (api_key_id, {", ".join(NEW_COLUMNS)})
SELECT %s, {", ".join(f"u.{name}::{kind}" if kind == "jsonb" else f"u.{name}" for name, kind in NEW_COLUMNS.items())}
  FROM unnest({", ".join(f"%s::{'text' if kind == 'jsonb' else kind}[]" for kind in NEW_COLUMNS.values())})
       AS u({", ".join(NEW_COLUMNS)})
ON CONFLICT (api_key_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {EVENT_COLUMNS}, m.idempotency_key
), announced AS ({_announce("inserted")})
SELECT id, idempotency_key FROM inserted
"""


def insert_many(api_key_id: int | None, rows: Sequence[dict[str, Any]]) -> list[tuple[int, str | None]]:
    """New transactional messages (NEW_COLUMNS of each, `queued` or `scheduled`) in one
    `INSERT … SELECT FROM unnest(…)`; a row whose idempotency key this API key already used is
    skipped (ON CONFLICT DO NOTHING: a concurrent insert of the key is waited for).

    Returns (id, idempotency_key) of the rows inserted, in the order given (PostgreSQL returns
    an INSERT … SELECT's rows in insertion order, which Django's bulk_create relies on too).
    """
    if not rows:
        return []
    columns: list[list[Any]] = [[] for _ in NEW_COLUMNS]
    for row in rows:
        for values, name in zip(columns, NEW_COLUMNS, strict=True):
            values.append(row[name])
    for index in _JSONB:
        columns[index] = [None if value is None else json.dumps(value) for value in columns[index]]
    with connection.cursor() as db:
        db.execute(_INSERT_MANY_SQL, [api_key_id, *columns])
        return db.fetchall()


# One message: the same columns, VALUES instead of unnest (built once, not by Django's compiler
# per request: 12% of the accept path's CPU in py-spy).
_INSERT_ONE_SQL = f"""
INSERT INTO delivery_message AS m (api_key_id, {", ".join(NEW_COLUMNS)})
VALUES (%s, {", ".join("%s::jsonb" if kind == "jsonb" else "%s" for kind in NEW_COLUMNS.values())})
ON CONFLICT (api_key_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {EVENT_COLUMNS}, m.created_at
"""
# Where insert_one's caller runs the INSERT in a statement of its own (with its send task, through
# `run`), the event's CTE goes with it; alone, it is wrapped here.
ANNOUNCE_INSERTED = _announce("inserted")
_INSERT_ONE_ALONE_SQL = (
    f"WITH inserted AS ({_INSERT_ONE_SQL}), announced AS ({ANNOUNCE_INSERTED}) SELECT * FROM inserted"
)
_CREATED_AT = len(EVENT_COLUMNS.split(","))  # the position of created_at in the returned row


def insert_one(
    api_key_id: int | None,
    row: dict[str, Any],
    *,
    run: Callable[[str, Sequence[Any], str], tuple[Any, ...] | None] | None = None,
) -> tuple[int, datetime] | None:
    """A new transactional message (NEW_COLUMNS, `queued` or `scheduled`): one INSERT, skipped
    (None) when this API key used its idempotency key before; else its (id, created_at).

    `run` executes the `INSERT … RETURNING` in place of a plain cursor: accepting a message runs
    it inside the statement that also records its send task (send_tasks.insert_with_send), which
    must add its third argument (the message.queued event's CTE body) after it.
    """
    params = [api_key_id, *(row[name] for name in NEW_COLUMNS)]
    for index in _JSONB:
        if params[1 + index] is not None:
            params[1 + index] = json.dumps(params[1 + index])
    if run is not None:
        inserted = run(_INSERT_ONE_SQL, params, ANNOUNCE_INSERTED)
    else:
        with connection.cursor() as db:
            db.execute(_INSERT_ONE_ALONE_SQL, params)
            inserted = db.fetchone()
    return None if inserted is None else (inserted[0], inserted[_CREATED_AT])


# --- materialise a campaign's messages (fan-out) ------------------------------------------------


# What a step reports: the new cursor and how many members it looked at (the walk: `members`),
# how many of them matched the campaign's audience before the per-message checks (`matched`:
# `members` itself for a list, the members matching the segment otherwise), the ids it created.
def _result(matched: str) -> str:
    return f"""
SELECT (SELECT max(contact_id) FROM members),
       (SELECT count(*) FROM members),
       (SELECT count(*) FROM {matched}),
       (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM created)
"""


# A member this campaign already has a message for gets none: an anti-join, not ON CONFLICT DO
# NOTHING, whose speculative insertion cost 15–18% of a step (a step of 20,000 rows: 166 ms with
# it, 137 ms with the anti-join, four runs each on bench/fanout.py's data; the whole list's steps,
# 8 rounds: backend CPU 2.10 → 1.80 s). Exact because only fan-out inserts campaign messages and
# a campaign's steps run one at a time under its advisory lock (campaigns.fanout);
# UNIQUE(campaign, contact) stays as the backstop (_on_conflict below).
# The step's contact-id range is said to the planner here too: a segment's step (whose matches
# come from a materialized CTE it estimates at one row) otherwise re-read every message the
# campaign already had at each step (370,563 index entries at step 49 of bench/fanout.py
# --segment: 190 ms of a 417 ms step, steps growing from 180 to 450 ms).
_NOT_YET = """NOT EXISTS (
           SELECT 1 FROM delivery_message AS m WHERE m.campaign_id = %(campaign_id)s AND m.contact_id = a.id
              AND m.contact_id BETWEEN (SELECT min(contact_id) FROM members) AND (SELECT max(contact_id) FROM members)
       )"""

# A step's new rows, with what their message.queued events are made of.
_STEP_RETURNING = f"RETURNING {EVENT_COLUMNS}"


def _queued_step(ctes: str, matched: str) -> str:
    return f"""
WITH {ctes}, created AS (
    INSERT INTO delivery_message AS m (campaign_id, contact_id, template_id, to_email, priority, status, queued_at)
    SELECT %(campaign_id)s, a.id, %(template_id)s, a.email, %(priority)s, {MSG.QUEUED}, now()
      FROM audience AS a
     WHERE {_NOT_YET}
     ORDER BY a.id
    {_STEP_RETURNING}
), announced AS ({_announce("created")})
{_result(matched).strip()}
"""


# Local-time campaigns: the same step, but each message is `scheduled` at its contact's local
# instant, from a small table of timezone → instant computed once (core.localtime).
# Contacts in a timezone the campaign skips (policy `skip`) join to nothing and are excluded.
def _local_step(ctes: str, matched: str) -> str:
    return f"""
WITH {ctes}, zones AS (
    SELECT * FROM unnest(%(zones)s::text[], %(dues)s::timestamptz[]) AS z(name, due)
), created AS (
    INSERT INTO delivery_message AS m (campaign_id, contact_id, template_id, to_email, priority, status, due_at)
    SELECT %(campaign_id)s, a.id, %(template_id)s, a.email, %(priority)s, {MSG.SCHEDULED}, zones.due
      FROM audience AS a
      JOIN zones ON zones.name = a.timezone
     WHERE {_NOT_YET}
     ORDER BY a.id
    {_STEP_RETURNING}
), announced AS ({_announce("created")})
{_result(matched).strip()}
"""


# Optimized campaigns: `scheduled` at the instant of the contact's stored best hour in the window
# (`slots`: timezone × local hour → instant), else the population's best hour for the window in
# the contact's timezone (`fallbacks`); the holdout share at the window's start. The tables are
# campaigns.optimized's WindowPlan, a few thousand rows at most; a contact whose timezone is not
# in them (changed after the plan was made) gets the window's start.
def _optimized_step(ctes: str, matched: str) -> str:
    return f"""
WITH {ctes}, slots AS (
    SELECT * FROM unnest(%(slot_zones)s::text[], %(slot_hours)s::int[], %(slot_dues)s::timestamptz[])
        AS s(name, hour, due)
), fallbacks AS (
    SELECT * FROM unnest(%(fallback_zones)s::text[], %(fallback_dues)s::timestamptz[]) AS f(name, due)
), created AS (
    INSERT INTO delivery_message AS m (campaign_id, contact_id, template_id, to_email, priority, status, due_at)
    SELECT %(campaign_id)s, a.id, %(template_id)s, a.email, %(priority)s, {MSG.SCHEDULED},
           CASE WHEN {holdout_sql("%(campaign_id)s", "a.id", "%(holdout_percent)s")} THEN %(window_start)s
                ELSE coalesce(s.due, f.due, %(window_start)s)
           END
      FROM audience AS a
      -- Joins, not subqueries over the CTEs: a correlated subquery scanned the 480-row table
      -- once per recipient (optimized fan-out took twice the immediate one's time).
      CROSS JOIN LATERAL (SELECT {best_hour_sql("a.id")} AS hour) AS b
      LEFT JOIN slots AS s ON s.name = a.timezone AND s.hour = b.hour
      LEFT JOIN fallbacks AS f ON f.name = a.timezone
     WHERE {_NOT_YET}
     ORDER BY a.id
    {_STEP_RETURNING}
), announced AS ({_announce("created")})
{_result(matched).strip()}
"""


# The same steps with ON CONFLICT DO NOTHING, for the one case the anti-join cannot see: a row
# for one of the step's members that another transaction inserted and had not committed when the
# step's snapshot was taken. Only fan-out inserts campaign messages, one step at a time under the
# campaign's lock, so nothing does that today; if something ever does, the step is run again this
# way (materialise_step) instead of failing on UNIQUE(campaign, contact) at every retry.
def _on_conflict(sql: str) -> str:
    fallback = sql.replace(
        f"    {_STEP_RETURNING}\n)",
        f"    ON CONFLICT (campaign_id, contact_id) DO NOTHING\n    {_STEP_RETURNING}\n)",
        1,
    )
    assert fallback != sql
    return fallback


_BUILDERS = {"queued": _queued_step, "local": _local_step, "optimized": _optimized_step}
# The steps of a list campaign, built once.
_STEPS = {kind: build(AUDIENCE_STEP_CTES, "members") for kind, build in _BUILDERS.items()}


def materialise_step(
    *,
    campaign_id: int,
    list_id: int | None,
    cursor: int,
    limit: int,
    template_id: int | None,
    priority: str,
    zones: dict[str, datetime] | None = None,
    plan: WindowPlan | None = None,
    condition: str | None = None,
    condition_params: dict[str, Any] | None = None,
) -> tuple[int | None, int, int, list[int]]:
    """Insert the campaign's messages for the next `limit` members of its list after `cursor`
    (`queued`; with `zones` `scheduled` at each contact's local instant; with an optimized
    campaign's `plan` `scheduled` at each contact's best hour in the window), one
    `INSERT … SELECT` that skips the members already given one: a replayed step inserts
    nothing twice.

    With `condition` (an SQL boolean over the contact aliased `c`, a segment's filter compiled
    by campaigns.segment_sql, its values in `condition_params`) only the members matching it are
    the audience; with `list_id` None the members are every contact, walked by id.

    Returns the last member looked at (None when there was none), how many members were looked
    at, how many of them matched, and the ids created.
    """
    params: dict[str, Any] = {
        "list_id": list_id,
        "cursor": cursor,
        "limit": limit,
        "campaign_id": campaign_id,
        "template_id": template_id,
        "priority": priority,
    }
    kind = "queued"
    if zones is not None:
        params.update(zones=list(zones), dues=list(zones.values()))
        kind = "local"
    elif plan is not None:
        params.update(
            slot_zones=plan.slot_zones,
            slot_hours=plan.slot_hours,
            slot_dues=plan.slot_dues,
            fallback_zones=plan.fallback_zones,
            fallback_dues=plan.fallback_dues,
            window_start=plan.window_start,
            holdout_percent=plan.holdout_percent,
        )
        kind = "optimized"
    if condition is None and list_id is not None:
        sql = _STEPS[kind]
    else:
        sql = _BUILDERS[kind](
            audience_step_ctes(list_walk=list_id is not None, condition=condition), "matching"
        )
        params.update(condition_params or {})
    try:
        # A savepoint (the step runs in fan-out's transaction), so the step can run again.
        with transaction.atomic(), connection.cursor() as db:
            db.execute(sql, params)
            last_member, members, matched, ids = db.fetchone()
    except IntegrityError as exc:
        logger.error(
            "campaign %s: a message for a member of this step was inserted outside fan-out (%s); "
            "the step skips it",
            campaign_id,
            exc,
        )
        with connection.cursor() as db:
            db.execute(_on_conflict(sql), params)
            last_member, members, matched, ids = db.fetchone()
    return last_member, members, matched, list(ids)


# --- scheduled / retry_wait → queued (the scheduler) --------------------------------------------


def queue_due(message_ids: Sequence[int]) -> tuple[list[tuple[int, str]], list[tuple[int, datetime]]]:
    """Queue these `scheduled`/`retry_wait` messages if they are due.

    Returns (id, priority) of the rows queued, and (id, due_at) of those still waiting but not
    due yet: a unit can come early (the reconciler read a retry just before it was rescheduled
    later, and the index keeps the earlier score), and goes back in the index at its real time.
    """
    with connection.cursor() as db:
        db.execute(
            f"""
            UPDATE delivery_message SET status = {MSG.QUEUED}, queued_at = clock_timestamp()
             WHERE id = ANY(%s) AND status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT})
               AND due_at <= clock_timestamp() + interval '1 second'
            RETURNING id, priority
            """,
            [list(message_ids)],
        )
        queued: list[tuple[int, str]] = db.fetchall()
        moved = {message_id for message_id, _ in queued}
        db.execute(
            f"""
            SELECT id, due_at FROM delivery_message
             WHERE id = ANY(%s) AND status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT})
            """,
            [[i for i in message_ids if i not in moved]],
        )
        early: list[tuple[int, datetime]] = db.fetchall()
    return queued, early


def queue_slot(campaign_id: int, due_epoch: int | None) -> list[tuple[int, str]]:
    """Queue a local-time campaign's messages scheduled at this instant; (id, priority) moved."""
    with connection.cursor() as db:
        db.execute(
            f"""
            UPDATE delivery_message SET status = {MSG.QUEUED}, queued_at = clock_timestamp()
             WHERE status = {MSG.SCHEDULED} AND due_at = to_timestamp(%s) AND campaign_id = %s
            RETURNING id, priority
            """,
            [due_epoch, campaign_id],
        )
        return db.fetchall()


# Which messages (alias `m`) are marketing mail, for campaigns.selectors.suppressed_sql: an
# `unsubscribed` suppression stops these only. Campaign messages, and transactional messages
# sent with `unsubscribe: true` (they carry an unsubscribe link: campaigns.unsubscribe's
# wants_unsubscribe, the same rule in Python).
MARKETING_SQL = "(m.campaign_id IS NOT NULL OR m.list_unsubscribe)"

# --- queued → sending (the send worker's claim) -------------------------------------------------

# The claim also reports whether each address is suppressed, saving a query per batch.
#
# `claimed_at` is the claim's token as well as its age: the claiming statement's time
# (statement_timestamp(), one value for the whole batch), which the stale-send sweep measures the
# lease from and every later write of the claimer (renew_claim, record_outcomes) must find
# unchanged. It is unique per claim of a row: a row is claimed again only after the sweep found
# this claim older than the lease, so the next claim's time is later (on any database clock that
# does not step back by the lease). A column of its own would say the same at the cost of a
# migration and a wider row on the hottest table.
# The cc and bcc addresses on the suppression list (NULL for a message without copies: every
# campaign row, at the cost of two NULL tests): compose leaves them out.
_SUPPRESSED_COPIES = f"""CASE WHEN m.cc IS NULL AND m.bcc IS NULL THEN NULL ELSE ARRAY(
              SELECT a FROM jsonb_array_elements_text(coalesce(m.cc, '[]') || coalesce(m.bcc, '[]')) AS a
               WHERE {suppressed_sql("a", marketing=MARKETING_SQL)}) END"""
_CLAIM_RETURNING = f"""m.id, m.campaign_id, m.contact_id, m.template_id, m.to_email, m.from_email,
          m.reply_to, m.subject, m.html, m.text, m.context, m.list_unsubscribe, m.track_opens,
          m.track_clicks, m.headers, m.attachments, m.priority, m.attempts,
          {suppressed_sql("m.to_email", marketing=MARKETING_SQL)}, m.claimed_at, m.cc, m.bcc,
          {_SUPPRESSED_COPIES}"""
_CLAIM_SQL = f"""
UPDATE delivery_message AS m
   SET status = {MSG.SENDING}, attempts = attempts + 1, claimed_at = statement_timestamp()
 WHERE m.id = ANY(%s) AND m.status = {MSG.QUEUED}
   -- A campaign's messages go only while it is sending: pause and cancel take effect per batch.
   AND (m.campaign_id IS NULL OR {campaign_status_sql("m.campaign_id")} = {CAMPAIGN.SENDING})
RETURNING {_CLAIM_RETURNING}
"""

# The pool claim (claim_pool): a transactional worker under backlog takes the oldest waiting API
# messages of its pool, every critical one before any high one, plus the task's own ids that the
# pool scans cannot see (a campaign's, say), at most `limit` in all. Each CTE locks as it scans
# (FOR UPDATE SKIP LOCKED: a row another claim holds is passed over, not waited for), and
# PostgreSQL evaluates a WITH query only as far as its reader fetches: each is read only when the
# ones before it ran out before the limit. A task's own ids all have its priority (a batch never
# mixes priorities), and are read right after the API messages of that priority. The scans are index scans of
# message_pool_queued_idx, which holds only queued API messages of the transactional pool.
_POOL_SCAN_SQL = f"""
SELECT id FROM delivery_message
 WHERE status = {MSG.QUEUED} AND campaign_id IS NULL AND priority = %s
 ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
"""
_CLAIM_POOL_SQL = f"""
WITH critical AS ({_POOL_SCAN_SQL}), high AS ({_POOL_SCAN_SQL}), own AS (
    SELECT id FROM delivery_message
     WHERE id = ANY(%s) AND status = {MSG.QUEUED}
       AND NOT (campaign_id IS NULL AND priority IN ({PRIORITY.CRITICAL}, {PRIORITY.HIGH}))
     ORDER BY id FOR UPDATE SKIP LOCKED
), picked AS (
    (SELECT id FROM {{first}} UNION ALL SELECT id FROM {{second}} UNION ALL SELECT id FROM {{third}}) LIMIT %s
)
UPDATE delivery_message AS m
   SET status = {MSG.SENDING}, attempts = attempts + 1, claimed_at = statement_timestamp()
  FROM picked
 WHERE m.id = picked.id AND m.status = {MSG.QUEUED}
   AND (m.campaign_id IS NULL OR {campaign_status_sql("m.campaign_id")} = {CAMPAIGN.SENDING})
RETURNING {_CLAIM_RETURNING}
"""

_CLAIM_COLUMNS = (
    "id", "campaign_id", "contact_id", "template_id", "to_email", "from_email", "reply_to",
    "subject", "html", "text", "context", "list_unsubscribe", "track_opens", "track_clicks",
    "headers", "attachments", "priority", "attempts", "suppressed", "claimed_at", "cc", "bcc",
    "suppressed_copies",
)  # fmt: skip


@dataclass
class ClaimedMessage:
    id: int
    campaign_id: int | None
    contact_id: int | None
    template_id: int | None
    to_email: str
    from_email: str | None
    reply_to: str | None
    subject: str | None
    html: str | None
    text: str | None
    context: Any
    list_unsubscribe: bool
    track_opens: bool
    track_clicks: bool
    headers: Any  # the application's own headers (a dict), or None
    attachments: Any  # Message.attachments: a list of metadata (contents by hash), or None
    priority: str
    attempts: int
    suppressed: bool
    claimed_at: datetime  # the claim's token: the same for every message of one claim
    cc: Any = None  # a list of addresses, or None
    bcc: Any = None
    suppressed_copies: list[str] | None = None  # of cc and bcc, those on the suppression list

    def __post_init__(self) -> None:
        for name in ("context", "headers", "attachments", "cc", "bcc"):
            value = getattr(self, name)
            if isinstance(value, str):  # raw SQL hands back jsonb as text
                setattr(self, name, json.loads(value))


def claim(message_ids: Sequence[int]) -> list[ClaimedMessage]:
    """`queued` → `sending` for the given ids whose campaign, if any, is sending; one attempt spent.

    Every row claimed gets the same `claimed_at`, the token its later writes are fenced by."""
    with connection.cursor() as db:
        db.execute(_CLAIM_SQL, [list(message_ids)])
        rows = db.fetchall()
    return [ClaimedMessage(**dict(zip(_CLAIM_COLUMNS, row, strict=True))) for row in rows]


_CLAIM_POOL_ORDER: dict[str, str] = {
    Priority.CRITICAL: _CLAIM_POOL_SQL.format(first="critical", second="own", third="high"),
    Priority.HIGH: _CLAIM_POOL_SQL.format(first="critical", second="high", third="own"),
}


def claim_pool(own_ids: Sequence[int], priority: str, limit: int) -> list[ClaimedMessage]:
    """`queued` → `sending` for up to `limit` messages of the transactional pool, as `claim` does,
    oldest first and every critical one before any high one: the waiting critical API messages,
    then the high ones, with the task's own `own_ids` of `priority` that the pool's scans do not
    see (a campaign's) after the API messages of that priority. An API message of `own_ids` past
    the limit stays queued: the caller, finding the claim full, asks for another claim."""
    with connection.cursor() as db:
        db.execute(
            _CLAIM_POOL_ORDER[priority],
            [Priority.CRITICAL, limit, Priority.HIGH, limit, list(own_ids), limit],
        )
        rows = db.fetchall()
    claimed = [ClaimedMessage(**dict(zip(_CLAIM_COLUMNS, row, strict=True))) for row in rows]
    # The order the claim's scans took them in (UPDATE … RETURNING keeps none): sent in this order.
    claimed.sort(key=lambda m: (m.priority != Priority.CRITICAL, m.campaign_id is not None, m.id))
    return claimed


def renew_claim(message_ids: Sequence[int], claimed_at: datetime) -> tuple[datetime | None, list[int]]:
    """`sending` → `sending` with a fresh `claimed_at`, for the rows of `message_ids` still held by
    the claim whose token is `claimed_at`: re-confirms the claim and restarts its lease, in one
    statement for the batch. Returns the new token (None when no row was still held) and the ids
    renewed; a row the sweep gave back, and so one another worker may hold, is not among them."""
    with connection.cursor() as db:
        db.execute(
            f"""
            UPDATE delivery_message SET claimed_at = statement_timestamp()
             WHERE id = ANY(%s) AND status = {MSG.SENDING} AND claimed_at = %s
            RETURNING id, claimed_at
            """,
            [list(message_ids), claimed_at],
        )
        rows = db.fetchall()
    return (rows[0][1] if rows else None), [message_id for message_id, _ in rows]


# --- sending → sent | failed | suppressed | retry_wait | cancelled (recording a batch) ---------


@dataclass
class Outcomes:
    sent: dict[str, list[tuple[int, str | None]]] = field(default_factory=lambda: defaultdict(list))
    failed: list[tuple[int, str]] = field(default_factory=list)
    suppressed: list[tuple[int, str]] = field(default_factory=list)
    retry: list[tuple[int, datetime, str]] = field(default_factory=list)
    # Like retry, but no provider was tried (every circuit open or paused): the claim's attempt
    # is given back, so an outage of any length burns no attempts.
    deferred: list[tuple[int, datetime, str]] = field(default_factory=list)
    # Addresses to put on the suppression list: (email, detail).
    bounced: list[tuple[str, str]] = field(default_factory=list)

    def statements(self) -> int:
        """How many statements record_outcomes runs for these (suppressions aside)."""
        waiting = (self.failed, self.suppressed, self.retry, self.deferred)
        return sum(1 for sent in self.sent.values() if sent) + sum(1 for rows in waiting if rows)


# (campaign id, final status) → how many of its rows reached that status.
Moved = Counter[tuple[int, str]]


@dataclass
class Recorded:
    moved: Moved = field(default_factory=Counter)
    # (id, due_at) of the rows now in retry_wait, for the schedule index.
    retrying: list[tuple[int, datetime]] = field(default_factory=list)
    # For the metrics (core.metrics), of the rows really moved: (provider, priority, outcome)
    # → count, and per priority the seconds from accept to provider acceptance of each sent one.
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Outbound events written with the moves (core.outbound_events).
    announced: int = 0


# Accept, for the queue latency: the accept itself, or the due instant of a scheduled message
# (or of its last retry: due_at is overwritten then, so a retried message counts from there).
_ACCEPTED_AT_SQL = "greatest(m.created_at, coalesce(m.due_at, m.created_at))"


# Each outcome's UPDATE writes its rows' outbound events in the same statement, and every row
# it returns ends with how many it wrote (core.outbound_events).
_ANNOUNCED = "(SELECT count(*) FROM announced)"

_SENT_SQL = f"""
WITH moved AS (
UPDATE delivery_message AS m
   SET status = {MSG.SENT}, sent_at = clock_timestamp(), provider = %s,
       provider_message_id = v.provider_message_id, last_error = NULL
  FROM unnest(%s::bigint[], %s::text[]) AS v(id, provider_message_id)
 WHERE m.id = v.id AND m.status = {MSG.SENDING} AND m.claimed_at = %s
RETURNING {EVENT_COLUMNS},
          extract(epoch FROM clock_timestamp() - {_ACCEPTED_AT_SQL})::float8 AS seconds
), announced AS ({_announce("moved")})
SELECT campaign_id, priority, seconds, {_ANNOUNCED} FROM moved
"""

_FINAL_SQL = f"""
WITH moved AS (
UPDATE delivery_message AS m
   SET status = %s, last_error = v.error
  FROM unnest(%s::bigint[], %s::text[]) AS v(id, error)
 WHERE m.id = v.id AND m.status = {MSG.SENDING} AND m.claimed_at = %s
RETURNING {EVENT_COLUMNS}
), announced AS ({_announce("moved")})
SELECT campaign_id, priority, {_ANNOUNCED} FROM moved
"""

# A campaign cancelled while this batch was in flight gets no retry: the message is cancelled
# (and counted) instead of waiting for a retry no one would ever claim.
_WAIT_SQL = f"""
WITH moved AS (
UPDATE delivery_message AS m
   SET status = CASE WHEN {campaign_status_sql("m.campaign_id")} = {CAMPAIGN.CANCELLED}
                     THEN {MSG.CANCELLED} ELSE {MSG.RETRY_WAIT} END,
       due_at = v.due_at, last_error = v.error,
       attempts = GREATEST(m.attempts - %s, 0)
  FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[]) AS v(id, due_at, error)
 WHERE m.id = v.id AND m.status = {MSG.SENDING} AND m.claimed_at = %s
RETURNING {EVENT_COLUMNS}
), announced AS ({_announce("moved")})
SELECT id, campaign_id, status, due_at, priority, {_ANNOUNCED} FROM moved
"""


def record_outcomes(outcomes: Outcomes, claimed_at: datetime) -> Recorded:
    """Move a claimed batch out of `sending`, each UPDATE conditional on the row still being
    `sending` under this claim (`claimed_at`, its token: a worker that lost its claim while it was
    stalled writes nothing over the rows another worker holds now); report the campaign of each
    row really moved, by final status. One UPDATE per provider that took mail and per outcome."""
    recorded = Recorded()
    retried: list[tuple[Any, ...]] = []
    with connection.cursor() as db:
        for provider, sent in outcomes.sent.items():
            if sent:
                _record_sent(db, recorded, provider, sent, claimed_at)
        for status, rows in (
            (MessageStatus.FAILED, outcomes.failed),
            (MessageStatus.SUPPRESSED, outcomes.suppressed),
        ):
            if rows:
                ids, errors = zip(*rows, strict=True)
                db.execute(_FINAL_SQL, [status, list(ids), list(errors), claimed_at])
                final = db.fetchall()
                recorded.announced += final[0][-1] if final else 0
                _count(recorded, final, status)
        for waiting, given_back, outcome in (
            (outcomes.retry, 0, "retried"),
            (outcomes.deferred, 1, "deferred"),
        ):
            if waiting:
                retried += _record_waiting(db, recorded, waiting, given_back, outcome, claimed_at)
    cancelled = [(c, p) for _, c, status, _, p in retried if status == MessageStatus.CANCELLED]
    _count(recorded, cancelled, MessageStatus.CANCELLED, metric=False)
    recorded.retrying = [(i, d) for i, _, status, d, _ in retried if status == MessageStatus.RETRY_WAIT]
    outbound_events.ring_after_commit(recorded.announced)
    return recorded


def _record_sent(
    db: CursorWrapper,
    recorded: Recorded,
    provider: str,
    sent: list[tuple[int, str | None]],
    claimed_at: datetime,
) -> None:
    ids, provider_ids = zip(*sent, strict=True)
    db.execute(_SENT_SQL, [provider, list(ids), list(provider_ids), claimed_at])
    sent_rows = db.fetchall()
    recorded.announced += sent_rows[0][-1] if sent_rows else 0
    _count(recorded, sent_rows, MessageStatus.SENT, provider)
    for _, priority, seconds, _ in sent_rows:
        recorded.latencies[priority].append(seconds)


def _record_waiting(
    db: CursorWrapper,
    recorded: Recorded,
    waiting: list[tuple[int, datetime, str]],
    given_back: int,
    outcome: str,
    claimed_at: datetime,
) -> list[tuple[Any, ...]]:
    """retry_wait (`given_back` 1 returns the attempt: nothing was tried), or cancelled with its
    campaign; the rows moved."""
    ids, due, errors = zip(*waiting, strict=True)
    db.execute(_WAIT_SQL, [given_back, list(ids), list(due), list(errors), claimed_at])
    rows = db.fetchall()
    recorded.announced += rows[0][-1] if rows else 0
    waited = [row[:-1] for row in rows]
    for _, _, status, _, priority in waited:
        recorded.counts[
            (NO_PROVIDER, priority, outcome if status == MessageStatus.RETRY_WAIT else status)
        ] += 1
    return waited


def _count(
    recorded: Recorded,
    rows: Sequence[Sequence[Any]],
    status: str,
    provider: str = NO_PROVIDER,
    *,
    metric: bool = True,
) -> None:
    """Count rows (campaign id, priority, …) that reached `status`: per campaign for its counters,
    per (provider, priority, status) for the metrics."""
    for campaign_id, priority, *_ in rows:
        if campaign_id is not None:
            recorded.moved[(campaign_id, status)] += 1
        if metric:
            recorded.counts[(provider, priority, status)] += 1


# --- sending → queued | failed after the lease (a dead worker's claim) -------------------------


# Requeued is no news to the application (it was queued before); given up is.
_FAILED_ONLY = f"CASE WHEN status = {MSG.FAILED} THEN 'message.failed' END"


def requeue_stale(*, lease_seconds: float, max_attempts: int) -> tuple[list[tuple[int, str]], Moved]:
    """Give back rows claimed longer ago than the lease: `queued` again, or `failed` once they
    have used every attempt. Returns (id, priority) requeued and the failed rows by campaign."""
    with connection.cursor() as db:
        db.execute(
            f"""
            WITH moved AS (
            UPDATE delivery_message AS m
               SET status = CASE WHEN attempts >= %s THEN {MSG.FAILED} ELSE {MSG.QUEUED} END,
                   last_error = CASE WHEN attempts >= %s
                                     THEN 'gave up: its worker died while sending, ' || attempts || ' attempt(s)'
                                     ELSE last_error END,
                   queued_at = clock_timestamp()
             WHERE status = {MSG.SENDING}
               AND claimed_at < clock_timestamp() - make_interval(secs => %s)
            RETURNING {EVENT_COLUMNS}
            ), announced AS ({_announce("moved", _FAILED_ONLY)})
            SELECT id, priority, status, campaign_id FROM moved
            """,
            [max_attempts, max_attempts, lease_seconds],
        )
        returned = db.fetchall()
    requeued = [
        (message_id, priority)
        for message_id, priority, status, _ in returned
        if status == MessageStatus.QUEUED
    ]
    failed: Moved = Counter(
        (campaign_id, MessageStatus.FAILED)
        for _, _, status, campaign_id in returned
        if status == MessageStatus.FAILED and campaign_id
    )
    return requeued, failed


# --- failed → queued (operator retry) -----------------------------------------------------------


def requeue_failed(message_ids: Sequence[int]) -> list[tuple[int, str, int | None]]:
    """`failed` → `queued` with attempts reset to 0, unless the address is suppressed or the
    message's campaign is neither sending nor paused. Returns (id, priority, campaign id) moved."""
    with connection.cursor() as db:
        db.execute(
            f"""
            UPDATE delivery_message AS m
               SET status = {MSG.QUEUED}, attempts = 0, queued_at = clock_timestamp(),
                   due_at = NULL, claimed_at = NULL
             WHERE m.id = ANY(%s) AND m.status = {MSG.FAILED}
               AND NOT {suppressed_sql("m.to_email", marketing=MARKETING_SQL)}
               AND (m.campaign_id IS NULL
                    OR {campaign_status_sql("m.campaign_id")} IN ({CAMPAIGN.SENDING}, {CAMPAIGN.PAUSED}))
            RETURNING m.id, m.priority, m.campaign_id
            """,
            [list(message_ids)],
        )
        return db.fetchall()


# --- queued | scheduled | retry_wait → cancelled ------------------------------------------------

# States that may be cancelled: nothing has been handed to a provider yet. A `sending` message
# is at a provider right now; cancelling it could not stop the email.
CANCELLABLE = (MessageStatus.QUEUED, MessageStatus.SCHEDULED, MessageStatus.RETRY_WAIT)


def cancel(message_ids: Sequence[int], reason: str) -> list[tuple[int, int | None, str]]:
    """Cancel these messages if they are still cancellable; (id, campaign id, status it had).

    The row lock in the CTE re-reads each row's status after any concurrent writer commits, so the
    status returned is the one that was really cancelled.
    """
    with connection.cursor() as db:
        db.execute(
            f"""
            WITH target AS (
                SELECT id, status FROM delivery_message
                 WHERE id = ANY(%s) AND status = ANY(%s)
                 ORDER BY id
                   FOR UPDATE
            )
            , moved AS (
            UPDATE delivery_message AS m
               SET status = {MSG.CANCELLED}, last_error = %s
              FROM target
             WHERE m.id = target.id
            RETURNING {EVENT_COLUMNS}, target.status AS was
            ), announced AS ({_announce("moved")})
            SELECT id, campaign_id, was FROM moved
            """,
            [list(message_ids), list(CANCELLABLE), reason],
        )
        return db.fetchall()


# What a cancel by tag or idempotency key matches among one key's messages (the key's own only:
# campaign rows have no key). One statement: the matched rows, the cancellable ones locked and
# re-checked (a row a worker claimed meanwhile is no longer cancellable), the UPDATE, the counts.
_CANCEL_CARRYING_SQL = f"""
WITH matched AS (
    SELECT id, status FROM delivery_message WHERE api_key_id = %s AND {{condition}}
), target AS (
    SELECT m.id, m.status FROM delivery_message AS m
     WHERE m.id IN (SELECT id FROM matched WHERE status = ANY(%s)) AND m.status = ANY(%s)
     ORDER BY m.id
       FOR UPDATE
), moved AS (
    UPDATE delivery_message AS m
       SET status = {MSG.CANCELLED}, last_error = %s
      FROM target
     WHERE m.id = target.id
    RETURNING {EVENT_COLUMNS}, target.status AS was
), announced AS ({_announce("moved").replace("{", "{{").replace("}", "}}")})
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM moved WHERE was <> {MSG.QUEUED}), '{{{{}}}}'),
       (SELECT count(*) FROM moved),
       (SELECT count(*) FROM matched WHERE status = {MSG.CANCELLED}),
       (SELECT count(*) FROM matched)
"""
_CARRYING = {
    "tag": "tags @> jsonb_build_array(%s::text)",  # message_tags_idx
    "idempotency_key": "idempotency_key = %s",  # uniq_idempotency_key
}


@dataclass
class CancelledCarrying:
    indexed: list[int]  # ids cancelled that had a unit in the schedule index (scheduled, retry_wait)
    cancelled: int
    already_cancelled: int
    matched: int


def cancel_carrying(api_key_id: int, what: str, value: str, reason: str) -> CancelledCarrying:
    """Cancel every cancellable message of this API key whose `what` ("tag" or
    "idempotency_key") is `value`, however many: one statement."""
    cancellable = list(CANCELLABLE)
    with connection.cursor() as db:
        db.execute(
            _CANCEL_CARRYING_SQL.format(condition=_CARRYING[what]),
            [api_key_id, value, cancellable, cancellable, reason],
        )
        indexed, cancelled, already, matched = db.fetchone()
    return CancelledCarrying(list(indexed), cancelled, already, matched)


# --- scheduled | queued | retry_wait → another send time -----------------------------------------

_RESCHEDULE_SQL = """
WITH target AS (
    SELECT id, status FROM delivery_message
     WHERE id = %s AND campaign_id IS NULL AND status = ANY(%s)
       FOR UPDATE
)
UPDATE delivery_message AS m
   SET status = {status}, due_at = {due_at}, queued_at = {queued_at}
  FROM target
 WHERE m.id = target.id
RETURNING target.status, m.priority
"""
_TO_LATER = _RESCHEDULE_SQL.format(status=MSG.SCHEDULED, due_at="%s", queued_at="NULL")
# A queued message keeps its queued_at (and the send task it has); any other gets a task now.
_TO_NOW = _RESCHEDULE_SQL.format(
    status=MSG.QUEUED,
    due_at="NULL",
    queued_at=f"CASE WHEN target.status = {MSG.QUEUED} THEN m.queued_at ELSE clock_timestamp() END",
)


def reschedule(message_id: int, due_at: datetime | None) -> tuple[str, str] | None:
    """Move an API message that has not started sending to `due_at` (`scheduled`), or to now
    (`queued`) when None. Returns (the status it had, its priority), or None when it was not
    cancellable (sending, final) or is a campaign's."""
    with connection.cursor() as db:
        if due_at is None:
            db.execute(_TO_NOW, [message_id, list(CANCELLABLE)])
        else:
            db.execute(_TO_LATER, [message_id, list(CANCELLABLE), due_at])
        row = db.fetchone()
    return None if row is None else (row[0], row[1])


@dataclass
class CampaignCancelled:
    cancelled: int
    # What indexed its pending work: the epochs of its scheduled slots, its retrying message ids.
    slot_epochs: list[int]
    retry_ids: list[int]


def cancel_campaign(campaign_id: int) -> CampaignCancelled:
    """Cancel every message of a campaign not yet handed to a provider (the campaign's own row
    is the caller's: `campaigns.lifecycle.cancel`, under its lock)."""
    with connection.cursor() as db:
        db.execute(
            f"""
            SELECT coalesce(array_agg(DISTINCT floor(extract(epoch FROM due_at))::bigint)
                            FILTER (WHERE status = {MSG.SCHEDULED}), '{{}}'),
                   coalesce(array_agg(id) FILTER (WHERE status = {MSG.RETRY_WAIT}), '{{}}')
              FROM delivery_message
             WHERE campaign_id = %s AND status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT})
            """,
            [campaign_id],
        )
        slot_epochs, retry_ids = db.fetchone()
        db.execute(
            f"""
            WITH moved AS (
            UPDATE delivery_message AS m SET status = {MSG.CANCELLED}, last_error = 'campaign cancelled'
             WHERE campaign_id = %s AND status IN ({MSG.QUEUED}, {MSG.SCHEDULED}, {MSG.RETRY_WAIT})
            RETURNING {EVENT_COLUMNS}
            ), announced AS ({_announce("moved")})
            SELECT count(*) FROM moved
            """,
            [campaign_id],
        )
        (cancelled,) = db.fetchone()
        return CampaignCancelled(cancelled, list(slot_epochs), list(retry_ids))


# --- erasure: a recipient's address and content rewritten, status kept -------------------------


def erase_recipient(email: str, placeholder: str) -> list[int]:
    """Every message to `email` (any case) gets `placeholder` as its address and loses what may
    quote the person (inline subject and bodies, context, last error); status, timestamps and
    provider ids stay. Found through the UPPER(to_email) index. Returns the ids rewritten."""
    with connection.cursor() as db:
        db.execute(
            """
            UPDATE delivery_message
               SET to_email = %s, context = NULL, subject = NULL, html = NULL, text = NULL,
                   last_error = CASE WHEN last_error IS NULL THEN NULL ELSE 'recipient erased' END
             WHERE UPPER(to_email) = UPPER(%s)
            RETURNING id
            """,
            [placeholder, email],
        )
        return [row[0] for row in db.fetchall()]


# --- queued → queued with a new send task (republishing) ---------------------------------------
#
# Every path that republishes an existing row moves its `queued_at` in the transaction that
# records the new outbox task: the stranded-task probe (delivery/services/probes.py) must not
# take a row republished after its probe for stranded.

_REPUBLISH_SQL = """
WITH step AS (
    SELECT id FROM delivery_message
     WHERE {campaign}status = {queued} AND id > %(after)s
     ORDER BY id LIMIT %(limit)s
), moved AS (
    UPDATE delivery_message AS m SET queued_at = clock_timestamp()
      FROM step WHERE m.id = step.id AND m.status = {queued}
    RETURNING m.id, m.priority
)
SELECT (SELECT max(id) FROM step), coalesce((SELECT array_agg(id ORDER BY id) FROM moved), '{{}}'),
       coalesce((SELECT array_agg(priority ORDER BY id) FROM moved), '{{}}')
"""
_REPUBLISH_ALL_SQL = _REPUBLISH_SQL.format(campaign="", queued=MSG.QUEUED)
_REPUBLISH_CAMPAIGN_SQL = _REPUBLISH_SQL.format(
    campaign="campaign_id = %(campaign_id)s AND ", queued=MSG.QUEUED
)


def republish_queued(campaign_id: int | None = None, step: int = 50_000) -> int:
    """Publish send tasks again for every `queued` message (or one campaign's), in keyset steps
    of `step` rows, one transaction each; return how many were republished."""
    sql = _REPUBLISH_ALL_SQL if campaign_id is None else _REPUBLISH_CAMPAIGN_SQL
    last_id, total = 0, 0
    while True:
        with transaction.atomic(), connection.cursor() as db:
            db.execute(sql, {"campaign_id": campaign_id, "after": last_id, "limit": step})
            step_end, ids, priorities = db.fetchone()
            if step_end is None:
                return total
            send_tasks.record_sends_by_priority(zip(ids, priorities, strict=True))
        last_id, total = step_end, total + len(ids)


# One statement for every checked queue: a sequential scan of delivery_message (no index
# serves `status = 'queued'`, and one would cost every fan-out insert); 1M rows: see
# docs/architecture.md for the measured figure. It runs at most once per probe cycle.
_STRANDED_SQL = f"""
UPDATE delivery_message AS m SET queued_at = clock_timestamp()
 WHERE m.id IN (
        SELECT s.id FROM delivery_message AS s
          JOIN unnest(%s::text[], %s::float8[]) AS p(priority, cutoff) ON s.priority = p.priority
         WHERE s.status = {MSG.QUEUED}
           AND coalesce(s.queued_at, s.created_at) < to_timestamp(p.cutoff)
           AND (s.campaign_id IS NULL OR {campaign_status_sql("s.campaign_id")} = {CAMPAIGN.SENDING})
         LIMIT %s)
   AND m.status = {MSG.QUEUED}
RETURNING m.id, m.priority
"""


def republish_stranded(cutoffs: dict[str, float], step: int) -> dict[str, int]:
    """Republish `queued` rows of these priorities queued before their cutoff (campaign rows only
    while the campaign is `sending`), `step` rows per transaction. Returns rows by priority."""
    counts: dict[str, int] = {}
    if not cutoffs:
        return counts
    priorities, values = list(cutoffs), [cutoffs[p] for p in cutoffs]
    while True:
        with transaction.atomic(), connection.cursor() as db:
            db.execute(_STRANDED_SQL, [priorities, values, step])
            rows = db.fetchall()
            send_tasks.record_sends_by_priority(rows)
        for _, priority in rows:
            counts[priority] = counts.get(priority, 0) + 1
        if len(rows) < step:
            return counts


# --- first human open / click (engagement, not status) ------------------------------------------

# One statement for both columns: each is set only while still NULL, so the first human open or
# click of a message is written exactly once however many batches (or concurrent drains and
# webhooks) report one; a later batch with an earlier time does not move it either.
_FIRST_ENGAGEMENT_SQL = """
UPDATE delivery_message AS m
   SET first_opened_at = CASE WHEN m.first_opened_at IS NULL THEN coalesce(f.opened, m.first_opened_at)
                              ELSE m.first_opened_at END,
       first_clicked_at = CASE WHEN m.first_clicked_at IS NULL THEN coalesce(f.clicked, m.first_clicked_at)
                               ELSE m.first_clicked_at END
  FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS f(id, opened, clicked)
 WHERE m.id = f.id
   AND ((m.first_opened_at IS NULL AND f.opened IS NOT NULL)
        OR (m.first_clicked_at IS NULL AND f.clicked IS NOT NULL))
"""


def record_first_engagement(opened: dict[int, datetime], clicked: dict[int, datetime]) -> int:
    """Set first_opened_at / first_clicked_at where still NULL (caller `services/events.py`, for
    human hits only). Returns how many messages changed."""
    ids = sorted(set(opened) | set(clicked))
    if not ids:
        return 0
    with connection.cursor() as db:
        db.execute(_FIRST_ENGAGEMENT_SQL, [ids, [opened.get(i) for i in ids], [clicked.get(i) for i in ids]])
        return db.rowcount
