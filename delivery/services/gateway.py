"""Send a batch through one named provider: its rate limit first, then its circuit breaker."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis as redis_lib
from django.conf import settings

from delivery.breakers import CircuitOpen, guarded_call, is_open
from delivery.providers import OutgoingEmail, SendResult, get_provider
from delivery.ratelimit import bucket_for

logger = logging.getLogger(__name__)


class ProviderSkipped(Exception):
    """The provider was not tried (open circuit, no send quota left): use the next one."""


# Critical and high may wait this long for a token before failing over; bulk waits longer.
TRANSACTIONAL_MAX_WAIT_SECONDS = 1.0


def send_via(name: str, emails: Sequence[OutgoingEmail], *, transactional: bool) -> list[SendResult]:
    """One result per email. Raises ProviderSkipped, or ProviderUnavailable (counted by the breaker)."""
    bucket = bucket_for(name)
    allowed = len(emails)
    if bucket is not None:
        # Checked before taking tokens, so a provider that is skipped anyway costs no quota.
        # (Without a bucket guarded_call's own check suffices: one Redis round trip less.)
        if is_open(name):
            raise ProviderSkipped(f"{name}: circuit open")
        max_wait = (
            TRANSACTIONAL_MAX_WAIT_SECONDS if transactional else settings.EMAILHUB_RATE_MAX_WAIT_SECONDS
        )
        try:
            allowed = bucket.acquire(len(emails), reserved=transactional, max_wait=max_wait)
        except redis_lib.RedisError as exc:
            # Fail open, as the breaker does: an unmetered send beats a stranded batch. The
            # provider's own limit (429, throttling) still stops us if we overshoot.
            logger.warning("rate limit for %s unavailable (%s); sending unmetered", name, exc)
            allowed = len(emails)
        if allowed == 0:
            raise ProviderSkipped(f"{name}: send-rate quota used up")
    batch, later = list(emails[:allowed]), list(emails[allowed:])
    provider = get_provider(name)
    try:
        results = guarded_call(name, lambda: provider.send_batch(batch))
    except CircuitOpen as exc:
        raise ProviderSkipped(str(exc)) from exc
    return results + [SendResult.transient(f"{name}: send-rate quota used up") for _ in later]
