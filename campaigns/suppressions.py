"""The suppression list's writes for other apps: addresses that must never be mailed again.

Delivery records a permanent failure here (and, with the webhooks, bounces, complaints and
unsubscribes). One set-based INSERT per call, never one query per address. An address already
suppressed keeps its first reason, with one exception: an `unsubscribed` suppression stops only
marketing mail (transactional mail still goes, see campaigns.selectors.suppressed_sql), so a later
bounce or complaint for the address replaces it; otherwise a hard-bounced address would keep
receiving transactional mail. Runs in the caller's transaction, so a suppression commits with
the message outcome that caused it. This module imports nothing of delivery.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from campaigns.models import Suppression

# Suppression.detail is free text from a provider's reply; keep rows small.
DETAIL_MAX_CHARS = 2000


# Reasons that stop every message, stronger than an unsubscribe (which stops marketing only).
_STRONGER_THAN_UNSUBSCRIBE = (
    Suppression.Reason.BOUNCED,
    Suppression.Reason.COMPLAINED,
    Suppression.Reason.MANUAL,
)

_SUPPRESS_SQL = """
INSERT INTO campaigns_suppression (email, reason, detail, created_at)
SELECT v.email, %s, v.detail, now() FROM unnest(%s::text[], %s::text[]) AS v(email, detail)
ON CONFLICT (email) DO UPDATE SET reason = EXCLUDED.reason, detail = EXCLUDED.detail
 WHERE campaigns_suppression.reason = 'unsubscribed' AND EXCLUDED.reason = ANY(%s)
"""


def suppress(addresses: Iterable[tuple[str, str]], reason: str) -> None:
    """Suppress each (address, detail) for `reason` (a `Suppression.Reason`)."""
    # One row per address (ON CONFLICT DO UPDATE may not touch a row twice in one statement).
    rows: dict[str, str] = {}
    for email, detail in addresses:
        rows.setdefault(email.lower(), detail[:DETAIL_MAX_CHARS])
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(
                _SUPPRESS_SQL,
                [reason, list(rows), list(rows.values()), [str(r) for r in _STRONGER_THAN_UNSUBSCRIBE]],
            )


def stronger(reason: str, other: str) -> str:
    """Of two reasons for one address, the one to record: anything beats `unsubscribed`."""
    return other if reason == Suppression.Reason.UNSUBSCRIBED else reason
