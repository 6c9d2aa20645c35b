"""From events to deliveries: each new outbound event becomes a delivery to every enabled
endpoint that wants it (one per event, or one per 100 for an endpoint that asked for batches),
set-based, in the transaction that claims the events; the endpoints' delivery tasks go to the
outbox in that same transaction. Run by the `outbound.dispatch_events` task, rung by the writers
after their commit (core.outbound_events) and by beat every second for any ring that was lost.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import outbound_events, outbox, redis_clients
from outbound.services.registration import DELIVER_KIND, DISPATCH_BELL

logger = logging.getLogger(__name__)

# Events claimed per transaction.
STEP = 1000
# A dispatcher hands over to a new task after this long (others' turn on the queue).
BUDGET_SECONDS = 10.0

# Which endpoints want which event: the rule of `emailhub_event_interest()` (the migration), per
# endpoint. A batch endpoint's events are cut into requests of EMAILHUB_WEBHOOKS_BATCH_SIZE,
# in event order; any other endpoint gets a request per event. The webhook-id is the event's for
# a request of one event (the same at every endpoint, and again on a replay), else the batch's.
_DELIVERIES_SQL = """
WITH events AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(types)s::text[], %(owners)s::bigint[]) AS ev(id, type, owner)
), matched AS (
    SELECT e.id AS endpoint_id, e.batch, ev.id AS event_id,
           (row_number() OVER (PARTITION BY e.id ORDER BY ev.id) - 1) / %(batch_size)s AS chunk
      FROM events AS ev
      JOIN outbound_endpoint AS e
        ON e.enabled AND (e.all_messages OR e.api_key_id = ev.owner)
       AND (cardinality(e.event_types) = 0 OR ev.type = ANY(e.event_types))
), grouped AS (
    SELECT endpoint_id, batch, array_agg(event_id ORDER BY event_id) AS event_ids
      FROM matched
     GROUP BY endpoint_id, batch, CASE WHEN batch THEN chunk ELSE event_id END
)
INSERT INTO outbound_delivery (endpoint_id, event_ids, webhook_id, batch, status, attempts, due_at, last_error)
SELECT endpoint_id, event_ids,
       CASE WHEN cardinality(event_ids) = 1 THEN 'evt_' || event_ids[1]
            ELSE 'batch_' || endpoint_id || '_' || event_ids[1] END,
       batch, 'pending', 0, %(now)s, ''
  FROM grouped
RETURNING endpoint_id
"""


def dispatch_step(limit: int = STEP) -> int:
    """Claim up to `limit` events and create their deliveries; returns the events claimed."""
    with transaction.atomic():
        events = outbound_events.take(limit)
        if not events:
            return 0
        ids, types, owners = (list(column) for column in zip(*events, strict=True))
        with connection.cursor() as cursor:
            cursor.execute(
                _DELIVERIES_SQL,
                {
                    "ids": ids,
                    "types": types,
                    "owners": owners,
                    "batch_size": settings.EMAILHUB_WEBHOOKS_BATCH_SIZE,
                    # The schedule's first step: at once by default.
                    "now": timezone.now() + timedelta(seconds=settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE[0]),
                },
            )
            per_endpoint: dict[int, int] = {}
            for (endpoint_id,) in cursor.fetchall():
                per_endpoint[endpoint_id] = per_endpoint.get(endpoint_id, 0) + 1
        # Enough tasks to use the endpoint's concurrency for what was just created; a task that
        # finds its endpoint's slots taken ends at once (services.delivering).
        tasks = []
        for endpoint_id, created in sorted(per_endpoint.items()):
            wanted = min(
                settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY,
                math.ceil(created / settings.EMAILHUB_WEBHOOKS_CLAIM),
            )
            tasks += [(DELIVER_KIND, {"endpoint": endpoint_id})] * wanted
        outbox.record_many(tasks)
    return len(events)


# One dispatcher runs at a time (beat starts one every second, the doorbell more): the others
# end at once instead of each taking a thread of the webhooks worker from the deliveries. KEYS:
# the lock; ARGV: the token. Released only by its holder.
RUNNING = "emailhub:outbound:dispatching"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def dispatch(budget_seconds: float = BUDGET_SECONDS) -> int:
    """Dispatch events until none is left or the budget is spent; returns events dispatched, 0
    when another dispatcher is running (it, or the next beat tick, sees what this one would). The
    doorbell is unset before the last look, so an event whose writer found it set is seen."""
    token = uuid.uuid4().hex
    client = redis_clients.send_path()
    if not client.set(RUNNING, token, nx=True, px=int((budget_seconds + 30) * 1000)):
        return 0
    try:
        return _dispatch(budget_seconds)
    finally:
        client.eval(_RELEASE, 1, RUNNING, token)


def _dispatch(budget_seconds: float) -> int:
    started = time.monotonic()
    done = 0
    while time.monotonic() - started < budget_seconds:
        step = dispatch_step()
        done += step
        if step >= STEP:
            continue  # more was waiting than one step takes
        if step:
            # Events come in a trickle (a send batch's at a time): the next step waits for more
            # of them, so a batch endpoint's requests fill up and each step (a transaction and its
            # tasks) carries more. The first event of a lull goes at once.
            time.sleep(settings.EMAILHUB_WEBHOOKS_DISPATCH_GATHER_SECONDS)
            continue
        try:
            redis_clients.send_path().delete(DISPATCH_BELL.key, DISPATCH_BELL.wake_key)
        except Exception as exc:  # noqa: BLE001 - the bell expires by itself
            logger.warning("could not unset the dispatcher's doorbell: %s", exc)
        step = dispatch_step()
        done += step
        if not step:
            break
    return done
