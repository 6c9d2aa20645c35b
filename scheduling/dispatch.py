"""Turning claimed units into work: rows move to `queued` and their send tasks go to the outbox.

One PostgreSQL transaction per claim: conditional UPDATEs (only rows still `scheduled` or in
`retry_wait` move, so a unit dispatched twice moves nothing the second time) plus the outbox
rows, published after commit. Only then is the claim acked in Redis.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from delivery.services import outbox
from scheduling.schedule import Unit, index_after_commit, message_unit

logger = logging.getLogger(__name__)


def dispatch(units: list[Unit]) -> int:
    """Queue the messages (and start the campaigns) behind `units`; return messages queued."""
    message_ids = [u.id for u in units if u.kind == "m"]
    slots = [(u.id, u.due_epoch) for u in units if u.kind == "c"]
    campaigns = [u.id for u in units if u.kind == "a"]
    queued: list[tuple[int, str]] = []
    with transaction.atomic(), connection.cursor() as cursor:
        if message_ids:
            # Only rows that are due: a unit can come early (the reconciler read a retry just
            # before it was rescheduled later, and the index keeps the earlier score).
            cursor.execute(
                """
                UPDATE delivery_message SET status = 'queued', queued_at = clock_timestamp()
                 WHERE id = ANY(%s) AND status IN ('scheduled', 'retry_wait')
                   AND due_at <= clock_timestamp() + interval '1 second'
                RETURNING id, priority
                """,
                [message_ids],
            )
            queued += cursor.fetchall()
            moved = {message_id for message_id, _ in queued}
            cursor.execute(
                """
                SELECT id, due_at FROM delivery_message
                 WHERE id = ANY(%s) AND status IN ('scheduled', 'retry_wait')
                """,
                [[i for i in message_ids if i not in moved]],
            )
            early = cursor.fetchall()
            if early:  # back in the index at their real time
                index_after_commit([(message_unit(message_id), due) for message_id, due in early])
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
