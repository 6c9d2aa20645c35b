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

from campaigns.models import Campaign
from core import redis_clients, schedule_index
from delivery.selectors import pending_message_units
from delivery.services import probes, transitions
from outbound.services import delivering

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
    result.redis_was_reset = bool(redis_clients.schedule().set(MARKER, int(time.time()), nx=True))
    units = pending_message_units()
    units += delivering.retry_units()
    units += [
        (schedule_index.campaign_unit(campaign_id), scheduled_at.timestamp())
        for campaign_id, scheduled_at in Campaign.objects.filter(
            status=Campaign.Status.SCHEDULED, scheduled_at__isnull=False
        ).values_list("pk", "scheduled_at")
        if scheduled_at is not None
    ]
    for start in range(0, len(units), 5000):
        result.units_added += schedule_index.add_missing(units[start : start + 5000])
    if result.redis_was_reset:
        result.republished = transitions.republish_queued()
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
