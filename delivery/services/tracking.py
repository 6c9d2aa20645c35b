"""Recording the open and click hits the tracking views queued (delivery/tracking/hits.py).

`drain_hits` pops up to EMAILHUB_TRACKING_DRAIN_BATCH hits atomically and records them with ONE
`record_events` call (kinds opened/clicked, provider `emailhub`): one INSERT per batch whatever
the traffic, the hits classified on the way (delivery/tracking/classify.py), first opens and
clicks of human hits set once. The beat task calls it every second and keeps draining while
full batches come back, up to a time budget, so a burst is worked off by one tick.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import DatabaseError

from core import redis_clients
from delivery.exceptions import InvalidEvent
from delivery.services.events import ProviderEvent, record_events
from delivery.tracking import hits

logger = logging.getLogger(__name__)

PROVIDER = "emailhub"
# A tick stops draining after this long (the next tick goes on): a beat interval's worth.
TICK_BUDGET_SECONDS = 1.0


@dataclass
class DrainReport:
    batches: int = 0
    hits: int = 0
    recorded: int = 0


def _event(hit: hits.QueuedHit) -> ProviderEvent:
    clicked = hit.kind == hits.CLICK
    return ProviderEvent(
        provider=PROVIDER,
        event_id=f"hit:{hit.hit_id}",
        kind="clicked" if clicked else "opened",
        occurred_at=datetime.fromtimestamp(hit.at, UTC),
        message_id=hit.message_id,
        detail=hit.url if clicked else "",
        # Kept with every hit, whatever its class, so an operator can see why it was classed so.
        payload={"link": hit.link, "url": hit.url, "user_agent": hit.user_agent, "ip": hit.ip}
        if clicked
        else {"user_agent": hit.user_agent, "ip": hit.ip},
        user_agent=hit.user_agent,
        ip=hit.ip,
    )


def drain_batch(batch_size: int | None = None) -> tuple[int, int]:
    """Record one batch of queued hits. Returns (hits popped, events recorded). If recording
    fails (the database is down) the batch goes back to the head of the queue for the next tick;
    their ids make a batch recorded twice harmless."""
    size = batch_size or settings.EMAILHUB_TRACKING_DRAIN_BATCH
    raw = hits.pop(size)
    if not raw:
        return 0, 0
    queued = [h for h in (hits.decode(r) for r in raw) if h is not None]
    try:
        recorded = record_events([_event(h) for h in queued])
    except InvalidEvent:
        # A bug in building events, not a passing outage: retrying would fail forever.
        logger.exception("dropping %d tracking hits that cannot be recorded", len(raw))
        return len(raw), 0
    except DatabaseError:
        redis_clients.send_path().lpush(settings.EMAILHUB_TRACKING_QUEUE, *reversed(raw))
        raise
    return len(raw), recorded.new


def drain_hits(*, budget_seconds: float = TICK_BUDGET_SECONDS, batch_size: int | None = None) -> DrainReport:
    """Drain full batches until the queue is short of one or the budget is spent."""
    size = batch_size or settings.EMAILHUB_TRACKING_DRAIN_BATCH
    report = DrainReport()
    deadline = time.monotonic() + budget_seconds
    while True:
        popped, recorded = drain_batch(size)
        if popped:
            report.batches += 1
            report.hits += popped
            report.recorded += recorded
        if popped < size or time.monotonic() >= deadline:
            return report
