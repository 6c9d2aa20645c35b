"""Delivering to one endpoint: the delivery state machine. Every write to `outbound_delivery` and
`outbound_attempt` after creation is here, each a conditional UPDATE or a SKIP LOCKED claim.

    pending → delivering → succeeded | retry_wait → pending … | failed

A delivery task works one endpoint (`deliver`), under two guards that keep one receiver's
trouble its own (the bulkhead): a concurrency limit per endpoint (a lease set in Redis: at most
EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY tasks at once) and a circuit per endpoint (after
EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES failed attempts in a row it opens, and what waits stays
`pending`, spending no attempt, until one probe after EMAILHUB_WEBHOOKS_CIRCUIT_SECONDS passes).
They run on their own queue and worker (`webhooks`), so no receiver ever delays mail.

A failed attempt waits in `retry_wait` for the next step of EMAILHUB_WEBHOOKS_RETRY_SCHEDULE
(or a 429's or 503's Retry-After), indexed in the schedule index as `w:<id>`; the scheduler
releases it (`release`), and the sweep releases what the index lost. Times are read from
Python's clock (timezone.now, time.time), never the database's or Redis's, so tests move them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import metrics, outbound_events, outbox, redis_clients, schedule_index
from outbound.exceptions import UnsafeUrl
from outbound.models import Endpoint
from outbound.services import addresses, endpoints, http, signing
from outbound.services.registration import DELIVER_KIND

logger = logging.getLogger(__name__)

_SLOTS = "emailhub:outbound:slots:{endpoint}"  # sorted set: task token → lease expiry (epoch)
_CIRCUIT = "emailhub:outbound:circuit:{endpoint}"  # hash: failures, open_until, probe_until

# KEYS: slots. ARGV: now, limit, token, expiry. 1 if the token got a slot.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"""
# KEYS: circuit. ARGV: now, probe seconds. Returns one of the four below.
OPEN, CLOSED, PROBE, CLEAN = 0, 1, 2, 3  # CLEAN: closed with no failure counted (a success
# then need not be recorded)
_ADMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 3 end
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
if open_until <= 0 then return 1 end
if tonumber(ARGV[1]) < open_until then return 0 end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
if tonumber(ARGV[1]) < probe_until then return 0 end
redis.call('HSET', KEYS[1], 'probe_until', tonumber(ARGV[1]) + tonumber(ARGV[2]))
return 2
"""
# KEYS: circuit. ARGV: succeeded (0/1), threshold, now, open seconds. A success closes it; a
# failure counts, and the threshold-th in a row opens it (a failed probe re-opens it). Returns 1
# if the circuit is open after this.
_RECORD = """
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) return 0 end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
-- Forgotten ten minutes after its last failure: failures that far apart are not an outage.
redis.call('EXPIRE', KEYS[1], math.floor(tonumber(ARGV[4])) + 600)
if failures >= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'open_until', tonumber(ARGV[3]) + tonumber(ARGV[4]), 'probe_until', 0)
  return 1
end
return 0
"""


# --- the claim ---------------------------------------------------------------------------------

_CLAIM_SQL = """
UPDATE outbound_delivery AS d
   SET status = 'delivering', claimed_at = %(now)s, attempts = d.attempts + 1
 WHERE d.id IN (SELECT id FROM outbound_delivery
                 WHERE endpoint_id = %(endpoint)s AND status = 'pending' AND due_at <= %(now)s
                 ORDER BY due_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.event_ids, d.webhook_id, d.attempts, d.batch, d.due_at
"""


@dataclass
class _Outcome:
    delivery_id: int
    number: int
    answer: http.Answer
    at: datetime
    status: str = ""  # succeeded | retry_wait | failed
    due_at: datetime | None = None


@dataclass
class Round:
    attempted: int = 0
    succeeded: int = 0
    stop: str = ""  # why the task stops working this endpoint now ('' : go on)
    claimed_at: datetime | None = None  # the claim's token
    outcomes: list[_Outcome] = field(default_factory=list)


def _circuit_key(endpoint_id: int) -> str:
    return _CIRCUIT.format(endpoint=endpoint_id)


def _admit(endpoint_id: int) -> int:
    return int(
        redis_clients.send_path().eval(
            _ADMIT, 1, _circuit_key(endpoint_id), time.time(), settings.EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS + 15
        )
    )


def _record_circuit(endpoint_id: int, succeeded: bool) -> bool:
    return bool(
        redis_clients.send_path().eval(
            _RECORD,
            1,
            _circuit_key(endpoint_id),
            1 if succeeded else 0,
            settings.EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES,
            time.time(),
            settings.EMAILHUB_WEBHOOKS_CIRCUIT_SECONDS,
        )
    )


def circuit_state(endpoint_id: int) -> str:
    """closed, open or half-open (the probe's turn), as the endpoint's next task would find it."""
    found = redis_clients.send_path().hgetall(_circuit_key(endpoint_id))
    open_until = float(found.get(b"open_until", 0) or 0)
    if open_until <= 0:
        return "closed"
    return "open" if time.time() < open_until else "half-open"


def _next_due(number: int, answer: http.Answer, now: datetime) -> datetime | None:
    """When attempt `number` + 1 goes, after attempt `number` failed; None: none is left."""
    schedule = settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE
    if number >= len(schedule):
        return None
    delay = schedule[number]
    if answer.retry_after is not None:  # the receiver's own word, within a day
        delay = min(max(answer.retry_after, 1.0), 86400.0)
    return now + timedelta(seconds=delay)


def _body(event_ids: list[int], bodies: dict[int, str], batch: bool) -> bytes:
    texts = [bodies[event_id] for event_id in event_ids if event_id in bodies]
    if batch:
        return ("[" + ",".join(texts) + "]").encode()
    return texts[0].encode() if texts else b"{}"


def deliver_round(endpoint: Endpoint, *, limit: int | None = None) -> Round:
    """Claim the endpoint's due deliveries (one while its circuit is half-open), send each, and
    record every outcome. The endpoint must be enabled."""
    result = Round()
    admitted = _admit(endpoint.pk)
    if admitted == OPEN:
        result.stop = "circuit open"
        return result
    now = timezone.now()
    claim = 1 if admitted == PROBE else (limit or settings.EMAILHUB_WEBHOOKS_CLAIM)
    result.claimed_at = now
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"now": now, "endpoint": endpoint.pk, "limit": claim})
        # UPDATE … RETURNING keeps no order (the subquery's ORDER BY picks the rows, not the order
        # they come back in): sent in the claim's order, oldest first, so a batch endpoint's
        # requests follow its events and the circuit stops the newest.
        claimed = [row[:5] for row in sorted(cursor.fetchall(), key=lambda row: (row[5], row[0]))]
    if not claimed:
        if admitted == PROBE:  # nothing to probe with: let the next task probe
            redis_clients.send_path().hset(_circuit_key(endpoint.pk), "probe_until", 0)
        result.stop = "nothing due"
        return result
    bodies = outbound_events.bodies([event_id for _, event_ids, *_ in claimed for event_id in event_ids])
    secrets = endpoints.secrets_in_use(endpoint, now)
    try:
        target: addresses.Target | None = addresses.check(endpoint.url)
        refused = ""
    except UnsafeUrl as exc:
        target, refused = None, str(exc)
    unsent: list[int] = []
    # With no failure counted, a success changes nothing in Redis: one round trip saved per
    # request (17% of the webhooks worker's samples in py-spy, unbatched).
    clean = admitted == CLEAN
    for index, (delivery_id, event_ids, webhook_id, number, batch) in enumerate(claimed):
        at = timezone.now()
        if target is None:
            answer = http.Answer(None, 0.0, error=f"refused: {refused}")
        else:
            body = _body(event_ids, bodies, batch)
            headers = signing.headers(secrets, webhook_id, int(at.timestamp()), body)
            answer = http.post(target, body, headers, settings.EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS)
        outcome = _Outcome(delivery_id, number, answer, at)
        result.outcomes.append(outcome)
        result.attempted += 1
        result.succeeded += answer.succeeded
        opened = False
        if not (clean and answer.succeeded):
            opened = _record_circuit(endpoint.pk, answer.succeeded)
            clean = answer.succeeded
        if answer.status == 410 or opened:
            unsent = [row[0] for row in claimed[index + 1 :]]
            result.stop = "gone" if answer.status == 410 else "circuit opened"
            break
    _record(endpoint, result, unsent)
    return result


_RECORD_SQL = """
WITH outcome AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(dues)s::timestamptz[],
                         %(codes)s::int[], %(errors)s::text[], %(finished)s::timestamptz[])
             AS o(id, status, due_at, code, error, finished_at)
)
UPDATE outbound_delivery AS d
   SET status = o.status, due_at = coalesce(o.due_at, d.due_at), last_status_code = o.code,
       last_error = o.error, finished_at = o.finished_at, claimed_at = NULL
  FROM outcome AS o
 WHERE d.id = o.id AND d.status = 'delivering' AND d.claimed_at = %(claimed_at)s
RETURNING d.id, d.status, d.due_at
"""

# Claimed but not tried (the circuit opened, or 410, mid-claim): back to pending, attempt unspent;
# only if still this claim's (a sweep may have given it to another task meanwhile).
_UNCLAIM_SQL = """
UPDATE outbound_delivery SET status = 'pending', attempts = attempts - 1, claimed_at = NULL
 WHERE id = ANY(%s) AND status = 'delivering' AND claimed_at = %s
"""

_ATTEMPTS_SQL = """
INSERT INTO outbound_attempt
       (delivery_id, endpoint_id, number, attempted_at, status_code, succeeded, latency_ms, response, error)
SELECT o.delivery_id, %(endpoint)s, o.number, o.at, o.code, o.succeeded, o.latency, o.response, o.error
  FROM unnest(%(ids)s::bigint[], %(numbers)s::int[], %(ats)s::timestamptz[], %(codes)s::int[],
              %(succeeded)s::boolean[], %(latencies)s::float8[], %(responses)s::text[], %(errors)s::text[])
       AS o(delivery_id, number, at, code, succeeded, latency, response, error)
"""


def _error_of(answer: http.Answer) -> str:
    if answer.error:
        return answer.error
    return "" if answer.succeeded else f"HTTP {answer.status}"


def _record(endpoint: Endpoint, result: Round, unsent: list[int]) -> None:
    """Record a round's outcomes set-based: the deliveries (conditional on their claim), the
    attempt log, and what they mean for the endpoint (disabled by a 410 or by failing every
    attempt for EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS; its failing_since)."""
    now = timezone.now()
    for outcome in result.outcomes:
        if outcome.answer.succeeded:
            outcome.status = "succeeded"
        elif outcome.answer.status == 410:
            outcome.status = "failed"
        else:
            outcome.due_at = _next_due(outcome.number, outcome.answer, now)
            outcome.status = "retry_wait" if outcome.due_at is not None else "failed"
    outcomes = result.outcomes
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _RECORD_SQL,
            {
                "ids": [o.delivery_id for o in outcomes],
                "statuses": [o.status for o in outcomes],
                "dues": [o.due_at for o in outcomes],
                "codes": [o.answer.status for o in outcomes],
                "errors": [_error_of(o.answer)[:1000] for o in outcomes],
                "finished": [now if o.status in ("succeeded", "failed") else None for o in outcomes],
                "claimed_at": result.claimed_at,
            },
        )
        moved = cursor.fetchall()
        cursor.execute(
            _ATTEMPTS_SQL,
            {
                "endpoint": endpoint.pk,
                "ids": [o.delivery_id for o in outcomes],
                "numbers": [o.number for o in outcomes],
                "ats": [o.at for o in outcomes],
                "codes": [o.answer.status for o in outcomes],
                "succeeded": [o.answer.succeeded for o in outcomes],
                "latencies": [o.answer.latency_ms for o in outcomes],
                "responses": [o.answer.excerpt for o in outcomes],
                "errors": [_error_of(o.answer)[:1000] for o in outcomes],
            },
        )
        if unsent:
            cursor.execute(_UNCLAIM_SQL, [unsent, result.claimed_at])
        _update_endpoint(endpoint, outcomes, now)
        retrying = [
            (schedule_index.webhook_unit(i), due) for i, status, due in moved if status == "retry_wait"
        ]
        schedule_index.index_after_commit(retrying)
    metrics.count_webhook_attempts(
        str(endpoint.pk), [(o.status, o.answer.latency_ms / 1000) for o in outcomes]
    )


def _update_endpoint(endpoint: Endpoint, outcomes: list[_Outcome], now: datetime) -> None:
    last = outcomes[-1].answer
    if any(o.answer.status == 410 for o in outcomes):
        endpoints.disable(endpoint.pk, "the endpoint answered 410 Gone", now=now)
        return
    if last.succeeded:
        if endpoint.failing_since is not None:
            Endpoint.objects.filter(pk=endpoint.pk).update(failing_since=None)
        return
    passed = [index for index, o in enumerate(outcomes) if o.answer.succeeded]
    if passed:  # it took an event in this round: failing only since the next attempt
        Endpoint.objects.filter(pk=endpoint.pk).update(failing_since=outcomes[passed[-1] + 1].at)
        return
    if endpoint.failing_since is None:
        Endpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(
            failing_since=outcomes[0].at
        )
        return
    limit = settings.EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS
    if (now - endpoint.failing_since).total_seconds() >= limit:
        endpoints.disable(
            endpoint.pk,
            f"every attempt failed for {timedelta(seconds=limit)} (since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC);"
            f" last: {_error_of(last)[:120]}",
            now=now,
        )


# --- the task ----------------------------------------------------------------------------------


def deliver(endpoint_id: int, *, budget_seconds: float | None = None) -> int:
    """Work one endpoint: rounds until nothing is due, the circuit opens, the endpoint is
    disabled or the budget is spent; returns the attempts made. A task that finds the endpoint's
    concurrency taken ends at once (the tasks holding it will find this one's work: each takes
    one more look after giving its slot back)."""
    budget = settings.EMAILHUB_WEBHOOKS_TASK_SECONDS if budget_seconds is None else budget_seconds
    token = uuid.uuid4().hex
    slots = _SLOTS.format(endpoint=endpoint_id)
    client = redis_clients.send_path()
    attempted = 0
    started = time.monotonic()
    while True:
        now = time.time()
        limit = settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY
        # The slot is renewed between rounds, and a round may last a claim's worth of timeouts
        # (5 minutes by default, against a slow receiver): held as long as a claim's lease, a live
        # task is never taken for dead and the endpoint never gets more tasks than its limit.
        lease = settings.EMAILHUB_WEBHOOKS_LEASE_SECONDS
        if not client.eval(_ACQUIRE, 1, slots, now, limit, token, now + lease):
            return attempted
        stop = ""
        try:
            while not stop:
                endpoint = Endpoint.objects.select_related("api_key").filter(pk=endpoint_id).first()
                if endpoint is None or not endpoint.enabled:
                    stop = "disabled"
                    break
                if endpoint.api_key.revoked_at is not None:
                    endpoints.disable(endpoint_id, "its API key was revoked")
                    stop = "disabled"
                    break
                result = deliver_round(endpoint)
                attempted += result.attempted
                stop = result.stop
                if time.monotonic() - started > budget:
                    stop = stop or "budget"
                else:
                    client.zadd(slots, {token: time.time() + lease})
        finally:
            client.zrem(slots, token)
        if stop == "budget":
            outbox.ring_after_commit(DELIVER_KIND, {"endpoint": endpoint_id})  # a fresh task goes on
            return attempted
        if stop != "nothing due" or not _has_due(endpoint_id):
            return attempted
        # Something became due while the slot was held by this task alone: go round again.


def _has_due(endpoint_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM outbound_delivery WHERE endpoint_id = %s AND status = 'pending' AND due_at <= %s)",
            [endpoint_id, timezone.now()],
        )
        return bool(cursor.fetchone()[0])


# --- retry_wait → pending (the scheduler, the sweep) ------------------------------------------

_RELEASE_SQL = """
UPDATE outbound_delivery SET status = 'pending'
 WHERE id = ANY(%s) AND status = 'retry_wait' AND due_at <= %s
RETURNING endpoint_id
"""


def release(delivery_ids: list[int], *, now: datetime | None = None) -> int:
    """Deliveries whose retry is due (their schedule-index units came due) become pending, and
    their endpoints' tasks are recorded; returns how many moved. One that is not due yet (moved
    since it was indexed) is indexed again at its time."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_RELEASE_SQL, [delivery_ids, now])
        endpoints_due = sorted({row[0] for row in cursor.fetchall()})
        released = cursor.rowcount
        cursor.execute(
            "SELECT id, due_at FROM outbound_delivery WHERE id = ANY(%s) AND status = 'retry_wait' AND due_at > %s",
            [delivery_ids, now],
        )
        schedule_index.index_after_commit(
            [(schedule_index.webhook_unit(i), due) for i, due in cursor.fetchall()]
        )
        endpoints.kick(*endpoints_due)
    return released


@dataclass
class Swept:
    released: int = 0
    requeued: int = 0
    kicked: int = 0


def sweep(*, now: datetime | None = None, lease_seconds: float | None = None) -> Swept:
    """What no task is coming for: retries due that the index lost (released), deliveries held by
    a task that died (back to pending, their attempt counted), and endpoints with due work that
    no task is working (a task each)."""
    now = now or timezone.now()
    lease = lease_seconds or settings.EMAILHUB_WEBHOOKS_LEASE_SECONDS
    swept = Swept()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE outbound_delivery SET status = 'pending' WHERE status = 'retry_wait' AND due_at <= %s",
            [now - timedelta(seconds=30)],
        )
        swept.released = cursor.rowcount
        cursor.execute(
            "UPDATE outbound_delivery SET status = 'pending', claimed_at = NULL"
            " WHERE status = 'delivering' AND claimed_at < %s",
            [now - timedelta(seconds=lease)],
        )
        swept.requeued = cursor.rowcount
        cursor.execute(
            """
            SELECT e.id FROM outbound_endpoint AS e
             WHERE e.enabled AND EXISTS (SELECT 1 FROM outbound_delivery AS d
                                          WHERE d.endpoint_id = e.id AND d.status = 'pending' AND d.due_at <= %s)
            """,
            [now],
        )
        due = [row[0] for row in cursor.fetchall()]
        swept.kicked = len(due)
        endpoints.kick(*due)
    return swept


def retry_units() -> list[tuple[str, float]]:
    """(unit, due epoch) of every delivery waiting to be retried: the reconciler's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, due_at FROM outbound_delivery WHERE status = 'retry_wait'")
        return [(schedule_index.webhook_unit(i), due.timestamp()) for i, due in cursor.fetchall()]


def payload_preview(event_ids: list[int]) -> list[Any]:
    """The events of a delivery as JSON (the admin's and the API's view of what was sent)."""
    bodies = outbound_events.bodies(event_ids)
    return [json.loads(bodies[i]) for i in event_ids if i in bodies]
