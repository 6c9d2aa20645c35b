"""A periodic sweep over PostgreSQL: messages whose worker died (or stalled) mid-send go back to the queue."""

from __future__ import annotations

import logging
from collections import Counter

from django.conf import settings
from django.db import transaction

from campaigns.progress import move_counters
from core import metrics
from delivery.services import send_tasks
from delivery.services.transitions import requeue_stale

logger = logging.getLogger(__name__)


def requeue_stale_sending() -> int:
    """Give back messages whose worker died or stalled mid-send (claimed longer ago than the lease).

    Such a message may or may not have reached the provider before the crash; this is the one
    case in which emailhub can send twice, and it is documented as such. A stalled worker that
    wakes up finds its claim gone before it sends anything more (delivery/services/lease.py).
    """
    with transaction.atomic():
        rows, failed = requeue_stale(
            lease_seconds=settings.EMAILHUB_SENDING_LEASE_SECONDS,
            max_attempts=settings.EMAILHUB_MAX_ATTEMPTS,
        )
        move_counters(failed)
        send_tasks.record_sends_by_priority(rows)
        # Left `sending` by a dead or stalled worker, back to `queued` (those failed for good are not counted).
        requeued = Counter((metrics.NO_PROVIDER, priority, "requeued") for _, priority in rows)
        transaction.on_commit(lambda: metrics.count_emails(requeued))
    if rows:
        logger.warning("requeued %d message(s) left in `sending` by a dead or stalled worker", len(rows))
    return len(rows)
