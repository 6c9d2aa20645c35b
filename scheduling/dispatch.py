"""Turning claimed units into work: rows move to `queued` and their send tasks go to the outbox
(and webhook deliveries due for a retry go back to `pending`, their endpoints' tasks likewise).

One PostgreSQL transaction per claim: conditional UPDATEs (only rows still `scheduled` or in
`retry_wait` move, so a unit dispatched twice moves nothing the second time) plus the outbox
rows, published after commit. Only then is the claim acked in Redis.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction

from campaigns.lifecycle import start_campaigns
from core.schedule_index import Unit, index_after_commit, message_unit
from delivery.services import send_tasks, transitions
from outbound.services import delivering

logger = logging.getLogger(__name__)


def dispatch(units: list[Unit], timings: dict[str, float] | None = None) -> int:
    """Queue the messages (and start the campaigns) behind `units`; return messages queued.

    With `timings`, its `sql` and `commit` entries get the seconds spent in the transaction's
    statements and in the commit with what runs after it (publishing the send tasks)."""
    message_ids = [u.id for u in units if u.kind == "m"]
    slots = [(u.id, u.due_epoch) for u in units if u.kind == "c"]
    campaigns = [u.id for u in units if u.kind == "a"]
    retries = [u.id for u in units if u.kind == "w"]
    queued: list[tuple[int, str]] = []
    started = time.perf_counter()
    with transaction.atomic():
        if message_ids:
            moved, early = transitions.queue_due(message_ids)
            queued += moved
            if early:  # back in the index at their real time
                index_after_commit([(message_unit(message_id), due) for message_id, due in early])
        for campaign_id, epoch in slots:
            queued += transitions.queue_slot(campaign_id, epoch)
        if campaigns:
            start_campaigns(campaigns)
        send_tasks.record_sends_by_priority(queued)
        if retries:
            delivering.release(retries)
        statements_done = time.perf_counter()
    if timings is not None:
        timings["sql"] = statements_done - started
        timings["commit"] = time.perf_counter() - statements_done
    return len(queued)
