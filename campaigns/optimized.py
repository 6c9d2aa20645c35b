"""`optimized` campaigns: each recipient's due instant inside the campaign's window.

Fan-out computes every due instant in SQL, in the same INSERT … SELECT that creates the
messages (`delivery.services.transitions.materialise_step`). What it joins is decided here, once
per fan-out run, in Python and with core.localtime's rules, for each distinct timezone of the
list × 24 local hours:

- `slots`: (timezone, local hour) → the first UTC instant inside [window_start, window_start +
  window_hours) whose local hour is that hour. The window's first local hour starts at
  window_start itself; every other hour at its wall hh:00, localised by core.localtime (an
  ambiguous fall-back hour takes its first occurrence, an hour that does not exist on a
  spring-forward day maps to the transition). An hour that never occurs in the window has no row.
- `fallbacks`: timezone → the instant of the population's best hour among the hours the window
  holds in that timezone. A contact with no stored best hour, or whose best hour does not occur
  in the window, is due then.

A contact's own best hour is `EngagementProfile.best_hour`, stored by the engagement refresh
(never computed per recipient here). Holdout contacts (campaigns.selectors.holdout_sql: a stable
hash of campaign and contact below holdout_percent) are due at window_start, the window's
default time, so the report can compare the two groups.

Every due instant is one of at most (24 hours × distinct UTC offsets) + 1 values, and messages
are indexed per (campaign, due instant) slot: a 1M-recipient campaign is a few hundred units.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from campaigns.besthour import best_hour
from campaigns.models import Campaign, EngagementPopulation
from campaigns.selectors import WindowPlan
from core.localtime import localize, zone


def hour_instants(tz_name: str, start: datetime, hours: int) -> dict[int, datetime]:
    """Local hour → its first UTC instant inside [start, start + hours h) in timezone `tz_name`.

    An hour that really occurs in the window maps to its first real occurrence (a fall-back hour
    to the first of its two). Only an hour that never occurs, being skipped by a spring-forward
    gap, maps by core.localtime's gap rule to the transition instant."""
    tz = zone(tz_name)
    end = start + timedelta(hours=hours)
    local_start = start.astimezone(tz)
    firsts: dict[int, datetime] = {local_start.hour: start}
    gaps: dict[int, datetime] = {}
    day = local_start.date() - timedelta(days=1)
    last_day = end.astimezone(tz).date() + timedelta(days=1)
    while day <= last_day:
        for hour in range(24):
            instant = localize(datetime(day.year, day.month, day.day, hour), tz)
            if not start <= instant < end:
                continue
            found = firsts if instant.astimezone(tz).hour == hour else gaps
            if hour not in found or instant < found[hour]:
                found[hour] = instant
        day += timedelta(days=1)
    return {**gaps, **firsts}


def population_hour(population: list[float] | None, order: list[int]) -> int:
    """The population's best hour among the window's hours `order` (in the order the window
    meets them: ties go to the earliest): campaigns.besthour.best_hour with no contact history,
    so its smoothing and its 10:00 fallback without population data apply."""
    return best_hour(None, population, k=settings.EMAILHUB_STO_PRIOR_STRENGTH, window=order)


def _audience_timezones(contact_list_id: int | None) -> list[str]:
    """The timezones of the list's members, or of every contact for a segment's campaign (the
    plan covers them all; a timezone no recipient has costs a few rows in the plan's tables)."""
    with connection.cursor() as cursor:
        if contact_list_id is None:
            cursor.execute("SELECT DISTINCT c.timezone FROM campaigns_contact AS c")
        else:
            cursor.execute(
                """
                SELECT DISTINCT c.timezone FROM campaigns_listmembership AS lm
                  JOIN campaigns_contact AS c ON c.id = lm.contact_id
                 WHERE lm.contact_list_id = %s
                """,
                [contact_list_id],
            )
        return sorted(row[0] for row in cursor.fetchall())


def window_plan(campaign: Campaign) -> WindowPlan:
    """The plan of an optimized campaign, from its stored window (so a resumed fan-out decides as
    the first run did, but for the population prior, which a refresh may have moved)."""
    if campaign.window_start is None:
        raise ValueError(f"optimized campaign {campaign.pk} has no window_start")
    start = campaign.window_start.replace(microsecond=0)
    population_row = EngagementPopulation.objects.first()
    population = list(population_row.histogram) if population_row else None
    plan = WindowPlan(window_start=start, holdout_percent=campaign.holdout_percent)
    for name in _audience_timezones(campaign.contact_list_id):
        firsts = hour_instants(name, start, campaign.window_hours)
        for hour, due in sorted(firsts.items()):
            plan.slot_zones.append(name)
            plan.slot_hours.append(hour)
            plan.slot_dues.append(due)
        plan.fallback_zones.append(name)
        order = sorted(firsts, key=lambda hour: firsts[hour])
        plan.fallback_dues.append(firsts[population_hour(population, order)])
    return plan
