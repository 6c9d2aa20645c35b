"""Reads for the API and the admin."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis as redis_lib
from django.conf import settings
from django.db import connection
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce

from campaigns.selectors import campaign_ids_tagged, campaign_status_sql, holdout_sql, suppressed_sql
from core.sql import literal, literals
from delivery.breakers import CircuitSeen, circuit_key, circuits_seen, snapshot
from delivery.exceptions import ProviderConfigurationError
from delivery.models import ApiKey, EmailEvent, Message, MessageStatus
from delivery.permissions import can_manage
from delivery.providers import get_provider
from delivery.ratelimit import bucket_for
from delivery.services.gateway import BULK, TRANSACTIONAL
from delivery.services.sending import provider_chain
from delivery.services.transitions import MARKETING_SQL

# Statuses as SQL literals from the model's enum (core.sql): `{MSG.SENT}` is `'sent'`.
MSG = literals(MessageStatus)
CIRCUIT_STATES = {"closed": 0, "half-open": 1, "open": 2}


def circuit_states() -> list[tuple[tuple[str, str], int]]:
    """((provider, endpoint), 0 closed / 1 half-open / 2 open) for every circuit: the scrape-time
    gauge emailhub_circuit_state (endpoint "" for a provider with one endpoint)."""
    return [
        ((provider["name"], provider["endpoint"]), CIRCUIT_STATES.get(str(provider["circuit"]["state"]), 2))
        for provider in provider_health()
    ]


def provider_health() -> list[dict[str, Any]]:
    """Every circuit of every configured provider: the endpoint (one per server the processes
    send to under that name, as registered by them; this process's own when none has sent yet),
    the pools that use it, its breaker and its send-rate bucket."""
    chains = {pool: provider_chain(pool) for pool in (TRANSACTIONAL, BULK)}
    names = list(dict.fromkeys(name for chain in chains.values() for name in chain))
    try:
        seen = circuits_seen((TRANSACTIONAL, BULK))
    except redis_lib.RedisError:
        seen = []
    health = []
    for name in names:
        circuits = [c for c in seen if c.provider == name] or [_own_circuit(name, chains)]
        for circuit in circuits:
            health.append(
                {
                    "name": name,
                    "endpoint": circuit.endpoint,
                    "pools": list(circuit.pools),
                    "position": {
                        pool: chains[pool].index(name) + 1 for pool in circuit.pools if name in chains[pool]
                    },
                    "circuit": snapshot(circuit.key),
                    "rate_limit": _rate_limit(name, circuit.key),
                }
            )
    return health


def _own_circuit(name: str, chains: dict[str, list[str]]) -> CircuitSeen:
    """The circuit this process's settings give `name` (no process has sent through one yet)."""
    try:
        endpoint = get_provider(name).endpoint
    except ProviderConfigurationError:
        endpoint = ""  # misconfigured here (delivery.E001 names it); the workers may differ
    pools = tuple(pool for pool, chain in chains.items() if name in chain)
    return CircuitSeen(circuit_key(name, endpoint), name, endpoint, pools)


def _rate_limit(name: str, circuit: str) -> dict[str, Any] | None:
    bucket = bucket_for(name, circuit)
    if bucket is None:
        return None
    try:
        tokens: float | None = round(bucket.level(), 2)
    except redis_lib.RedisError:
        tokens = None
    return {"per_second": bucket.rate, "tokens": tokens, "reserved_for_transactional": bucket.reserved}


def provider_chains() -> dict[str, list[str]]:
    return {
        TRANSACTIONAL: list(settings.EMAILHUB_PROVIDERS_TRANSACTIONAL),
        BULK: list(settings.EMAILHUB_PROVIDERS_BULK),
    }


def messages_visible_to(key: ApiKey) -> QuerySet[Message]:
    """The messages a key may read: its own, or every message if it may manage.

    Another key's message is simply absent (a 404, not a 403), so ids are not an oracle. A
    key's own list is served by message_api_key_idx.
    """
    messages = Message.objects.select_related("template").annotate(campaign_tags=F("campaign__tags"))
    return messages if can_manage(key) else messages.filter(api_key=key)


def messages_tagged(messages: QuerySet[Message], tag: str) -> QuerySet[Message]:
    """Those of `messages` that carry `tag`, or whose campaign does (`_carrying`)."""
    return messages.filter(_carrying(tag))


def _carrying(tag: str, *, through: str = "") -> Q:
    """Messages carrying `tag`: `tags @> '["tag"]'` (message_tags_idx), or of a campaign carrying
    it. The campaigns' ids are read first (a small table) and given as a list: a BitmapOr of the
    tag index and the (campaign, contact) index. As a subquery, PostgreSQL could only filter
    every message row by it (a hashed SubPlan under OR), a scan of the table."""
    campaigns = campaign_ids_tagged(tag)
    carrying = Q(**{f"{through}tags__contains": [tag]})
    return carrying | Q(**{f"{through}campaign_id__in": campaigns}) if campaigns else carrying


def message_states(message_ids: Sequence[int]) -> dict[int, tuple[str, bool, str | None]]:
    """id → (status, address suppressed, campaign status or None), for the ids that exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT m.id, m.status, {suppressed_sql("m.to_email", marketing=MARKETING_SQL)}, {campaign_status_sql("m.campaign_id")}
              FROM delivery_message AS m
             WHERE m.id = ANY(%s)
            """,
            [list(message_ids)],
        )
        return {row[0]: (row[1], row[2], row[3]) for row in cursor.fetchall()}


def unsent_message_ids_to(email: str, statuses: Sequence[str]) -> list[int]:
    """Ids of the messages to `email` (any case, through the UPPER(to_email) index) in `statuses`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM delivery_message WHERE UPPER(to_email) = UPPER(%s) AND status = ANY(%s)",
            [email, list(statuses)],
        )
        return [row[0] for row in cursor.fetchall()]


def pending_message_units() -> list[tuple[str, float]]:
    """The schedule-index units PostgreSQL says are pending, with their scores (epoch seconds):
    `m:<id>` per retrying message and per scheduled transactional one, `c:<campaign>:<epoch>`
    per local-time slot that still has scheduled messages."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT 'm:' || id, extract(epoch FROM due_at) FROM delivery_message
             WHERE status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT}) AND (campaign_id IS NULL OR status = {MSG.RETRY_WAIT})
            UNION ALL
            SELECT 'c:' || campaign_id || ':' || extract(epoch FROM due_at)::bigint, extract(epoch FROM due_at)
              FROM delivery_message WHERE status = {MSG.SCHEDULED} AND campaign_id IS NOT NULL
             GROUP BY campaign_id, due_at
            """
        )
        return [(unit, float(score)) for unit, score in cursor.fetchall()]


def next_sends(campaign_ids: Sequence[int]) -> dict[int, datetime]:
    """Campaign id → the earliest `due_at` of its `scheduled` or `retry_wait` messages, for the
    campaigns that have one (the operator's "next send at").

    One statement. Each campaign's lookup walks message_due_idx (the partial index on `due_at`
    over exactly those two statuses) in due order and stops at the campaign's first row: it reads
    the other campaigns' rows due before that one, and a campaign with no row there reads the
    whole index, so callers ask only for campaigns whose messages wait for a due instant
    (docs/architecture.md, "The admin's frame", has the measured cost)."""
    if not campaign_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT c.id, n.due_at
              FROM unnest(%s::bigint[]) AS c(id)
             CROSS JOIN LATERAL (
                   SELECT m.due_at FROM delivery_message AS m
                    WHERE m.campaign_id = c.id AND m.status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT})
                    ORDER BY m.due_at
                    LIMIT 1
             ) AS n
            """,
            [list(campaign_ids)],
        )
        return dict(cursor.fetchall())


def pending_and_sending_by_priority() -> dict[str, tuple[int, int]]:
    """Per priority, in messages: (pending, sending). Pending = `queued` plus due but not yet
    dispatched (`scheduled`/`retry_wait` with `due_at <= now`).

    No index serves `status = 'queued'` (it would cost every fan-out insert), so this is one
    sequential scan of delivery_message; see docs/scheduling.md for the measured cost."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT priority,
                   count(*) FILTER (WHERE status = {MSG.QUEUED}
                                       OR (status IN ({MSG.SCHEDULED}, {MSG.RETRY_WAIT}) AND due_at <= now())),
                   count(*) FILTER (WHERE status = {MSG.SENDING})
              FROM delivery_message
             WHERE status IN ({MSG.QUEUED}, {MSG.SCHEDULED}, {MSG.RETRY_WAIT}, {MSG.SENDING})
             GROUP BY priority
            """
        )
        return {priority: (pending, sending) for priority, pending, sending in cursor.fetchall()}


def with_message_tags(events: QuerySet[EmailEvent]) -> QuerySet[EmailEvent]:
    """Each event with its message's tags (a campaign message's: its campaign's) and metadata
    (`message_tags`, `message_metadata`): columns of joins on primary keys, not the message row
    and its bodies."""
    return events.annotate(
        message_tags=Coalesce(F("message__tags"), F("message__campaign__tags")),
        message_metadata=F("message__metadata"),
    )


def events_of(message: Message) -> QuerySet[EmailEvent]:
    """A message's events, newest first (served by the event table's message index)."""
    return with_message_tags(EmailEvent.objects.filter(message=message))


def events_matching(filters: dict[str, Any]) -> QuerySet[EmailEvent]:
    """Every event matching the validated filters of GET /api/v1/events (all optional): kind,
    provider, bounce, message, campaign (its messages' events), recipient (lower-case), since
    (occurred_at >= since) and until (occurred_at < until)."""
    events = EmailEvent.objects.all()
    exact = {"kind": "kind", "provider": "provider", "bounce": "bounce", "recipient": "recipient"}
    for name, lookup in exact.items():
        if name in filters:
            events = events.filter(**{lookup: filters[name]})
    if "message" in filters:
        events = events.filter(message_id=filters["message"])
    if "campaign" in filters:
        events = events.filter(message__campaign_id=filters["campaign"])
    if "tag" in filters:  # message_tags_idx (or the tagged campaigns' messages), then their events
        events = events.filter(_carrying(filters["tag"], through="message__"))
    if "since" in filters:
        events = events.filter(occurred_at__gte=filters["since"])
    if "until" in filters:
        events = events.filter(occurred_at__lt=filters["until"])
    return with_message_tags(events)


def _rate(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "—"


def feedback_rates_by_provider(days: int = 30) -> dict[str, Any]:
    """Per provider, over messages sent in the last `days`: how many were sent, and how many of
    them hard-bounced or drew a complaint (distinct messages), with the rates as percentages.

    For the admin's provider page only: it reads every message sent in the window (no index on
    sent_at), ~1 s per million rows.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT m.provider, count(*),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM delivery_emailevent AS e WHERE e.message_id = m.id
                          AND e.kind IN ('bounced', 'dropped', 'rejected') AND e.bounce = 'permanent')),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM delivery_emailevent AS e WHERE e.message_id = m.id
                          AND e.kind = 'complained'))
              FROM delivery_message AS m
             WHERE m.status = {MSG.SENT} AND m.sent_at >= now() - make_interval(days => %s)
             GROUP BY m.provider ORDER BY m.provider
            """,
            [days],
        )
        rows = [
            {
                "provider": provider or "—",
                "sent": sent,
                "bounced": bounced,
                "bounce_rate": _rate(bounced, sent),
                "complained": complained,
                "complaint_rate": _rate(complained, sent),
            }
            for provider, sent, bounced, complained in cursor.fetchall()
        ]
    return {"days": days, "rows": rows}


# Engagement for send-time optimization (campaigns/engagement.py composes these into its
# set-based refresh). `engagement_event_range` says which events a fold covers: the next `limit`
# events after id `after`, in id order, up to (not including) the first one created after
# `cutoff`; it returns the fold's watermark `upto` (== after when there is nothing new) and how
# many events (of any kind) lie in (after, upto]. `HUMAN_ENGAGEMENT_CTE` is that range's human
# opens and clicks (id, contact_id of a campaign message or NULL, the lower-cased recipient
# address, kind, occurred_at, the message's sent_at or NULL), for %(after)s and %(upto)s.
#
# Why "settled": ids come from a sequence when a row is inserted, but rows become visible at
# commit, so a long transaction can commit id 100 after id 101 was read and the watermark moved
# past it. The range stops before the first event created after the cutoff (record_events
# stamps created_at with its transaction's start), so an event is missed only if its transaction
# stayed open longer than EMAILHUB_ENGAGEMENT_SETTLE_SECONDS; a webhook batch takes milliseconds.
HUMAN_ENGAGEMENT_CTE = """
human_engagement AS (
    SELECT e.id, m.contact_id, lower(e.recipient) AS recipient, e.kind, e.occurred_at, m.sent_at
      FROM delivery_emailevent AS e
      LEFT JOIN delivery_message AS m ON m.id = e.message_id
     WHERE e.id > %(after)s AND e.id <= %(upto)s
       AND e.classification = 'human' AND e.kind IN ('opened', 'clicked')
)""".strip()


def engagement_event_range(after: int, limit: int, cutoff: datetime) -> tuple[int, int, int]:
    """(upto, count, last) of the settled events a refresh fold covers (see HUMAN_ENGAGEMENT_CTE):
    the watermark after the fold, the number of events in (after, upto] and the highest id among
    them (`after` if none; below `upto` when ids skipped before the first unsettled event).

    Usually one unordered aggregate over the ids after the watermark (a parallel scan on a
    backlog, an index range on a tick); the ordered LIMIT walk only when more than `limit`
    events wait, and a count up to the first unsettled event when one is among them.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), max(id), min(id) FILTER (WHERE created_at > %s)"
            " FROM delivery_emailevent WHERE id > %s",
            [cutoff, after],
        )
        count, last, unsettled = cursor.fetchone()
        if count == 0:
            return after, 0, after
        if count > limit:
            cursor.execute(
                """
                WITH page AS MATERIALIZED (
                    SELECT id, created_at FROM delivery_emailevent WHERE id > %(after)s ORDER BY id LIMIT %(limit)s
                ), w AS (
                    SELECT COALESCE(min(id) FILTER (WHERE created_at > %(cutoff)s) - 1, max(id)) AS upto FROM page
                )
                SELECT w.upto, settled.n, COALESCE(settled.last, %(after)s)
                  FROM w CROSS JOIN LATERAL (
                       SELECT count(*) AS n, max(page.id) AS last FROM page WHERE page.id <= w.upto) AS settled
                """,
                {"after": after, "limit": limit, "cutoff": cutoff},
            )
        elif unsettled is None:
            return int(last), int(count), int(last)
        else:
            cursor.execute(
                "SELECT %s - 1, count(*), COALESCE(max(id), %s) FROM delivery_emailevent WHERE id > %s AND id < %s",
                [unsettled, after, after, unsettled],
            )
        upto, count, last = cursor.fetchone()
        return int(upto), int(count), int(last)


def campaign_engagement_groups(campaign_id: int, holdout_percent: int) -> dict[bool, dict[str, int]]:
    """A campaign's messages by group (True: the holdout, by campaigns.selectors.holdout_sql;
    with holdout_percent 0 everything is False): sent, and of those the messages with a human
    open (or a human click: images blocked) and with a human click. One pass over the campaign's
    messages through the (campaign, contact) unique index."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT {holdout_sql("m.campaign_id", "m.contact_id", "%(holdout)s")} AS holdout,
                   count(*) FILTER (WHERE m.status = {MSG.SENT}),
                   count(*) FILTER (WHERE m.status = {MSG.SENT}
                                      AND (m.first_opened_at IS NOT NULL OR m.first_clicked_at IS NOT NULL)),
                   count(*) FILTER (WHERE m.status = {MSG.SENT} AND m.first_clicked_at IS NOT NULL)
              FROM delivery_message AS m
             WHERE m.campaign_id = %(campaign)s
             GROUP BY 1
            """,
            {"campaign": campaign_id, "holdout": holdout_percent},
        )
        return {
            bool(holdout): {"sent": sent, "opened": opened, "clicked": clicked}
            for holdout, sent, opened, clicked in cursor.fetchall()
        }


def campaign_hits(campaign_id: int) -> tuple[int, dict[tuple[str, str], int]]:
    """A campaign's delivered messages (distinct, from provider events), and its open and click
    hits by (kind, classification): every hit, human or not."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.kind, e.classification, count(*), count(DISTINCT e.message_id)
              FROM delivery_emailevent AS e
              JOIN delivery_message AS m ON m.id = e.message_id
             WHERE m.campaign_id = %s AND e.kind IN ('delivered', 'opened', 'clicked')
             GROUP BY 1, 2
            """,
            [campaign_id],
        )
        rows = cursor.fetchall()
    delivered = sum(messages for kind, _, _, messages in rows if kind == "delivered")
    return delivered, {(kind, cls): hits for kind, cls, hits, _ in rows if kind != "delivered"}


# The admin dashboard's recent failures and feedback look at the newest rows only (by primary
# key): neither `status = 'failed'` nor an event's kind has an index (one would cost every
# fan-out insert or webhook), so "the last N" without a bound would scan the whole table when
# failures are rare. Within the newest RECENT_SCAN rows, a backward primary-key range scan.
RECENT_SCAN = 50_000


def recent_failures(limit: int = 10, scan: int = RECENT_SCAN) -> list[dict[str, Any]]:
    """The newest `failed` messages among the last `scan` messages, newest first, with their
    last error."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT m.id, m.to_email, m.priority, m.provider, m.attempts, m.last_error, m.campaign_id,
                   COALESCE(m.claimed_at, m.queued_at, m.created_at)
              FROM delivery_message AS m
             WHERE m.id > (SELECT COALESCE(max(id), 0) FROM delivery_message) - %s
               AND m.status = {MSG.FAILED}
             ORDER BY m.id DESC
             LIMIT %s
            """,
            [scan, limit],
        )
        columns = ("id", "to_email", "priority", "provider", "attempts", "last_error", "campaign_id", "at")
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def recent_feedback(limit: int = 10, scan: int = RECENT_SCAN) -> list[dict[str, Any]]:
    """The newest bounce and complaint events (bounced, dropped, rejected, complained) among the
    last `scan` events, newest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.id, e.kind, e.bounce, e.recipient, e.provider, e.detail, e.message_id, e.occurred_at
              FROM delivery_emailevent AS e
             WHERE e.id > (SELECT COALESCE(max(id), 0) FROM delivery_emailevent) - %s
               AND e.kind IN ('bounced', 'dropped', 'rejected', 'complained')
             ORDER BY e.id DESC
             LIMIT %s
            """,
            [scan, limit],
        )
        columns = ("id", "kind", "bounce", "recipient", "provider", "detail", "message_id", "occurred_at")
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


# --- engagement, for segments (campaigns.segment_sql) ----------------------------------------------

# What a segment's engagement condition counts, as the events of that kind. Opens and clicks are
# the classifier's human ones only: machine, proxy, bot and scanner hits are not engagement.
# Written as literals from the enums (these are emailhub's names, never a value a user typed), so
# the planner can prove emailevent_human_idx's and emailevent_feedback_idx's predicates from them.
_EVENT = literals(EmailEvent.Kind)
_HUMAN = literal(EmailEvent.Classification.HUMAN)
ENGAGEMENT_EVENTS = {
    # A person's click is an open too (the pixel may be blocked): as record_events sets a
    # message's first_opened_at, and as the reports count opens.
    "opened": f"e.kind IN ({_EVENT.OPENED}, {_EVENT.CLICKED}) AND e.classification = {_HUMAN}",
    "clicked": f"e.kind = {_EVENT.CLICKED} AND e.classification = {_HUMAN}",
    "bounced": f"e.kind = {_EVENT.BOUNCED}",
    "complained": f"e.kind = {_EVENT.COMPLAINED}",
    "unsubscribed": f"e.kind = {_EVENT.UNSUBSCRIBED}",
}
# Every row an engagement condition can read: those of emailevent_human_idx and
# emailevent_feedback_idx (delivery/models.py), found by address through them.
ENGAGEMENT_INDEXED = (
    f"(e.kind IN ({_EVENT.OPENED}, {_EVENT.CLICKED}) AND e.classification = {_HUMAN})"
    f" OR e.kind IN ({_EVENT.BOUNCED}, {_EVENT.COMPLAINED}, {_EVENT.UNSUBSCRIBED})"
)


def engagement_sql(
    kind: str,
    *,
    at_least: int,
    since: str | None,
    until: str | None,
    campaign: str | None,
    tag: str | None,
    tagged_campaigns: str | None,
    set_based: bool = False,
) -> str:
    """SQL boolean: the contact aliased `c` (columns id, email) had `kind` ("sent" or one of
    ENGAGEMENT_EVENTS) at least `at_least` times (0: never), from `since` (inclusive) until
    `until` (exclusive), of campaign `campaign`, or of mail carrying `tag` (the message's own
    tags, or a campaign among `tagged_campaigns`, an array of ids). Every argument but `kind`,
    `at_least` and `set_based` is a placeholder (`%(name)s`) the caller binds, or None; no value
    is SQL text.

    A campaign's mail is found by (campaign, contact) (uniq_campaign_contact), and whether it was
    opened or clicked at all by the message's first_opened_at / first_clicked_at (human hits
    only, set by events.record_events): one row, no events read. Any other mail by its address:
    `sent` by message_to_email_upper_idx, events by emailevent_human_idx / emailevent_feedback_idx
    (recipient, kind, occurred_at). "At least N" (N > 1) reads at most N rows per contact, or with
    `set_based` (a count over every contact) groups the events once, by address, instead of
    probing a million times (bench/segments.py: 6.8 s → 2.0 s at 1M contacts, 10M events).
    """
    if (
        campaign is not None
        and kind in ("opened", "clicked")
        and at_least <= 1
        and since is None
        and until is None
        and tag is None
    ):
        first = "m.first_opened_at" if kind == "opened" else "m.first_clicked_at"
        hits = (
            f"SELECT 1 FROM delivery_message AS m"
            f" WHERE m.campaign_id = {campaign} AND m.contact_id = c.id AND {first} IS NOT NULL"
        )
        return _any(hits, negate=at_least == 0, probe=not set_based)
    if kind == "sent":
        at, key, where = "m.sent_at", "upper(m.to_email)", ["m.sent_at IS NOT NULL"]
        source = "delivery_message AS m"
        if campaign is not None:
            where += [f"m.campaign_id = {campaign}", "m.contact_id = c.id"]
        else:
            where.append("upper(m.to_email) = upper(c.email)")
    else:
        at, key, where = "e.occurred_at", "e.recipient", [ENGAGEMENT_EVENTS[kind]]
        if campaign is not None:
            source = "delivery_message AS m JOIN delivery_emailevent AS e ON e.message_id = m.id"
            where += [f"m.campaign_id = {campaign}", "m.contact_id = c.id"]
        elif tag is not None:
            source = "delivery_emailevent AS e JOIN delivery_message AS m ON m.id = e.message_id"
            where.append("e.recipient = c.email")
        else:
            source = "delivery_emailevent AS e"
            where.append("e.recipient = c.email")
    if tag is not None:
        where.append(f"(m.tags @> jsonb_build_array({tag}::text) OR m.campaign_id = ANY({tagged_campaigns}))")
    if since is not None:
        where.append(f"{at} >= {since}")
    if until is not None:
        where.append(f"{at} < {until}")
    if at_least <= 1:
        return _any(
            f"SELECT 1 FROM {source} WHERE {' AND '.join(where)}", negate=at_least == 0, probe=not set_based
        )
    if set_based and campaign is None:
        # The addresses with N or more, grouped once; the contact's own term leaves the WHERE.
        contact_term = "upper(m.to_email) = upper(c.email)" if kind == "sent" else "e.recipient = c.email"
        grouped = " AND ".join(term for term in where if term != contact_term)
        mine = "upper(c.email)" if kind == "sent" else "c.email"
        return (
            f"({mine} IN (SELECT {key} FROM {source} WHERE {grouped}"
            f" GROUP BY {key} HAVING count(*) >= {int(at_least)}))"
        )
    # At most `at_least` rows are read per contact: enough to know.
    hits = f"SELECT 1 FROM {source} WHERE {' AND '.join(where)}"
    return f"((SELECT count(*) FROM ({hits} LIMIT {int(at_least)}) AS hits) >= {int(at_least)})"


def _any(hits: str, *, negate: bool, probe: bool) -> str:
    """SQL boolean: the query `hits` finds a row (none, with `negate`).

    For a statement over every contact (a count) an EXISTS, which the planner may turn into a
    hash semi-join over the window's events. For a fan-out step or a sample, a scalar subquery
    with LIMIT 1, which it cannot: one index probe per contact, whatever its estimates say. With
    EXISTS a step of 20,000 contacts once hashed the window's 1.35M human opens and clicks
    (1.19 s a step, bench/fanout.py --segment at 0.08× COPY instead of 0.41×)."""
    if probe:
        return f"(({hits} LIMIT 1) IS {'NULL' if negate else 'NOT NULL'})"
    return f"{'NOT ' if negate else ''}EXISTS ({hits})"
