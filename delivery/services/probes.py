"""Finding `queued` messages whose send task no longer exists: one FIFO probe per send queue.

A send task can vanish without PostgreSQL noticing: the broker's data emptied (FLUSHDB of a
broker that is not REDIS_URL, a purged RabbitMQ queue), a task deleted by hand, a worker
killed while it held a task whose unacked copy went with the broker. Its rows stay `queued`.

Looking at the broker cannot tell such a row from one that waits in a legitimate backlog (and
RabbitMQ cannot be listed at all), and age cannot either: a 1,000,000-message campaign waiting
in `normal` is old and healthy. The probe asks the queue itself. Each reconcile tick, per send
queue (critical, high, normal, low):

1. No probe outstanding: publish `delivery.queue_probe` to that queue with a token, after
   recording in Redis the probe's *cutoff* C (below).
2. A worker executes the probe and records it consumed. A queue is FIFO, so every task
   published before the probe has been delivered to a worker by then.
3. Once the probe has been consumed for EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS (the tasks
   delivered just before it have claimed their rows by then), a message of that priority that
   is still `queued` with `queued_at < C`, and whose campaign (if any) is `sending` (a paused
   campaign leaves rows queued on purpose), has no task: it is republished through the outbox
   and its `queued_at` moved, then a new probe starts.
4. A probe not consumed within EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS is replaced by a new one:
   it was lost, or it waits behind a backlog. That is never evidence of stranding; only a
   consumed probe is. A backlog keeps its probe waiting behind it, so nothing in it is touched.

The cutoff C must be a time before which every `queued` row's task was already on the broker
when the probe was published. `queued_at` is written in the transaction that records the row's
outbox task, and the outbox row is deleted only after its task was published. So C is the
least of: now; the oldest live send outbox row's `created_at` (its task may go out after the
probe); the start of the oldest open transaction that has written (its rows commit later); all
minus the margin (clock skew: the web host stamps `queued_at` on accept). Every path that
publishes a send task again for an existing row (this module, the Redis-reset republish, a
campaign's resume) moves its `queued_at` in the same transaction, so the rule holds for it too.

Claims are conditional, so a wrong guess would cost a task that finds nothing to do, never a
second email. One known wrong guess: a critical or high message accepted while the transactional
pool's doorbell rang has no task of its own (a running task claims it: docs/architecture.md
"Adaptive claims"), so behind a backlog older than the margin it looks stranded and is
republished, harmlessly. Nothing here asks the broker anything: it works the same on Redis and RabbitMQ.

How long it takes (tests/test_stranded_queued.py checks it with controlled time). With the
reconcile tick every P seconds (beat's "emailhub: reconcile schedule", 30 s) and the margin M
(EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS, 60 s), a probe is consumed a moment after the tick that
publishes it and checked at the first tick more than M after that, so one probe cycle is
L = P * (floor(M / P) + 1) seconds (90 s). A row queued at Q has no evidence before a probe
whose cutoff (its publication minus M) is later than Q; the first such probe is published
within L after Q + M and checked L later. So a stranded row is republished between M + L and
M + 2L after it was queued: 150 to 240 s with the defaults (issue 18 measured 142 and 233 s;
the docs had said "two ticks plus the margin", 120 s, which held for neither). An idle queue's
probe is consumed at once; behind a backlog, the cycle waits for the backlog, and a lost probe
adds up to EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS (600 s).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from core import outbox, redis_clients
from delivery.services import send_tasks, transitions
from emailhub.celery import PRIORITY_QUEUES
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

PROBE_TASK = "delivery.queue_probe"
KEY = "emailhub:probe:{queue}"
# Rows moved per republish statement: a broker that lost a million tasks costs a few
# statements, each one transaction, not one huge one.
REPUBLISH_STEP = 50_000

# One decision per tick, atomic so that two beats (two reconcilers) never both act on one
# consumed probe: the winner installs its own token at once and the other sees `wait`.
# Returns {decision, old cutoff}. Times are Redis's own clock, unless a test gives its own
# (ARGV[4], `now=`: the bound below is tested with controlled time).
_NOW = """
local now
if ARGV[{arg}] and ARGV[{arg}] ~= '' then
  now = tonumber(ARGV[{arg}])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""
_BEGIN = (
    _NOW.format(arg=4)
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'cutoff', 'published', 'consumed')
local decision
if not s[1] then
  decision = 'publish'
elseif s[4] then
  if now - tonumber(s[4]) < tonumber(ARGV[1]) then return {'wait', false} end
  decision = 'check'
elseif now - tonumber(s[3]) >= tonumber(ARGV[2]) then
  decision = 'replace'
else
  return {'wait', false}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'token', ARGV[3], 'published', tostring(now))
return {decision, s[2] or false}
"""
)
_SET_CUTOFF = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'cutoff', ARGV[2])
return 1
"""
_CONSUMED = (
    """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'consumed') == 1 then
  return 0
end
"""
    + _NOW.format(arg=2)
    + """
redis.call('HSET', KEYS[1], 'consumed', tostring(now))
return 1
"""
)
_DROP = (
    "if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

# The cutoff, read from PostgreSQL's clock (see the module docstring). least() skips NULLs.
_CUTOFF_SQL = """
SELECT extract(epoch FROM least(
         coalesce(to_timestamp(%s::float8), clock_timestamp()),
         %s::timestamptz,
         (SELECT min(xact_start) FROM pg_stat_activity
           WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid())
       ) - make_interval(secs => %s))
"""


@dataclass
class ProbeReport:
    published: list[str] = field(default_factory=list)  # queues that got a new probe
    replaced: list[str] = field(default_factory=list)  # of those, whose old probe timed out
    checked: list[str] = field(default_factory=list)  # queues scanned for stranded rows
    republished: dict[str, int] = field(default_factory=dict)  # stranded rows, by priority


def _key(queue: str) -> str:
    return KEY.format(queue=queue)


def mark_consumed(queue: str, token: str, *, now: float | None = None) -> bool:
    """The probe task's body: record that `token` reached a worker (only the current token counts)."""
    return bool(redis_clients.send_path().eval(_CONSUMED, 1, _key(queue), token, _epoch(now)))


def current_cutoff(margin: float, *, now: float | None = None) -> float:
    with connection.cursor() as cursor:
        cursor.execute(_CUTOFF_SQL, [now, outbox.oldest_pending(send_tasks.SEND_MESSAGES), margin])
        return float(cursor.fetchone()[0])


def _epoch(now: float | None) -> str:
    return "" if now is None else repr(now)


def run(
    *, margin: float | None = None, timeout: float | None = None, now: float | None = None
) -> ProbeReport:
    """One tick of the probes (the reconciler calls this): check consumed probes, start new ones.

    `now` (epoch seconds) replaces the Redis and PostgreSQL clocks, for tests only."""
    margin = settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS if margin is None else margin
    timeout = settings.EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS if timeout is None else timeout
    report = ProbeReport()
    client = redis_clients.send_path()
    tokens: dict[str, str] = {}
    cutoffs: dict[str, float] = {}
    for queue in PRIORITY_QUEUES:
        token = uuid.uuid4().hex
        decision, old_cutoff = client.eval(_BEGIN, 1, _key(queue), margin, timeout, token, _epoch(now))
        decision = decision.decode() if isinstance(decision, bytes) else decision
        if decision == "wait":
            continue
        tokens[queue] = token
        if decision == "replace":
            report.replaced.append(queue)
        elif decision == "check" and old_cutoff:
            cutoffs[queue] = float(old_cutoff)
    report.checked = list(cutoffs)
    report.republished = transitions.republish_stranded(cutoffs, REPUBLISH_STEP)
    if report.republished:
        logger.warning(
            "republished %d queued message(s) whose send task no longer existed: %s",
            sum(report.republished.values()),
            report.republished,
        )
    if not tokens:
        return report
    # Taken after the republish committed (and its tasks went out), so those rows are after it.
    cutoff = current_cutoff(margin, now=now)
    with celery_app.producer_or_acquire() as producer:
        for queue, token in tokens.items():
            try:
                client.eval(_SET_CUTOFF, 1, _key(queue), token, repr(cutoff))
                celery_app.send_task(
                    PROBE_TASK, args=[queue, token], queue=queue, retry=False, producer=producer
                )
            except Exception as exc:  # noqa: BLE001 - a broker or Redis error: the next tick tries again
                logger.warning("could not publish the %s queue's probe (%s); next tick retries", queue, exc)
                client.eval(_DROP, 1, _key(queue), token)
                continue
            report.published.append(queue)
    return report


def state(queue: str) -> dict[str, str]:
    """The queue's probe as stored in Redis (for tests and operators)."""
    raw: dict[bytes, bytes] = redis_clients.send_path().hgetall(_key(queue))  # type: ignore[assignment]
    return {k.decode(): v.decode() for k, v in raw.items()}
