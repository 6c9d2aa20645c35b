"""Send a batch through one named provider: its pause and rate limit first, then its breaker.

All three belong to the circuit the provider sends through here: its name at its endpoint
(delivery/breakers.py), so two relays behind one provider name never share a circuit, a bucket
or a pause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import redis as redis_lib
from django.conf import settings

from core import metrics
from delivery.breakers import (
    PROBE_WAIT_SECONDS,
    circuit_key,
    guarded_call,
    register_circuit,
    seconds_until_probe,
)
from delivery.exceptions import CircuitOpen, ProviderSkipped, ProviderThrottled, ProviderUnavailable
from delivery.providers import UNGUARDED, Guard, OutgoingEmail, SendResult, get_provider
from delivery.ratelimit import bucket_for, pause_provider, pause_remaining

logger = logging.getLogger(__name__)

# The two pools, each with its provider chain (delivery.services.sending.provider_chain).
TRANSACTIONAL = "transactional"
BULK = "bulk"


# Critical and high may wait this long for a token before failing over; bulk waits longer.
TRANSACTIONAL_MAX_WAIT_SECONDS = 1.0
# A bucket holds one second of quota, so a batch that got no token can be tried a second later.
QUOTA_WAIT_SECONDS = 1.0


def send_via(
    name: str, emails: Sequence[OutgoingEmail], *, transactional: bool, guard: Guard = UNGUARDED
) -> list[SendResult]:
    """One result per email. Raises ProviderSkipped, or ProviderUnavailable (counted by the breaker).

    The provider asks `guard` before it hands each email over (ABANDONED when it may not).
    Error texts do not repeat the provider's name: the caller prefixes it.
    """
    provider = get_provider(name)
    circuit = register_circuit(name, provider.endpoint, TRANSACTIONAL if transactional else BULK)
    paused = pause_remaining(circuit)
    if paused > 0:
        raise ProviderSkipped(f"paused for {paused:.0f} s (the provider asked us to slow down)", paused)
    allowed = _quota(name, circuit, len(emails), transactional)
    batch, later = list(emails[:allowed]), list(emails[allowed:])

    def call(emails: list[OutgoingEmail]) -> list[SendResult]:
        started = time.perf_counter()
        try:
            return provider.send_batch(emails, guard)
        finally:  # failures too: a slow timeout is what the histogram is for
            metrics.observe_provider_call(name, time.perf_counter() - started)

    probed: list[bool] = []

    def probe() -> list[SendResult]:
        # The circuit's probe risks one message; the rest wait for its verdict, attempt kept.
        probed.append(True)
        rest = SendResult.not_tried("waiting for the circuit's probe", PROBE_WAIT_SECONDS)
        return call(batch[:1]) + [rest for _ in batch[1:]]

    try:
        results = _through_breaker(circuit, lambda: call(batch), batch, probe=probe)
    except ProviderUnavailable as exc:
        if not probed or len(batch) == 1:
            raise
        # The failed probe (already counted by the breaker) was handed one message: that one
        # was tried; the others never left us and wait for the next probe without an attempt.
        wait = seconds_until_probe(circuit) or PROBE_WAIT_SECONDS
        rest = SendResult.not_tried(f"circuit open, next probe in {wait:.0f} s", wait)
        results = [SendResult.transient(str(exc))] + [rest for _ in batch[1:]]
    return results + [SendResult.not_tried("send-rate quota used up", QUOTA_WAIT_SECONDS) for _ in later]


def _quota(name: str, circuit: str, wanted: int, transactional: bool) -> int:
    """How many of `wanted` emails the circuit's send-rate bucket lets through now (all of them
    without a bucket); ProviderSkipped when none, or when the circuit is open."""
    bucket = bucket_for(name, circuit)
    if bucket is None:
        return wanted  # guarded_call's own check of the circuit suffices: one Redis round trip less
    # Checked before taking tokens, so a provider that is skipped anyway costs no quota.
    wait = seconds_until_probe(circuit)
    if wait > 0:
        raise ProviderSkipped(f"circuit open, next probe in {wait:.0f} s", wait)
    max_wait = TRANSACTIONAL_MAX_WAIT_SECONDS if transactional else settings.EMAILHUB_RATE_MAX_WAIT_SECONDS
    try:
        allowed = bucket.acquire(wanted, reserved=transactional, max_wait=max_wait)
    except redis_lib.RedisError as exc:
        # Fail open, as the breaker does: an unmetered send beats a stranded batch. The
        # provider's own limit (429, throttling) still stops us if we overshoot.
        logger.warning("rate limit for %s unavailable (%s); sending unmetered", circuit, exc)
        return wanted
    if allowed == 0:
        raise ProviderSkipped("send-rate quota used up", QUOTA_WAIT_SECONDS)
    return allowed


def _through_breaker(
    circuit: str,
    call: Callable[[], list[SendResult]],
    batch: list[OutgoingEmail],
    *,
    probe: Callable[[], list[SendResult]] | None = None,
) -> list[SendResult]:
    """`call` under the circuit's breaker: an open circuit skips the provider; a provider that
    asks us to slow down pauses the circuit (what it took before refusing stays sent)."""
    try:
        return guarded_call(circuit, call, probe=probe)
    except CircuitOpen as exc:
        raise ProviderSkipped(str(exc), exc.retry_after) from exc
    except ProviderThrottled as exc:
        paused = pause_provider(circuit, exc.retry_after, str(exc))
        logger.warning("%s is rate limiting us (%s); paused for %.0f s", circuit, exc, paused)
        wait = paused or settings.EMAILHUB_THROTTLE_DEFAULT_SECONDS
        error = f"rate limited ({exc}); paused for {wait:.0f} s"
        if not exc.partial:
            raise ProviderSkipped(error, wait) from exc
        # It took part of the batch before refusing: those stay sent; the rest was not tried.
        return [exc.partial.get(e.message_id) or SendResult.not_tried(error, wait) for e in batch]


def circuit_of(name: str) -> str:
    """The circuit key this process's provider `name` sends through (its name and endpoint)."""
    return circuit_key(name, get_provider(name).endpoint)
