"""Recording what happened to a batch: message statuses, suppressions and campaign counters.

Everything is written in one transaction, and every UPDATE is conditional on the row still
being `sending` and RETURNs the campaign of each row it moved. The campaign counters are moved
by exactly those rows, so they never drift from the messages, whatever was redelivered or
requeued meanwhile.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from campaigns.models import Suppression

# Campaign counter per final status.
_COUNTERS = {
    "sent": "sent_count",
    "failed": "failed_count",
    "suppressed": "suppressed_count",
    "cancelled": "cancelled_count",
}


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


def record(outcomes: Outcomes) -> None:
    moved: Counter[tuple[int, str]] = Counter()
    with transaction.atomic(), connection.cursor() as cursor:
        for provider, sent in outcomes.sent.items():
            if sent:
                ids, provider_ids = zip(*sent, strict=True)
                cursor.execute(
                    """
                    UPDATE delivery_message AS m
                       SET status = 'sent', sent_at = clock_timestamp(), provider = %s,
                           provider_message_id = v.provider_message_id, last_error = NULL
                      FROM unnest(%s::bigint[], %s::text[]) AS v(id, provider_message_id)
                     WHERE m.id = v.id AND m.status = 'sending'
                    RETURNING m.campaign_id
                    """,
                    [provider, list(ids), list(provider_ids)],
                )
                _count(moved, cursor.fetchall(), "sent")
        for status, rows in (("failed", outcomes.failed), ("suppressed", outcomes.suppressed)):
            if rows:
                ids, errors = zip(*rows, strict=True)
                cursor.execute(
                    """
                    UPDATE delivery_message AS m
                       SET status = %s, last_error = v.error
                      FROM unnest(%s::bigint[], %s::text[]) AS v(id, error)
                     WHERE m.id = v.id AND m.status = 'sending'
                    RETURNING m.campaign_id
                    """,
                    [status, list(ids), list(errors)],
                )
                _count(moved, cursor.fetchall(), status)
        retried = []
        for waiting, given_back in ((outcomes.retry, 0), (outcomes.deferred, 1)):
            if not waiting:
                continue
            ids, due, errors = zip(*waiting, strict=True)
            # A campaign cancelled while this batch was in flight gets no retry: the message is
            # cancelled (and counted) instead of waiting for a retry no one would ever claim.
            cursor.execute(
                """
                UPDATE delivery_message AS m
                   SET status = CASE WHEN c.status = 'cancelled' THEN 'cancelled' ELSE 'retry_wait' END,
                       due_at = v.due_at, last_error = v.error,
                       attempts = GREATEST(m.attempts - %s, 0)
                  FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[]) AS v(id, due_at, error)
                  LEFT JOIN campaigns_campaign AS c ON c.id = (SELECT campaign_id FROM delivery_message WHERE id = v.id)
                 WHERE m.id = v.id AND m.status = 'sending'
                RETURNING m.id, m.campaign_id, m.status, m.due_at
                """,
                [given_back, list(ids), list(due), list(errors)],
            )
            retried += cursor.fetchall()
        if retried:
            _count(moved, [(c,) for _, c, status, _ in retried if status == "cancelled"], "cancelled")
            from scheduling.schedule import index_after_commit, message_unit

            index_after_commit(
                [(message_unit(i), d) for i, _, status, d in retried if status == "retry_wait"]
            )
        if outcomes.bounced:
            Suppression.objects.bulk_create(
                [
                    Suppression(email=email.lower(), reason=Suppression.Reason.BOUNCED, detail=detail[:2000])
                    for email, detail in outcomes.bounced
                ],
                ignore_conflicts=True,
            )
        move_campaign_counters(cursor, moved)


def _count(moved: Counter[tuple[int, str]], rows: list[tuple[int | None]], status: str) -> None:
    for (campaign_id,) in rows:
        if campaign_id is not None:
            moved[(campaign_id, status)] += 1


def move_campaign_counters(cursor: CursorWrapper, moved: Counter[tuple[int, str]]) -> None:
    """Move each campaign's counters by (campaign id, final status) → rows; complete it if done."""
    by_campaign: dict[int, dict[str, int]] = defaultdict(dict)
    for (campaign_id, status), count in moved.items():
        by_campaign[campaign_id][_COUNTERS[status]] = count
    for campaign_id, counts in sorted(by_campaign.items()):  # a fixed order: no deadlocks
        sent, failed, suppressed, cancelled = (
            counts.get(c, 0) for c in ("sent_count", "failed_count", "suppressed_count", "cancelled_count")
        )
        cursor.execute(
            """
            UPDATE campaigns_campaign
               SET sent_count = sent_count + %(sent)s,
                   failed_count = failed_count + %(failed)s,
                   suppressed_count = suppressed_count + %(suppressed)s,
                   cancelled_count = cancelled_count + %(cancelled)s,
                   status = CASE WHEN status = 'sending' AND fanout_done
                                  AND sent_count + failed_count + suppressed_count + cancelled_count
                                      + %(done)s >= total_count
                                 THEN 'completed' ELSE status END,
                   completed_at = CASE WHEN status = 'sending' AND fanout_done
                                  AND sent_count + failed_count + suppressed_count + cancelled_count
                                      + %(done)s >= total_count
                                 THEN now() ELSE completed_at END,
                   updated_at = now()
             WHERE id = %(id)s
            """,
            {
                "sent": sent,
                "failed": failed,
                "suppressed": suppressed,
                "cancelled": cancelled,
                "done": sent + failed + suppressed + cancelled,
                "id": campaign_id,
            },
        )
