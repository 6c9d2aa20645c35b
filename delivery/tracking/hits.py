"""The Redis list between the tracking views and the recorder.

A tracking request does one RPUSH and no SQL: the pixel must answer in a millisecond however
many recipients open at once, and a burst of opens must not become a burst of INSERTs. The beat
task `delivery.drain_tracking_hits` pops up to EMAILHUB_TRACKING_DRAIN_BATCH hits atomically
(`LPOP key count`, Redis ≥ 6.2) and records them with one `record_events` call. A hit carries
its own random id (the event id), so a batch recorded twice is deduplicated by the event
table's unique index.

Loss model: a batch whose INSERT fails (the database is down) is pushed back for the next tick;
a hit popped by a drain process that dies before its INSERT commits is lost (at most one
batch); Redis down means the pixel still answers and the hit is not counted. Tracking is a
measurement, not a ledger, and is documented that way.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import redis as redis_lib
from django.conf import settings

from core import redis_clients

logger = logging.getLogger(__name__)

OPEN = "o"
CLICK = "c"
# Stored request fields are cut: a user agent is rarely over 300 characters, and a hostile one
# must not make the queue (or the event table) large.
USER_AGENT_MAX_CHARS = 512
IP_MAX_CHARS = 45


@dataclass(frozen=True)
class QueuedHit:
    hit_id: str
    kind: str  # OPEN | CLICK
    message_id: int
    link: int | None
    url: str
    user_agent: str
    ip: str
    at: float  # Unix time of the request


def _storable(text: str, limit: int) -> str:
    # jsonb (the event's payload) refuses NUL; request headers are Latin-1, so nothing else.
    return text[:limit].replace("\x00", "")


def encode(
    kind: str, message_id: int, *, link: int | None, url: str, user_agent: str, ip: str, at: float
) -> str:
    return json.dumps(
        [
            secrets.token_hex(10),
            kind,
            message_id,
            link,
            url,
            _storable(user_agent, USER_AGENT_MAX_CHARS),
            _storable(ip, IP_MAX_CHARS),
            at,
        ],
        separators=(",", ":"),
    )


def decode(raw: bytes | str) -> QueuedHit | None:
    """A queued hit, or None for an entry that is not one (logged, dropped)."""
    try:
        hit_id, kind, message_id, link, url, user_agent, ip, at = json.loads(raw)
        hit = QueuedHit(str(hit_id), str(kind), int(message_id), None if link is None else int(link),
                        str(url), str(user_agent), str(ip), float(at))  # fmt: skip
    except (ValueError, TypeError) as exc:
        logger.warning("dropping a malformed tracking hit %r: %s", raw[:200], exc)
        return None
    if hit.kind not in (OPEN, CLICK) or not 0 < hit.at < 2**33 or not 0 < hit.message_id < 2**63:
        logger.warning("dropping a tracking hit that is not one: %r", raw[:200])
        return None
    return hit


def push(entry: str) -> bool:
    """Queue one hit; False (logged) when Redis is unavailable: the answer does not change."""
    try:
        redis_clients.send_path().rpush(settings.EMAILHUB_TRACKING_QUEUE, entry)
    except redis_lib.RedisError as exc:
        logger.warning("tracking hit not queued (Redis unavailable): %s", exc)
        return False
    return True


def pop(count: int) -> list[Any]:
    """Up to `count` queued entries, removed atomically (two drains never get the same hit)."""
    popped = redis_clients.send_path().lpop(settings.EMAILHUB_TRACKING_QUEUE, count)
    return list(popped or [])


def pending() -> int:
    return int(redis_clients.send_path().llen(settings.EMAILHUB_TRACKING_QUEUE))
