"""The schedule index in Redis: due work as a sorted set of small dispatch units.

A unit is `m:<message id>` (one message) or `c:<campaign id>:<epoch seconds>` (every message of
a local-time campaign due at that instant), scored by its due time. PostgreSQL stays the truth:
the set is an index that the reconciler can rebuild from the rows at any time.

Claiming is one Lua script: take up to N due units (score ≤ Redis's own clock), remove them
from the due set and add them to a lease set scored by lease expiry. The claimer then moves
the rows and records the send tasks in one PostgreSQL transaction, and acks (removes the lease).
A claimer that dies before its ack leaves the lease to expire; the reaper puts such units back.
Two schedulers never claim one unit at once (the script is atomic), and a unit dispatched twice
after a reap does nothing the second time (the rows are no longer `scheduled`). No lock needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import redis as redis_lib
from django.conf import settings

DUE = "emailhub:schedule:due"
LEASES = "emailhub:schedule:leases"

_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local units = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
if #units > 0 then
  redis.call('ZREM', KEYS[1], unpack(units))
  local expiry = now + tonumber(ARGV[2])
  local args = {}
  for i, unit in ipairs(units) do
    args[2 * i - 1] = expiry
    args[2 * i] = unit
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {units, tostring(now), nxt[2] or false}
"""

_REAP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZRANGE', KEYS[2], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
for _, unit in ipairs(expired) do
  redis.call('ZREM', KEYS[2], unit)
  redis.call('ZADD', KEYS[1], 'NX', now, unit)
end
return #expired
"""

# Add units unless they are leased right now (being dispatched) — used by the reconciler.
_ADD_UNLEASED = """
local added = 0
for i = 1, #ARGV, 2 do
  if not redis.call('ZSCORE', KEYS[2], ARGV[i + 1]) then
    added = added + redis.call('ZADD', KEYS[1], 'NX', ARGV[i], ARGV[i + 1])
  end
end
return added
"""

_client: redis_lib.Redis | None = None


def client() -> redis_lib.Redis:
    global _client
    if _client is None:
        _client = redis_lib.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    return _client


def reset_client() -> None:
    global _client
    if _client is not None:
        _client.close()
    _client = None


def message_unit(message_id: int) -> str:
    return f"m:{message_id}"


def slot_unit(campaign_id: int, due: datetime) -> str:
    return f"c:{campaign_id}:{int(due.timestamp())}"


def campaign_unit(campaign_id: int) -> str:
    """A scheduled (`at`) campaign, started when due."""
    return f"a:{campaign_id}"


@dataclass(frozen=True)
class Unit:
    kind: str  # "m" message, "c" local-time campaign slot, "a" campaign start
    id: int
    due_epoch: int | None = None

    @classmethod
    def parse(cls, raw: bytes | str) -> Unit:
        text = raw.decode() if isinstance(raw, bytes) else raw
        kind, ident, *rest = text.split(":")
        return cls(kind, int(ident), int(rest[0]) if rest else None)

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}" + (f":{self.due_epoch}" if self.due_epoch is not None else "")


@dataclass(frozen=True)
class Claim:
    units: list[Unit]
    now: float
    next_due: float | None


def add(units: Iterable[tuple[str, datetime]], *, redis: redis_lib.Redis | None = None) -> None:
    """Index units (unit, due). A unit already indexed keeps the earlier of the two due times."""
    mapping = {unit: due.timestamp() for unit, due in units}
    if mapping:
        (redis or client()).zadd(DUE, mapping, lt=True)


def add_unleased(units: list[tuple[str, float]]) -> int:
    if not units:
        return 0
    args: list[object] = []
    for unit, score in units:
        args += [score, unit]
    return int(client().eval(_ADD_UNLEASED, 2, DUE, LEASES, *args))


def claim(limit: int, lease_seconds: float) -> Claim:
    units, now, next_due = client().eval(_CLAIM, 2, DUE, LEASES, limit, lease_seconds)
    return Claim([Unit.parse(u) for u in units], float(now), float(next_due) if next_due else None)


def ack(units: list[Unit]) -> None:
    if units:
        client().zrem(LEASES, *[str(u) for u in units])


def reap(limit: int = 10_000) -> int:
    """Put units whose lease expired (their claimer died) back in the due set, due now."""
    return int(client().eval(_REAP, 2, DUE, LEASES, limit))


def sizes() -> dict[str, int]:
    pipe = client().pipeline()
    pipe.zcard(DUE)
    pipe.zcard(LEASES)
    due, leased = pipe.execute()
    return {"due": int(due), "leased": int(leased)}


def index_after_commit(units: list[tuple[str, datetime]]) -> None:
    """Index units once the caller's transaction commits. If Redis is away the rows are still
    in PostgreSQL and the reconciler indexes them on its next run."""
    from django.db import transaction

    def _add() -> None:
        try:
            add(units)
        except redis_lib.RedisError as exc:
            import logging

            logging.getLogger(__name__).warning(
                "could not index %d unit(s) (%s); the reconciler will", len(units), exc
            )

    if units:
        transaction.on_commit(_add)
