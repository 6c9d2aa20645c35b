"""One circuit breaker per provider endpoint, its state shared by every worker process through Redis.

A circuit is one provider name at one endpoint (`circuit_key`: `smtp@relay.example.com:587`, or
the name alone for a provider with one endpoint). One name can point at two servers, in two
processes (the bulk workers' SMTP_HOST another relay than the transactional workers'): keyed by
the name alone, the healthy relay's successes kept resetting the dead relay's failure count, its
circuit never opened, and every bulk batch waited out its timeouts (issue 18). Every process
registers the circuits it sends through (`register_circuit`), so the health page, the API and
the metrics show each of them (`circuits_seen`), naming its endpoint. The functions below take
a circuit's key as `name`.

pybreaker's traits, and what we do about each (docs/delivery.md says more):
- `CircuitBreaker.call()` holds the breaker's lock for the whole provider call. Workers are
  prefork processes running one task at a time, so the lock is never contended; a threaded pool
  would serialise sends per provider.
- `CircuitRedisStorage` answers "closed" when Redis fails (fail open): sends go on, and every
  process logs the Redis error. Losing the breaker is better than losing the mail.
- In half-open, pybreaker lets every caller through, so N processes would all probe a provider
  that may still be down. `guarded_call` hands out one probe token (`SET NX PX`) per probe
  window; the others treat the breaker as open.
Only ProviderUnavailable counts as a failure: a permanent recipient error (550, MessageRejected,
SendGrid 400) is the recipient's fault, not the provider's. Any success resets the count, so
`fail_max` means consecutive provider failures across all processes. ProviderThrottled (the
provider is up but rate-limiting us) is neither: it leaves the breaker exactly as it was.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pybreaker
import redis as redis_lib
from django.conf import settings

from core import redis_clients
from delivery.exceptions import CircuitOpen, ProviderThrottled, ProviderUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")

# {name}: a circuit key (circuit_key).
NAMESPACE = "emailhub:breaker:{name}"
STATS_KEY = "emailhub:provider:{name}"
# How long one process may hold the half-open probe before another may try.
PROBE_TOKEN_SECONDS = 30


_RELEASE_TOKEN = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


# While another process probes, the probe normally finishes within a second (one send); after
# it the circuit is closed or re-opened with a fresh reset timeout.
PROBE_WAIT_SECONDS = 1.0


_breakers: dict[str, pybreaker.CircuitBreaker] = {}


def circuit_key(provider: str, endpoint: str) -> str:
    """The circuit of `provider` at `endpoint` (the name alone when it has no endpoint)."""
    return f"{provider}@{endpoint}" if endpoint else provider


# The circuits processes send through: a hash of "<pool> <circuit key>" → JSON {provider,
# endpoint, pool, seen_at}. A process writes its entry when it first sends through a circuit and
# then at most once per REGISTER_EVERY_SECONDS (a dictionary look-up per send otherwise);
# circuits_seen shows those seen within CIRCUIT_SHOWN_SECONDS, so an endpoint no process uses
# any more (a relay moved) drops off the pages a day later. Rebuilt by the next sends after a
# Redis flush, like the breakers themselves.
CIRCUITS_KEY = "emailhub:circuits"
REGISTER_EVERY_SECONDS = 60.0
CIRCUIT_SHOWN_SECONDS = 24 * 3600.0
_registered: dict[tuple[str, str], float] = {}


@dataclass(frozen=True)
class CircuitSeen:
    key: str
    provider: str
    endpoint: str
    pools: tuple[str, ...]  # the pools that sent through it


def register_circuit(provider: str, endpoint: str, pool: str) -> str:
    """Note that this process sends `pool`'s mail through `provider` at `endpoint`; return the
    circuit's key."""
    key = circuit_key(provider, endpoint)
    now = time.monotonic()
    last = _registered.get((pool, key))
    if last is None or now - last >= REGISTER_EVERY_SECONDS:
        _registered[(pool, key)] = now
        entry = {"provider": provider, "endpoint": endpoint, "pool": pool, "seen_at": time.time()}
        try:
            redis_clients.send_path().hset(CIRCUITS_KEY, f"{pool} {key}", json.dumps(entry))
        except redis_lib.RedisError:
            pass  # the circuit works without it; only the pages miss it until the next try
    return key


def circuits_seen(pools: tuple[str, ...]) -> list[CircuitSeen]:
    """The circuits sent through in the last CIRCUIT_SHOWN_SECONDS, each with the pools (in the
    order of `pools`) that used it. Raises RedisError when Redis cannot say."""
    oldest = time.time() - CIRCUIT_SHOWN_SECONDS
    used: dict[tuple[str, str], set[str]] = {}
    for value in redis_clients.send_path().hvals(CIRCUITS_KEY):
        entry = json.loads(value)
        if float(entry["seen_at"]) >= oldest:
            used.setdefault((entry["provider"], entry["endpoint"]), set()).add(entry["pool"])
    return [
        CircuitSeen(circuit_key(provider, endpoint), provider, endpoint, tuple(p for p in pools if p in seen))
        for (provider, endpoint), seen in sorted(used.items())
    ]


def reset_process_state() -> None:
    """Forget this process's clients, breakers and registrations (after fork, or between tests)."""
    _breakers.clear()
    _registered.clear()
    redis_clients.reset()


# Record a state change once, however many processes report it. Two processes whose calls fail
# together both tell pybreaker to open the circuit, each from its own view of the old state;
# only the first of them changes the shared state, so only it is counted and logged.
_RECORD_CHANGE = """
if redis.call('HGET', KEYS[1], 'state') == ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'last_change', ARGV[2], 'last_change_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'changes_to_' .. ARGV[1], 1)
return 1
"""


class _Recorder(pybreaker.CircuitBreakerListener):
    """Logs and counts every state change, and remembers the circuit's last error."""

    def __init__(self, circuit: str) -> None:
        self.provider = circuit

    def state_change(self, cb: pybreaker.CircuitBreaker, old_state: object, new_state: object) -> None:
        old = getattr(old_state, "name", str(old_state))
        new = getattr(new_state, "name", str(new_state))
        try:
            changed = redis_clients.send_path().eval(
                _RECORD_CHANGE, 1, STATS_KEY.format(name=self.provider), new, f"{old}->{new}", time.time()
            )
        except redis_lib.RedisError as exc:
            logger.warning("could not record breaker change for %s: %s", self.provider, exc)
            changed = 1
        if changed:
            log = logger.warning if new == pybreaker.STATE_OPEN else logger.info
            log("circuit breaker for %s: %s -> %s", self.provider, old, new)

    def failure(self, cb: pybreaker.CircuitBreaker, exc: BaseException) -> None:
        key = STATS_KEY.format(name=self.provider)
        try:
            pipe = redis_clients.send_path().pipeline()
            pipe.hset(key, mapping={"last_error": str(exc)[:1000], "last_error_at": time.time()})
            pipe.hincrby(key, "failures", 1)
            pipe.execute()
        except redis_lib.RedisError:
            pass  # the breaker itself fails open; losing a statistic is fine


def breaker_for(name: str) -> pybreaker.CircuitBreaker:
    breaker = _breakers.get(name)
    if breaker is not None:
        return breaker
    try:
        storage: pybreaker.CircuitBreakerStorage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, redis_clients.send_path(), namespace=NAMESPACE.format(name=name)
        )
    except redis_lib.RedisError as exc:
        # CircuitRedisStorage writes its initial state in its constructor and does not catch
        # Redis errors there. Fail open with a process-local breaker, and try Redis again on the
        # next call (this one is not cached).
        logger.warning("Redis unavailable for the %s breaker (%s); using a process-local one", name, exc)
        storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        return _build(name, storage)
    breaker = _breakers[name] = _build(name, storage)
    return breaker


def _build(name: str, storage: pybreaker.CircuitBreakerStorage) -> pybreaker.CircuitBreaker:
    return pybreaker.CircuitBreaker(
        fail_max=settings.EMAILHUB_BREAKER_FAIL_MAX,
        reset_timeout=settings.EMAILHUB_BREAKER_RESET_TIMEOUT,
        # Only a provider-wide failure counts; anything else (a bug, a recipient error) does not.
        exclude=[lambda exc: not isinstance(exc, ProviderUnavailable)],
        state_storage=storage,
        listeners=[_Recorder(name)],
        name=name,
    )


def _seconds_until_probe(breaker: pybreaker.CircuitBreaker) -> float:
    opened_at = breaker._state_storage.opened_at
    if opened_at is None:
        return 0.0
    return max(0.0, opened_at.timestamp() + breaker.reset_timeout - time.time())


def _probe_due(breaker: pybreaker.CircuitBreaker) -> bool:
    return _seconds_until_probe(breaker) <= 0


def is_open(name: str) -> bool:
    """True while the provider's circuit is open and no probe is due yet (a cheap pre-check)."""
    return seconds_until_probe(name) > 0


def seconds_until_probe(name: str) -> float:
    """0 when the provider may be called now; else how long until its open circuit lets a probe
    through (the breaker's remaining reset timeout)."""
    breaker = breaker_for(name)
    if breaker.current_state != pybreaker.STATE_OPEN:
        return 0.0
    return _seconds_until_probe(breaker)


def guarded_call(name: str, func: Callable[[], T], *, probe: Callable[[], T] | None = None) -> T:
    """Call `func` through the provider's breaker; raise CircuitOpen if the provider is skipped.

    `probe`: what to call instead when this call is the circuit's probe (a batch's sender risks
    one message on a provider that may still be down, not the batch). ProviderUnavailable from
    `func` propagates (after being counted).
    """
    breaker = breaker_for(name)
    with breaker._lock:
        started_in = breaker.state  # one Redis read, also the state call_replayed replays through
    state = started_in.name
    if state == pybreaker.STATE_CLOSED:
        return call_replayed(breaker, func, started_in=started_in)
    if state == pybreaker.STATE_OPEN and not _probe_due(breaker):
        wait = _seconds_until_probe(breaker)
        raise CircuitOpen(f"circuit open, next probe in {wait:.0f} s", wait)
    token_key = f"{NAMESPACE.format(name=name)}:probe"
    token = f"{os.getpid()}:{time.monotonic_ns()}"
    try:
        acquired = redis_clients.send_path().set(token_key, token, nx=True, ex=PROBE_TOKEN_SECONDS)
    except redis_lib.RedisError:
        acquired = True  # fail open, like the breaker itself
    if not acquired:
        raise CircuitOpen(f"circuit {state}, another process is probing it", PROBE_WAIT_SECONDS)
    try:
        logger.info("probing %s (circuit %s)", name, state)
        return call_replayed(breaker, probe or func)
    finally:
        try:
            # Only our own token: if ours expired during a long probe, another process holds it now.
            redis_clients.send_path().eval(_RELEASE_TOKEN, 1, token_key, token)
        except redis_lib.RedisError:
            pass


def call_replayed(
    breaker: pybreaker.CircuitBreaker,
    func: Callable[[], T],
    *,
    started_in: pybreaker.CircuitBreakerState | None = None,
) -> T:
    """Call `func` and count its outcome on `breaker` (a throttled provider counts neither way).

    `guarded_call` is what senders use; this is the step under it, public so a test can drive
    two breakers (two processes sharing one Redis state) through a race. `started_in`: the
    breaker's state as the caller just read it (closed), saving the read here.
    """
    # The provider is called first and its outcome then replayed through the breaker, so that a
    # ProviderThrottled can bypass it: pybreaker treats any exception it does not count as a
    # success and resets the failure count (and closes a half-open circuit), but a provider
    # that says "slow down" has shown neither that it is healthy nor that it is down. The
    # outcome is replayed through the state the call started in, as `breaker.call` would have
    # judged it: a call already in flight when another process opened the circuit still counts.
    state = started_in
    if state is None:
        with breaker._lock:
            state = breaker.state
    if state.name == pybreaker.STATE_OPEN and not _probe_due(breaker):
        # Another process opened the circuit after the caller looked: the provider is not called
        # (pybreaker would refuse the outcome uncounted, after the provider had been called).
        wait = _seconds_until_probe(breaker)
        raise CircuitOpen(f"circuit open, next probe in {wait:.0f} s", wait)
    failure: BaseException | None = None
    result: T | None = None
    try:
        result = func()
    except ProviderThrottled:
        raise
    except BaseException as exc:  # noqa: BLE001 - replayed below, unchanged
        failure = exc
    replayed = False

    def replay() -> T:
        nonlocal replayed
        replayed = True
        if failure is not None:
            raise failure
        return result  # type: ignore[return-value]

    try:
        with breaker._lock:
            return state.call(replay)
    except pybreaker.CircuitBreakerError:
        if failure is None:
            # Another process opened the circuit while this call was at the provider, and the
            # provider took it: what it accepted stays accepted (never re-sent elsewhere).
            return result  # type: ignore[return-value]
        if not replayed and breaker.is_system_error(failure):
            # This probe started on a circuit whose reset timeout had passed, and another
            # process's probe re-opened it meanwhile: pybreaker refuses the outcome before
            # counting it, but the provider did fail this call.
            for listener in breaker.listeners:
                listener.failure(breaker, failure)
        # pybreaker raises this instead of the original error on the call that trips it.
        raise ProviderUnavailable(f"{failure} (circuit now open)") from failure


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def snapshot(name: str) -> dict[str, object]:
    """What the health API shows about one circuit's breaker (`name`: its key)."""
    breaker = breaker_for(name)
    storage = breaker._state_storage
    stats = {}
    try:
        raw = redis_clients.send_path().hgetall(STATS_KEY.format(name=name))
        stats = {_text(k): _text(v) for k, v in raw.items()}
    except redis_lib.RedisError as exc:
        stats = {"redis_error": str(exc)}
    opened_at = storage.opened_at
    return {
        "state": breaker.current_state,
        "fail_counter": storage.counter,
        "fail_max": breaker.fail_max,
        "reset_timeout": breaker.reset_timeout,
        "opened_at": opened_at.isoformat() if opened_at and breaker.current_state != "closed" else None,
        "failures_total": int(stats.get("failures", 0)),
        "times_opened": int(stats.get("changes_to_open", 0)),
        "last_error": stats.get("last_error"),
        "last_error_at": float(stats["last_error_at"]) if "last_error_at" in stats else None,
        "last_state_change": stats.get("last_change"),
    }
