"""Turning claimed units into work: rows move to `queued` and their send tasks go to the outbox.

One PostgreSQL transaction per claim: conditional UPDATEs (only rows still `scheduled` or in
`retry_wait` move, so a unit dispatched twice moves nothing the second time) plus the outbox
rows, published after commit. Only then is the claim acked in Redis.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from delivery.services import outbox
from scheduling.schedule import Unit

logger = logging.getLogger(__name__)


def dispatch(units: list[Unit]) -> int:
    """Queue the messages (and start the campaigns) behind `units`; return messages queued."""
    message_ids = [u.id for u in units if u.kind == "m"]
    slots = [(u.id, u.due_epoch) for u in units if u.kind == "c"]
    campaigns = [u.id for u in units if u.kind == "a"]
    queued: list[tuple[int, str]] = []
    with transaction.atomic(), connection.cursor() as cursor:
        if message_ids:
            cursor.execute(
                """
                UPDATE delivery_message SET status = 'queued', queued_at = clock_timestamp()
                 WHERE id = ANY(%s) AND status IN ('scheduled', 'retry_wait')
                RETURNING id, priority
                """,
                [message_ids],
            )
            queued += cursor.fetchall()
        for campaign_id, epoch in slots:
            cursor.execute(
                """
                UPDATE delivery_message SET status = 'queued', queued_at = clock_timestamp()
                 WHERE status = 'scheduled' AND due_at = to_timestamp(%s) AND campaign_id = %s
                RETURNING id, priority
                """,
                [epoch, campaign_id],
            )
            queued += cursor.fetchall()
        if campaigns:
            from campaigns.lifecycle import start_campaigns

            start_campaigns(campaigns)
        outbox.record_sends_by_priority(queued)
    return len(queued)
