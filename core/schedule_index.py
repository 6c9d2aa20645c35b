"""The schedule index in Redis: due work as a sorted set of small dispatch units.

A unit is `m:<message id>` (one message) or `c:<campaign id>:<epoch seconds>` (every message of
a local-time campaign due at that instant), scored by its due time. PostgreSQL stays the truth:
the set is an index that the reconciler can rebuild from the rows at any time.

Claiming is one Lua script: take up to N due units (score ≤ Redis's own clock), remove them
from the due set and lease them under a claim token that expires. The claimer then moves the
rows and records the send tasks in one PostgreSQL transaction, and acks (drops the lease).
A claimer that dies before its ack leaves the lease to expire; the reaper puts such units back.
Two schedulers never claim one unit at once (the script is atomic), and a unit dispatched twice
after a reap does nothing the second time (the rows are no longer `scheduled`). No lock needed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import redis as redis_lib
from django.db import transaction
from redis.commands.core import Script

from core import redis_clients

DUE = "emailhub:schedule:due"
# Leases are per claim, not per unit: `CLAIMS` scores each claim token by its lease expiry and
# `emailhub:schedule:claim:<token>` holds the claim's units as one string, space-separated (unit
# names hold no space). Adding 1000 members to a lease *sorted set* took ~1.5 ms of a 2.1 ms
# claim inside Redis; an RPUSH of the 1000 to a list was cheaper, and one SET of the string that
# the script also returns is cheaper still: the reply is one bulk string instead of 1000, which
# redis-py's reply parser (and the Python that splits it) reads several times faster
# (bench/scheduler.py; docs/performance.md, "Scheduler claim").
CLAIMS = "emailhub:schedule:claims"
CLAIM_PREFIX = "emailhub:schedule:claim:"

logger = logging.getLogger(__name__)

# KEYS: due set, claims set. ARGV: limit, lease seconds, claim key prefix, token.
# Returns {the units joined by spaces ('' when none were due), Redis's now, next due score or false}.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local units = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
local joined = ''
if #units > 0 then
  redis.call('ZREM', KEYS[1], unpack(units))
  joined = table.concat(units, ' ')
  redis.call('SET', ARGV[3] .. ARGV[4], joined)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[4])
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {joined, tostring(now), nxt[2] or false}
"""

# A lease written before the units were one string (a list, RPUSH) is still read, so that an
# upgrade with claims in flight returns them too.
_REAP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZRANGE', KEYS[2], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
local returned = 0
for _, token in ipairs(expired) do
  local key = ARGV[2] .. token
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'list' then
    for _, unit in ipairs(redis.call('LRANGE', key, 0, -1)) do
      returned = returned + redis.call('ZADD', KEYS[1], 'NX', now, unit)
    end
  elseif kind == 'string' then
    for unit in string.gmatch(redis.call('GET', key), '%S+') do
      returned = returned + redis.call('ZADD', KEYS[1], 'NX', now, unit)
    end
  end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[2], token)
end
return returned
"""

# Sent with EVALSHA (redis-py loads a script on its first NOSCRIPT): not 600 bytes of script
# text per claim. Bytes, so that no client is needed to encode them; the client is per call.
_claim_script = Script(None, _CLAIM.encode())  # type: ignore[arg-type]
_reap_script = Script(None, _REAP.encode())  # type: ignore[arg-type]


def message_unit(message_id: int) -> str:
    return f"m:{message_id}"


def slot_unit(campaign_id: int, due: datetime) -> str:
    return f"c:{campaign_id}:{int(due.timestamp())}"


def webhook_unit(delivery_id: int) -> str:
    """An outbound webhook delivery waiting for its next attempt (the outbound app's)."""
    return f"w:{delivery_id}"


def campaign_unit(campaign_id: int) -> str:
    """A scheduled (`at`) campaign, started when due."""
    return f"a:{campaign_id}"


class Unit(NamedTuple):
    # A NamedTuple, not a dataclass: a claim builds a thousand of them and a frozen dataclass's
    # __init__ cost ~1 µs each, a third of the claim (bench/scheduler.py).
    kind: str  # "m" message, "c" local-time campaign slot, "a" campaign start, "w" webhook retry
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
    token: str
    units: list[Unit]
    now: float
    next_due: float | None


def add(units: Iterable[tuple[str, datetime]], *, redis: redis_lib.Redis | None = None) -> None:
    """Index units (unit, due). A unit already indexed keeps the earlier of the two due times."""
    mapping = {unit: due.timestamp() for unit, due in units}
    if mapping:
        (redis or redis_clients.schedule()).zadd(DUE, mapping, lt=True)


def remove(units: Iterable[str], *, redis: redis_lib.Redis | None = None) -> int:
    """Drop units from the index (a cancelled campaign's); return how many were indexed."""
    members = list(units)
    removed = 0
    for start in range(0, len(members), 5000):
        removed += int((redis or redis_clients.schedule()).zrem(DUE, *members[start : start + 5000]) or 0)
    return removed


def move(units: Iterable[tuple[str, datetime]], *, redis: redis_lib.Redis | None = None) -> None:
    """Set units' due times, later or earlier than they were (`add` keeps the earlier of two)."""
    mapping = {unit: due.timestamp() for unit, due in units}
    if mapping:
        (redis or redis_clients.schedule()).zadd(DUE, mapping)


def _after_commit(units: Sized, action: Callable[[], object], failed: str) -> None:
    """Run `action` on the index once the caller's transaction commits; if Redis is away, log
    `failed` (formatted with the number of units and the error) and go on: PostgreSQL is the truth."""

    def run() -> None:
        try:
            action()
        except redis_lib.RedisError as exc:
            logger.warning(failed, len(units), exc)

    if len(units):
        transaction.on_commit(run)


def move_after_commit(units: list[tuple[str, datetime]]) -> None:
    """`move` once the caller's transaction commits (a rescheduled message). If Redis is away a
    unit keeps its old time; its dispatch then finds the row not due and indexes it at its real
    time."""
    _after_commit(units, lambda: move(units), "could not move %d unit(s) (%s)")


def unindex_after_commit(units: list[str]) -> None:
    """Drop units once the caller's transaction commits. If Redis is away a unit stays; its
    dispatch then moves no row (they are no longer `scheduled`), and the reconciler never
    re-adds it."""
    _after_commit(units, lambda: remove(units), "could not unindex %d unit(s) (%s)")


def add_missing(units: list[tuple[str, float]]) -> int:
    """Index units that are not indexed (NX): the reconciler's write. A unit that is being
    dispatched right now may be added again; dispatching it twice moves nothing the second time."""
    if not units:
        return 0
    return int(redis_clients.schedule().zadd(DUE, dict(units), nx=True) or 0)


def claim(limit: int, lease_seconds: float) -> Claim:
    token = uuid.uuid4().hex
    joined, now, next_due = _claim_script(
        keys=[DUE, CLAIMS], args=[limit, lease_seconds, CLAIM_PREFIX, token], client=redis_clients.schedule()
    )
    return Claim(token, parse_units(joined), float(now), float(next_due) if next_due else None)


def parse_units(joined: bytes) -> list[Unit]:
    """The units of a claim's reply (space-separated bytes), in their order."""
    if not joined:
        return []
    # Nearly every unit is a message (`m:<id>`): built without decoding, splitting or Unit's
    # Python-level __new__ (0.6 µs a unit instead of 0.9 on this machine, bench/scheduler.py).
    new, parse = tuple.__new__, Unit.parse
    return [
        new(Unit, ("m", int(raw[2:]), None)) if raw[:2] == b"m:" else parse(raw) for raw in joined.split(b" ")
    ]


def ack(claim: Claim) -> None:
    if claim.units:
        pipe = redis_clients.schedule().pipeline(transaction=False)
        pipe.delete(CLAIM_PREFIX + claim.token)
        pipe.zrem(CLAIMS, claim.token)
        pipe.execute()


def reap(limit: int = 1000) -> int:
    """Put the units of claims whose lease expired (their claimer died) back, due now."""
    return int(_reap_script(keys=[DUE, CLAIMS], args=[limit, CLAIM_PREFIX], client=redis_clients.schedule()))


def sizes() -> dict[str, int]:
    """Units due (indexed) and claims in flight (leased)."""
    pipe = redis_clients.schedule().pipeline()
    pipe.zcard(DUE)
    pipe.zcard(CLAIMS)
    due, leased = pipe.execute()
    return {"due": int(due), "leased": int(leased)}


def index_after_commit(units: list[tuple[str, datetime]]) -> None:
    """Index units once the caller's transaction commits. If Redis is away the rows are still
    in PostgreSQL and the reconciler indexes them on its next run."""
    _after_commit(units, lambda: add(units), "could not index %d unit(s) (%s); the reconciler will")
