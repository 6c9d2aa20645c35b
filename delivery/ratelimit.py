"""A token bucket per provider endpoint (circuit, delivery/breakers.py) in Redis, taken with one Lua call.

The quota is the provider's setting (<PROVIDER>_MAX_SEND_RATE of the process sending): each
endpoint a provider name points at gets a bucket of that size, since two relays (or two SES
regions) are two quotas, not one shared.

The bucket refills at the provider's quota (emails per second) up to one second's worth.
Bulk sends may not take the last `reserved` tokens; critical and high sends may, so a campaign
running at full quota never leaves an OTP without a token. "Now" is Redis's own clock (TIME),
so workers with skewed clocks share one bucket correctly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import redis as redis_lib
from django.conf import settings

from core import redis_clients

# KEYS[1] bucket; ARGV: rate/s, capacity, requested, floor (tokens that must remain), ttl ms.
# Returns {granted, wait_ms}: how many tokens were taken (possibly fewer than asked) and, when
# none could be, how long until `requested` would fit.
_TAKE = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local requested = tonumber(ARGV[3])
local floor = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local available = math.floor(tokens - floor)
local granted = math.max(0, math.min(requested, available))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local wait_ms = 0
if granted == 0 then
  wait_ms = math.ceil((math.min(requested, capacity - floor) - (tokens - floor)) / rate * 1000)
end
return {granted, wait_ms}
"""

KEY = "emailhub:ratelimit:{name}"


@dataclass(frozen=True)
class Take:
    granted: int
    wait_seconds: float


class TokenBucket:
    def __init__(
        self, name: str, rate: float, *, reserved_fraction: float, client: redis_lib.Redis | None = None
    ):
        self.name = name
        self.rate = rate
        self.capacity = max(1.0, rate)  # one second of quota
        self.reserved = math.floor(self.capacity * reserved_fraction)
        self.client = client or redis_clients.send_path()
        self._script = self.client.register_script(_TAKE)

    def take(self, count: int, *, reserved: bool) -> Take:
        """Take up to `count` tokens now. `reserved` callers may use the reserved share."""
        floor = 0 if reserved else self.reserved
        ttl_ms = int(max(60_000, self.capacity / self.rate * 2000))
        granted, wait_ms = self._script(
            keys=[KEY.format(name=self.name)], args=[self.rate, self.capacity, count, floor, ttl_ms]
        )
        return Take(int(granted), int(wait_ms) / 1000)

    def acquire(self, count: int, *, reserved: bool, max_wait: float) -> int:
        """Take `count` tokens, waiting for refills up to `max_wait` seconds; return how many were got."""
        got = 0
        deadline = time.monotonic() + max_wait
        while got < count:
            take = self.take(count - got, reserved=reserved)
            got += take.granted
            if got >= count:
                break
            pause = max(take.wait_seconds, 0.01)
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
        return got

    def level(self) -> float:
        raw = self.client.hget(KEY.format(name=self.name), "tokens")
        return self.capacity if raw is None else float(raw)


def bucket_for(provider: str, circuit: str) -> TokenBucket | None:
    """The bucket of `circuit` (a circuit key of `provider`), sized from `provider`'s quota."""
    rate = settings.EMAILHUB_RATE_LIMITS.get(provider, 0.0)
    if not rate:
        return None
    return TokenBucket(circuit, rate, reserved_fraction=settings.EMAILHUB_RATE_RESERVED_FRACTION)


# A provider that told us to slow down (429 + Retry-After, SES throttling, SMTP "try later") is
# paused: one key whose TTL is the pause, so every worker of every machine sees it and it ends
# by itself. The TTL is Redis's clock, like the bucket's. A shorter pause never cuts a longer one.
# `name` is a circuit key: the endpoint that said so is paused, not another one of the provider.
PAUSE_KEY = "emailhub:provider:{name}:paused"
_PAUSE = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ms)
  return ms
end
return redis.call('PTTL', KEYS[1])
"""


def pause_provider(name: str, seconds: float | None, reason: str) -> float:
    """Pause `name` for `seconds` (the provider's Retry-After; None: the default setting).

    Returns the pause in force afterwards, in seconds. Fails open: without Redis the provider is
    not paused, and its next 429 will say so again.
    """
    if seconds is None or seconds <= 0:
        seconds = settings.EMAILHUB_THROTTLE_DEFAULT_SECONDS
    seconds = min(seconds, settings.EMAILHUB_THROTTLE_MAX_SECONDS)
    try:
        ms = redis_clients.send_path().eval(
            _PAUSE, 1, PAUSE_KEY.format(name=name), int(seconds * 1000), reason[:500]
        )
    except redis_lib.RedisError:
        return 0.0
    return int(ms) / 1000


def pause_remaining(name: str) -> float:
    """Seconds left in `name`'s pause; 0 when it is not paused (or Redis cannot say)."""
    try:
        ms = redis_clients.send_path().pttl(PAUSE_KEY.format(name=name))
    except redis_lib.RedisError:
        return 0.0
    return max(int(ms), 0) / 1000
