"""Rebuilding the schedule index (and lost broker tasks) from PostgreSQL.

Run by beat every 30 s (`emailhub/periodic.py`; editable in the admin). It re-adds every unit that PostgreSQL says is
pending (scheduled and retrying messages, local-time slots, scheduled campaigns) and is not
indexed (a unit being dispatched at that moment may be re-added: dispatching it again moves no
row), so a FLUSHALL or a Redis restart without persistence delays
mail by at most one reconcile period and loses none.

Flushing Redis also empties the Celery queues. A marker key tells the reconciler when Redis has
lost its data (the marker is gone): it then publishes send tasks again for every `queued`
message, since their tasks may have vanished. A message whose task survived is then claimed by
whichever task comes first; the other finds nothing to do.

A task can also vanish while the marker survives (a broker outside REDIS_URL emptied, a purged
RabbitMQ queue, a task deleted by hand, a killed worker's unacked copy lost): each tick also
runs the per-queue FIFO probes of `delivery.services.probes`, which republish a `queued`
message only once a probe published after its task has been consumed, so a legitimate
backlog, however old, is never republished.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import connection, transaction

from delivery.services import outbox, probes
from scheduling import schedule

logger = logging.getLogger(__name__)

MARKER = "emailhub:redis-marker"


@dataclass
class Reconciled:
    units_added: int = 0
    redis_was_reset: bool = False
    republished: int = 0
    # Per priority: `queued` messages the probes found without a task, republished.
    stranded_republished: dict[str, int] = field(default_factory=dict)
    probes_published: list[str] = field(default_factory=list)


def reconcile() -> Reconciled:
    result = Reconciled()
    result.redis_was_reset = bool(schedule.client().set(MARKER, int(time.time()), nx=True))
    units: list[tuple[str, float]] = []
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT 'm:' || id, extract(epoch FROM due_at) FROM delivery_message
             WHERE status IN ('scheduled', 'retry_wait') AND (campaign_id IS NULL OR status = 'retry_wait')
            UNION ALL
            SELECT 'c:' || campaign_id || ':' || extract(epoch FROM due_at)::bigint, extract(epoch FROM due_at)
              FROM delivery_message WHERE status = 'scheduled' AND campaign_id IS NOT NULL
             GROUP BY campaign_id, due_at
            UNION ALL
            SELECT 'a:' || id, extract(epoch FROM scheduled_at) FROM campaigns_campaign
             WHERE status = 'scheduled' AND scheduled_at IS NOT NULL
            """
        )
        units = [(unit, float(score)) for unit, score in cursor.fetchall()]
    for start in range(0, len(units), 5000):
        result.units_added += schedule.add_missing(units[start : start + 5000])
    if result.redis_was_reset:
        result.republished = republish_queued()
        logger.warning(
            "Redis had lost its data: re-indexed %d unit(s), republished %d queued message(s)",
            result.units_added,
            result.republished,
        )
    elif result.units_added:
        logger.warning("reconciler re-indexed %d missing schedule unit(s)", result.units_added)
    report = probes.run()
    result.stranded_republished, result.probes_published = report.republished, report.published
    return result


def republish_queued(step: int = 50_000) -> int:
    """Publish send tasks again for every `queued` message, in keyset steps, moving their
    `queued_at` with the outbox events (the probes' rule: see delivery/services/probes.py)."""
    last_id, total = 0, 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                WITH step AS (
                    SELECT id FROM delivery_message WHERE status = 'queued' AND id > %s ORDER BY id LIMIT %s
                ), moved AS (
                    UPDATE delivery_message AS m SET queued_at = clock_timestamp()
                      FROM step WHERE m.id = step.id AND m.status = 'queued'
                    RETURNING m.id, m.priority
                )
                SELECT (SELECT max(id) FROM step), coalesce((SELECT array_agg(id ORDER BY id) FROM moved), '{}'),
                       coalesce((SELECT array_agg(priority ORDER BY id) FROM moved), '{}')
                """,
                [last_id, step],
            )
            step_end, ids, priorities = cursor.fetchone()
            if step_end is None:
                return total
            outbox.record_sends_by_priority(zip(ids, priorities, strict=True))
        last_id, total = step_end, total + len(ids)
