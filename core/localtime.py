"""Wall-clock times in a timezone → UTC instants, with emailhub's rules for DST transitions.

- A wall time that exists once maps to that instant.
- An ambiguous wall time (fall-back: 01:30 happens twice) takes the first occurrence.
- A wall time that does not exist (spring-forward gap: 02:30) maps to the first valid instant
  after it, i.e. the moment of the transition (03:00 in America/New_York).
PostgreSQL's `AT TIME ZONE` resolves gaps and folds differently, which is why the instants are
computed here, once per distinct timezone, and joined to the audience in SQL.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from core.timezones import known_timezones


@lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def localize(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of naive wall time `wall` in `tz`, by the rules above."""
    first = wall.replace(tzinfo=tz, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant  # exists; fold=0 is the first occurrence of an ambiguous time
    # In a gap, fold=0 and fold=1 read the wall time with the offsets before and after the
    # transition; the transition lies between the two instants. Find it (to the second).
    a, b = sorted((instant, wall.replace(tzinfo=tz, fold=1).astimezone(UTC)))
    after_offset = b.astimezone(tz).utcoffset()
    while b - a > timedelta(seconds=1):
        middle = a + (b - a) / 2
        if middle.astimezone(tz).utcoffset() == after_offset:
            b = middle
        else:
            a = middle
    return b.replace(microsecond=0)


def local_due(day: date, at: time, tz: ZoneInfo, *, now: datetime, policy: str) -> datetime | None:
    """When a recipient in `tz` gets a campaign sent at `at` on `day`, or None to skip them.

    `policy` applies when that instant has already passed: `next_day` (the same wall time the
    next day), `send_now`, or `skip`.
    """
    due = localize(datetime.combine(day, at), tz)
    if due >= now:
        return due
    if policy == "next_day":
        return localize(datetime.combine(day + timedelta(days=1), at), tz)
    if policy == "send_now":
        return now
    return None


def due_by_timezone(day: date, at: time, *, now: datetime, policy: str) -> dict[str, datetime]:
    """The due instant for every IANA timezone (skipped zones are left out)."""
    dues = {}
    for name in known_timezones():
        due = local_due(day, at, zone(name), now=now, policy=policy)
        if due is not None:
            dues[name] = due
    return dues
