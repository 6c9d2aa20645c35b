"""Reads of the campaigns tables for other apps.

Some reads have to be part of another app's statement to stay set-based: fan-out's
`INSERT … SELECT` into delivery_message walks a list's audience, and the send claim checks each
message's campaign and address in the same `UPDATE`. Those reads are SQL fragments, defined here
so that what "the audience of a list", "a suppressed address" and "a campaign's status" mean is
written once, by the app that owns these tables; the caller composes them into its own
statement. Everything else is an ordinary function returning values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection

from campaigns.models import Campaign, Contact
from core.sql import literals

# Statuses as SQL literals from the models' enums (core.sql): `{CONTACT.ACTIVE}` is `'active'`.
CAMPAIGN = literals(Campaign.Status)
CONTACT = literals(Contact.Status)

# The tables a step joins (below), whose planner statistics must be current when fan-out starts,
# and which an import fills in bulk (core/statistics.py).
AUDIENCE_TABLES = ("campaigns_contact", "campaigns_listmembership")

# Who fan-out may mail among contacts aliased `c` (every audience says it through this): active
# and not suppressed.
MAILABLE_SQL = (
    f"c.status = {CONTACT.ACTIVE}"
    " AND NOT EXISTS (SELECT 1 FROM campaigns_suppression AS s WHERE s.email = c.email)"
)

# The next %(limit)s members of list %(list_id)s after contact id %(cursor)s, in contact-id order
# (keyset pagination over the (list, contact) unique index), then those of them fan-out may mail:
# active and not suppressed. Two CTEs, `members` (every member looked at: the cursor moves past
# all of them) and `audience` (contact id, email, timezone); `audience` is referenced once, so
# PostgreSQL inlines it and the plan is that of one INSERT … SELECT over the join.
AUDIENCE_STEP_CTES = f"""
members AS (
    SELECT lm.contact_id
      FROM campaigns_listmembership AS lm
     WHERE lm.contact_list_id = %(list_id)s AND lm.contact_id > %(cursor)s
     ORDER BY lm.contact_id
     LIMIT %(limit)s
), audience AS (
    SELECT c.id, c.email, c.timezone
      FROM members
      JOIN campaigns_contact AS c ON c.id = members.contact_id
     WHERE {MAILABLE_SQL}
       -- The step's contact-id range, said to the planner: without it the merge join walked the
       -- contacts' primary key from the table's first id up to the step's, every step (1,020,001
       -- index entries for a step of 20,000 members in bench/fanout.py's EXPLAIN): quadratic in
       -- the list's length.
       AND c.id BETWEEN (SELECT min(m.contact_id) FROM members AS m) AND (SELECT max(m.contact_id) FROM members AS m)
)""".strip()


# A segment's step (a campaign whose audience is a segment, or a list narrowed by one): the walk
# (`members`: the next %(limit)s members of the list, or with no list the next %(limit)s
# contacts, by id), `matching` (the members matching the filter, whatever their status: the
# step counts them), and `audience` (those of them fan-out may mail). `condition` is the filter
# compiled by campaigns.segment_sql: an SQL boolean over `c` whose values are parameters.
_CONTACT_WALK = """
    SELECT c.id AS contact_id
      FROM campaigns_contact AS c
     WHERE c.id > %(cursor)s
     ORDER BY c.id
     LIMIT %(limit)s"""
_LIST_WALK = """
    SELECT lm.contact_id
      FROM campaigns_listmembership AS lm
     WHERE lm.contact_list_id = %(list_id)s AND lm.contact_id > %(cursor)s
     ORDER BY lm.contact_id
     LIMIT %(limit)s"""


def audience_step_ctes(*, list_walk: bool, condition: str | None) -> str:
    """The CTEs `members`, `matching` and `audience` of a segment's fan-out step (see above)."""
    return f"""
members AS ({_LIST_WALK if list_walk else _CONTACT_WALK}
), matching AS MATERIALIZED (
    SELECT c.id, c.email, c.timezone, c.status
      FROM members
      JOIN campaigns_contact AS c ON c.id = members.contact_id
     WHERE c.id BETWEEN (SELECT min(m.contact_id) FROM members AS m) AND (SELECT max(m.contact_id) FROM members AS m)
       AND c.anonymised_at IS NULL
       AND ({condition or "true"})
), audience AS (
    SELECT c.id, c.email, c.timezone
      FROM matching AS c
     WHERE {MAILABLE_SQL}
)""".strip()


@dataclass
class WindowPlan:
    """An optimized campaign's due-instant tables (campaigns.optimized builds them), parallel
    lists that fan-out's statement joins as arrays: `slots` (timezone, local hour) → the hour's
    first instant in the window, `fallbacks` timezone → the population's best hour there."""

    window_start: datetime
    holdout_percent: int
    slot_zones: list[str] = field(default_factory=list)
    slot_hours: list[int] = field(default_factory=list)
    slot_dues: list[datetime] = field(default_factory=list)
    fallback_zones: list[str] = field(default_factory=list)
    fallback_dues: list[datetime] = field(default_factory=list)

    def dues(self) -> set[datetime]:
        """Every instant a message of this plan can be due at (the slot units to index)."""
        return {self.window_start, *self.slot_dues, *self.fallback_dues}


def best_hour_sql(contact_id: str) -> str:
    """SQL scalar: the stored best local hour (0..23) of the contact whose id is the expression
    `contact_id`, NULL without a profile (one primary-key lookup)."""
    return f"(SELECT p.best_hour FROM campaigns_engagementprofile AS p WHERE p.contact_id = {contact_id})"


def holdout_sql(campaign_id: str, contact_id: str, percent: str) -> str:
    """SQL boolean: the contact is in the campaign's holdout group (`percent` of 0..100).

    A stable hash of "campaign:contact" taken modulo 100: the same contacts at every fan-out
    step, at a resumed fan-out and in the report, and a different sample for every campaign.
    md5 rather than hashtext: its value is fixed forever, while hashtext is internal to
    PostgreSQL and may change with a major version, which would move past campaigns' groups.
    """
    return (
        f"(('x' || substr(md5({campaign_id}::text || ':' || {contact_id}::text), 1, 8))::bit(32)::bigint"
        f" %% 100 < {percent})"
    )


def suppressed_sql(address: str, *, marketing: str) -> str:
    """SQL boolean: the address expression `address` is suppressed for this message.

    `marketing` is an SQL boolean saying whether the message is marketing mail (a campaign's,
    or a transactional one that carries an unsubscribe link). An `unsubscribed` suppression
    stops marketing mail only: someone who unsubscribed from a newsletter still gets their
    password reset. Bounced, complained and manual suppressions stop everything. Addresses are
    stored lower-case.
    """
    return (
        "EXISTS (SELECT 1 FROM campaigns_suppression AS s"
        f" WHERE s.email = lower({address}) AND (s.reason <> 'unsubscribed' OR ({marketing})))"
    )


def campaign_ids_tagged(tag: str) -> list[int]:
    """The ids of the campaigns carrying `tag` (a small table: no index), whose messages carry
    it too."""
    return list(Campaign.objects.filter(tags__contains=[tag]).values_list("id", flat=True))


def campaign_status_sql(campaign_id: str) -> str:
    """SQL scalar: the status of the campaign whose id is the expression `campaign_id` (NULL if none)."""
    return f"(SELECT c.status FROM campaigns_campaign AS c WHERE c.id = {campaign_id})"


def campaign_tags_sql(campaign_id: str) -> str:
    """SQL scalar: the tags (jsonb) of the campaign whose id is the expression `campaign_id`."""
    return f"(SELECT c.tags FROM campaigns_campaign AS c WHERE c.id = {campaign_id})"


def audience_size(contact_list_id: int) -> int:
    """What fan-out would create now: the list's active members whose address is not suppressed."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT count(*) FROM campaigns_listmembership AS lm
              JOIN campaigns_contact AS c ON c.id = lm.contact_id
             WHERE lm.contact_list_id = %s AND {MAILABLE_SQL}
            """,
            [contact_list_id],
        )
        return int(cursor.fetchone()[0])


# The schedule types whose messages fan-out writes `scheduled`, each due at an instant of its
# own (a contact's local time, its best hour); immediate and `at` campaigns write `queued` ones.
DUE_INSTANT_TYPES = ("local_time", "optimized")


def waits_for_due_instant(status: str, schedule_type: str, finished: int) -> bool:
    """A sending campaign that may still be waiting for its first due instant: its messages are
    each due at an instant of their own and none has finished. Whether it is waiting is its
    earliest due message's instant (delivery.selectors.next_sends), asked for these only."""
    return status == "sending" and schedule_type in DUE_INSTANT_TYPES and finished == 0


def waiting_until(
    *,
    status: str,
    schedule_type: str,
    scheduled_at: datetime | None,
    finished: int,
    next_due: datetime | None,
    now: datetime,
) -> datetime | None:
    """When a campaign that has sent nothing yet sends its first message; None while it sends
    (and for a draft, a paused or a finished one). A scheduled (`at`) campaign waits for
    `scheduled_at`; a sending local-time or optimized one, for its earliest due message
    (`next_due`), while that is still to come.

    One case reads as waiting though it is not: the first slot already handed to the workers
    (its messages `queued`, not in the due index) and none of them finished yet. Telling it
    apart would need a count of the campaign's queued messages, which no index serves; it lasts
    until the first of them is sent (seconds, unless the bulk queue is backed up)."""
    if status == "scheduled":
        return scheduled_at
    if waits_for_due_instant(status, schedule_type, finished) and next_due is not None and next_due > now:
        return next_due
    return None


def campaigns_in_flight() -> tuple[datetime, list[dict[str, object]]]:
    """The database's now() and every campaign scheduled, sending or paused mid-send, with its
    counters (for the admin's dashboard). One query on the small campaigns table."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT now(), c.id, c.name, c.status, c.priority, c.schedule_type, c.total_count,
                   c.sent_count, c.failed_count, c.suppressed_count, c.cancelled_count,
                   c.fanout_done, c.started_at, c.scheduled_at
              FROM campaigns_campaign AS c
             WHERE c.status IN ({CAMPAIGN.SCHEDULED}, {CAMPAIGN.SENDING}, {CAMPAIGN.PAUSED}) AND c.archived_at IS NULL
             ORDER BY c.id
            """
        )
        rows = cursor.fetchall()
    if not rows:
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0], []
    columns = (
        "id", "name", "status", "priority", "schedule_type", "total", "sent", "failed",
        "suppressed", "cancelled", "fanout_done", "started_at", "scheduled_at",
    )  # fmt: skip
    return rows[0][0], [dict(zip(columns, row[1:], strict=True)) for row in rows]
