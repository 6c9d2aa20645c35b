"""A campaign's progress: its counters and its completion, written only here (and by fan-out,
which owns `total_count`, `excluded_count` and the cursor).

Delivery calls `move_counters` inside the transaction that moved the message rows it counts
(same connection, same `atomic`), so the counters never drift from the messages whatever was
redelivered or requeued meanwhile. This module imports nothing of delivery.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from django.db import connection

from campaigns.models import Campaign
from core import outbound_events
from core.sql import literals

# Statuses as SQL literals from the model's enum (core.sql): `{CAMPAIGN.SENDING}` is `'sending'`.
CAMPAIGN = literals(Campaign.Status)

# Campaign counter per final message status.
COUNTERS = {
    "sent": "sent_count",
    "failed": "failed_count",
    "suppressed": "suppressed_count",
    "cancelled": "cancelled_count",
}


def _finished(added: str = "0") -> str:
    """The completion rule, as SQL over a campaigns_campaign row: fan-out is done and every
    message is finished (`added` more finished than its counters say so far)."""
    return (
        f"status = {CAMPAIGN.SENDING} AND fanout_done"
        " AND sent_count + failed_count + suppressed_count + cancelled_count"
        f" + {added} >= total_count"
    )


_FINISHED_WITH_DONE = _finished("%(done)s")

# campaign.completed for the application (core.outbound_events), in the statement that completed
# it: a campaign is completed here only, and only from `sending`, so a row returned completed
# with completed_at = now() was completed by this statement's transaction. Campaigns belong to no
# API key: endpoints that see every key's mail (a `manage` key's) hear of them.
_COMPLETED = outbound_events.insert_sql(
    "moved",
    type_sql=f"CASE WHEN status = {CAMPAIGN.COMPLETED} AND completed_at = now() THEN 'campaign.completed' END",
    owner_sql="NULL::bigint",
    data_sql=f"""jsonb_build_object(
        'campaign_id', id, 'name', name, 'tags', coalesce(tags, '[]'::jsonb),
        'total', total_count, 'sent', sent_count, 'failed', failed_count,
        'suppressed', suppressed_count, 'cancelled', cancelled_count, 'excluded', excluded_count,
        'completed_at', {outbound_events.iso_sql("completed_at")})""",
)
_RETURNING = (
    "RETURNING id, name, tags, status, completed_at, total_count, sent_count, failed_count,"
    " suppressed_count, cancelled_count, excluded_count"
)

_MOVE_SQL = f"""
WITH moved AS (
UPDATE campaigns_campaign
   SET sent_count = sent_count + %(sent)s,
       failed_count = failed_count + %(failed)s,
       suppressed_count = suppressed_count + %(suppressed)s,
       cancelled_count = cancelled_count + %(cancelled)s,
       status = CASE WHEN {_FINISHED_WITH_DONE} THEN {CAMPAIGN.COMPLETED} ELSE status END,
       completed_at = CASE WHEN {_FINISHED_WITH_DONE} THEN now() ELSE completed_at END,
       updated_at = now()
 WHERE id = %(id)s
{_RETURNING}
), announced AS ({_COMPLETED})
SELECT count(*) FROM moved
"""

_COMPLETE_SQL = f"""
WITH moved AS (
UPDATE campaigns_campaign
   SET status = {CAMPAIGN.COMPLETED}, completed_at = now(), updated_at = now()
 WHERE id = ANY(%s) AND {_finished()}
{_RETURNING}
), announced AS ({_COMPLETED})
SELECT id FROM moved
"""


def move_counters(moved: Counter[tuple[int, str]]) -> None:
    """Move each campaign's counters by (campaign id, final status) → rows (negative: rows that
    are unfinished again), and complete it if that finished it. Runs in the caller's transaction."""
    by_campaign: dict[int, dict[str, int]] = defaultdict(dict)
    for (campaign_id, status), count in moved.items():
        by_campaign[campaign_id][COUNTERS[status]] = count
    with connection.cursor() as cursor:
        for campaign_id, counts in sorted(by_campaign.items()):  # a fixed order: no deadlocks
            sent, failed, suppressed, cancelled = (counts.get(c, 0) for c in COUNTERS.values())
            cursor.execute(
                _MOVE_SQL,
                {
                    "sent": sent,
                    "failed": failed,
                    "suppressed": suppressed,
                    "cancelled": cancelled,
                    "done": sent + failed + suppressed + cancelled,
                    "id": campaign_id,
                },
            )


def complete_if_finished(campaign_ids: Sequence[int]) -> list[int]:
    """Mark these sending campaigns completed if fan-out is done and every message is finished;
    return those completed.

    Send workers complete a campaign as they record its last messages (`move_counters`); this
    covers the cases where no message is left to record (an empty list, or the last ones
    finished while paused).
    """
    with connection.cursor() as cursor:
        cursor.execute(_COMPLETE_SQL, [list(campaign_ids)])
        return [row[0] for row in cursor.fetchall()]


# Campaign counter per feedback category (a Suppression.Reason): what recipients and providers
# reported after sending. Moved once per message and category by delivery.services.events.
FEEDBACK_COUNTERS = {
    "bounced": "bounced_count",
    "complained": "complained_count",
    "unsubscribed": "unsubscribed_count",
}

_MOVE_FEEDBACK_SQL = """
UPDATE campaigns_campaign
   SET bounced_count = bounced_count + %(bounced)s,
       complained_count = complained_count + %(complained)s,
       unsubscribed_count = unsubscribed_count + %(unsubscribed)s,
       updated_at = now()
 WHERE id = %(id)s
"""


def move_feedback_counters(moved: Counter[tuple[int, str]]) -> None:
    """Add to each campaign's feedback counters by (campaign id, category) → messages. Feedback
    never completes a campaign (it arrives after the message finished). Runs in the caller's
    transaction; the caller guarantees a message is counted once per category."""
    by_campaign: dict[int, dict[str, int]] = defaultdict(dict)
    for (campaign_id, category), count in moved.items():
        by_campaign[campaign_id][category] = by_campaign[campaign_id].get(category, 0) + count
    with connection.cursor() as cursor:
        for campaign_id, counts in sorted(by_campaign.items()):  # a fixed order: no deadlocks
            cursor.execute(
                _MOVE_FEEDBACK_SQL,
                {**{c: counts.get(c, 0) for c in FEEDBACK_COUNTERS}, "id": campaign_id},
            )
