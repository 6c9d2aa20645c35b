"""A periodic sweep over PostgreSQL: messages whose worker died mid-send go back to the queue."""

from __future__ import annotations

import logging
from collections import Counter

from django.conf import settings
from django.db import connection, transaction

from delivery.services import outbox
from delivery.services.recording import move_campaign_counters

logger = logging.getLogger(__name__)


def requeue_stale_sending() -> int:
    """Give back messages whose worker died mid-send (claimed longer ago than the lease).

    Such a message may or may not have reached the provider before the crash; this is the one
    case in which emailhub can send twice, and it is documented as such.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE delivery_message
               SET status = CASE WHEN attempts >= %s THEN 'failed' ELSE 'queued' END,
                   last_error = CASE WHEN attempts >= %s
                                     THEN 'gave up: its worker died while sending, ' || attempts || ' attempt(s)'
                                     ELSE last_error END,
                   queued_at = clock_timestamp()
             WHERE status = 'sending'
               AND claimed_at < clock_timestamp() - make_interval(secs => %s)
            RETURNING id, priority, status, campaign_id
            """,
            [
                settings.EMAILHUB_MAX_ATTEMPTS,
                settings.EMAILHUB_MAX_ATTEMPTS,
                settings.EMAILHUB_SENDING_LEASE_SECONDS,
            ],
        )
        returned = cursor.fetchall()
        rows = [(message_id, priority) for message_id, priority, status, _ in returned if status == "queued"]
        failed = Counter(
            (campaign_id, "failed")
            for _, _, status, campaign_id in returned
            if status == "failed" and campaign_id
        )
        move_campaign_counters(cursor, failed)
        outbox.record_sends_by_priority(rows)
    if rows:
        logger.warning("requeued %d message(s) left in `sending` by a dead worker", len(rows))
    return len(rows)
