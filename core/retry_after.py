"""Reading a `Retry-After` header, for every client of someone else's HTTP service that honours it
(a provider's throttling, an application's webhook endpoint)."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | None) -> float | None:
    """A `Retry-After` header (RFC 9110 §10.2.3): delay-seconds or an HTTP-date. None when
    absent or unreadable (the caller then uses its default pause)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
