"""The suppression list's writes for other apps: addresses that must never be mailed again.

Delivery records a permanent failure here (and, with the webhooks, bounces, complaints and
unsubscribes). One set-based INSERT per call, never one query per address; an address already
suppressed keeps its first reason. Runs in the caller's transaction, so a suppression commits
with the message outcome that caused it. This module imports nothing of delivery.
"""

from __future__ import annotations

from collections.abc import Iterable

from campaigns.models import Suppression

# Suppression.detail is free text from a provider's reply; keep rows small.
DETAIL_MAX_CHARS = 2000


def suppress(addresses: Iterable[tuple[str, str]], reason: str) -> None:
    """Suppress each (address, detail) for `reason` (a `Suppression.Reason`)."""
    rows = [
        Suppression(email=email.lower(), reason=reason, detail=detail[:DETAIL_MAX_CHARS])
        for email, detail in addresses
    ]
    if rows:
        Suppression.objects.bulk_create(rows, ignore_conflicts=True)
