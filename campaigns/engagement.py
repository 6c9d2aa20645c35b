"""Engagement profiles: per-contact 24-bin histograms of human opens and clicks by local hour.

`refresh_profiles()` (the beat task `campaigns.refresh_engagement`, every 60 s) folds the human
open and click events recorded since the watermark into the profiles, in steps of
EMAILHUB_ENGAGEMENT_REFRESH_STEP events, each step one transaction of four statements whatever
the number of contacts:

1. lock the population row (two refreshes never fold one event twice) and read the watermark;
2. one statement: the step's human events (delivery's `HUMAN_ENGAGEMENT_STEP_CTES`) mapped to
   contacts (a campaign message's contact, else the recipient address), binned by the hour of
   `occurred_at AT TIME ZONE contact.timezone` (PostgreSQL's tz database, DST-correct), weighted
   (click > open; a hit within EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES of the message's send counts
   EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT: its hour is the hour we sent as much as the reader's
   habit) and decayed to the refresh instant, upserted into the profiles (existing bins
   decayed to the same instant first), the population histogram moved the same way and the
   watermark advanced;
3. read the new population;
4. store the best hour (no window) of every touched contact, computed in one Python pass over
   their 24 bins (campaigns.besthour) and written with one UPDATE … FROM unnest.

Decay: a weight w at time t is worth w·2^(−(T−t)/half-life) at T. Decay is linear, so bins
decayed to the same instant can be added, and the population histogram is, at every refresh,
the sum of all profiles decayed to that instant.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from campaigns.besthour import HOURS, best_hour, best_hour_fast, ordered_window, prepared_prior
from delivery.selectors import HUMAN_ENGAGEMENT_STEP_CTES

POPULATION_ID = 1
# 2^-1000 ≈ 1e-301: older weight is zero for every purpose, and PostgreSQL's power() raises on
# float underflow instead of returning 0.
_MAX_HALF_LIVES = 1000


def _decay(elapsed_seconds_sql: str) -> str:
    """SQL factor 2^(−elapsed/half-life), never above 1 (a future timestamp is not amplified)."""
    return (
        f"power(2::float8, -least(greatest(0::float8, {elapsed_seconds_sql}) / %(half_life)s,"
        f" {_MAX_HALF_LIVES}::float8))"
    )


def _array(expr: str) -> str:
    """ARRAY[expr(1), …, expr(24)]: `expr` formats `{i}` (1-based, PostgreSQL arrays) and `{h}`."""
    return "ARRAY[" + ", ".join(expr.format(i=h + 1, h=h) for h in range(HOURS)) + "]::float8[]"


_FRESH_BINS = _array("COALESCE(sum(w) FILTER (WHERE bin = {h}), 0)")
_PROFILE_DECAYED = _array("p.histogram[{i}] * d.f + EXCLUDED.histogram[{i}]")
_PROFILE_FACTOR = _decay("extract(epoch FROM EXCLUDED.decayed_at - p.decayed_at)::float8")
_STEP_SUM = _array("COALESCE(sum(histogram[{i}]), 0)")
_POPULATION_DECAYED = _array("pop.histogram[{i}] * d.f + s.histogram[{i}]")
_POPULATION_FACTOR = _decay("extract(epoch FROM %(now)s - pop.decayed_at)::float8")
_EVENT_FACTOR = _decay("extract(epoch FROM %(now)s - occurred_at)::float8")

_FOLD_SQL = f"""
WITH {HUMAN_ENGAGEMENT_STEP_CTES},
zones AS (
    SELECT unnest(%(zones)s::text[]) AS name
), hits AS (
    SELECT c.id AS contact_id, COALESCE(z.name, 'UTC') AS tz, h.kind, h.occurred_at,
           h.occurred_at >= h.sent_at AND h.occurred_at < h.sent_at + %(arrival)s AS on_arrival
      FROM human_engagement AS h
      LEFT JOIN campaigns_contact AS by_address ON h.contact_id IS NULL AND by_address.email = h.recipient
      JOIN campaigns_contact AS c ON c.id = COALESCE(h.contact_id, by_address.id)
      LEFT JOIN zones AS z ON z.name = c.timezone
), weighted AS (
    SELECT contact_id,
           extract(hour FROM occurred_at AT TIME ZONE tz)::int AS bin,
           (CASE kind WHEN 'clicked' THEN %(click_weight)s ELSE %(open_weight)s END)::float8
             * (CASE WHEN on_arrival THEN %(arrival_weight)s ELSE 1 END)::float8
             * {_EVENT_FACTOR} AS w
      FROM hits
), cells AS (
    -- One row per (contact, hour) first: the 24-way pivot below then reads a few rows per
    -- contact instead of every event.
    SELECT contact_id, bin, sum(w) AS w FROM weighted GROUP BY contact_id, bin
), fresh AS (
    SELECT contact_id, {_FRESH_BINS} AS histogram
      FROM cells
     GROUP BY contact_id
), upserted AS (
    INSERT INTO campaigns_engagementprofile AS p (contact_id, histogram, decayed_at, best_hour)
    SELECT contact_id, histogram, %(now)s, NULL FROM fresh
    ON CONFLICT (contact_id) DO UPDATE
       SET histogram = (SELECT {_PROFILE_DECAYED}
                          FROM (SELECT {_PROFILE_FACTOR} AS f) AS d),
           decayed_at = EXCLUDED.decayed_at
    RETURNING p.contact_id, p.histogram
), step_sum AS (
    SELECT array_agg(COALESCE(b.w, 0) ORDER BY hours.h)::float8[] AS histogram
      FROM generate_series(0, 23) AS hours(h)
      LEFT JOIN (SELECT bin, sum(w) AS w FROM cells GROUP BY bin) AS b ON b.bin = hours.h
), population AS (
    UPDATE campaigns_engagementpopulation AS pop
       SET histogram = (SELECT {_POPULATION_DECAYED}
                          FROM (SELECT {_POPULATION_FACTOR} AS f) AS d),
           decayed_at = GREATEST(pop.decayed_at, %(now)s),
           last_event_id = COALESCE((SELECT w.upto FROM event_window AS w), pop.last_event_id)
      FROM step_sum AS s
     WHERE pop.id = {POPULATION_ID}
    RETURNING pop.last_event_id
)
SELECT u.contact_id, u.histogram, (SELECT last_event_id FROM population) FROM upserted AS u
UNION ALL
SELECT NULL, NULL, (SELECT last_event_id FROM population)
"""


@dataclass
class RefreshReport:
    steps: int = 0
    contacts: int = 0  # profile upserts (a contact touched in two steps counts twice)
    last_event_id: int = 0


def _half_life_seconds() -> float:
    return float(settings.EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS) * 86400.0


def _ensure_population(now: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO campaigns_engagementpopulation (id, histogram, decayed_at, last_event_id)"
            " VALUES (%s, %s, %s, 0) ON CONFLICT (id) DO NOTHING",
            [POPULATION_ID, [0.0] * HOURS, now],
        )


def _postgres_zones() -> list[str]:
    # A contact's zone is validated against Python's zoneinfo; one PostgreSQL's tz database does
    # not know would make `AT TIME ZONE` raise and stop every refresh, so unknown zones bin in UTC.
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_timezone_names")
        return [row[0] for row in cursor.fetchall()]


def refresh_profiles(
    *, now: datetime | None = None, step: int | None = None, max_steps: int | None = None
) -> RefreshReport:
    """Fold every settled human open/click since the watermark into the profiles (see module doc)."""
    now = now or timezone.now()
    step = step or settings.EMAILHUB_ENGAGEMENT_REFRESH_STEP
    cutoff = now - timedelta(seconds=settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS)
    params = {
        "now": now,
        "cutoff": cutoff,
        "limit": step,
        "half_life": _half_life_seconds(),
        "click_weight": float(settings.EMAILHUB_ENGAGEMENT_CLICK_WEIGHT),
        "open_weight": float(settings.EMAILHUB_ENGAGEMENT_OPEN_WEIGHT),
        "arrival": timedelta(minutes=settings.EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES),
        "arrival_weight": float(settings.EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT),
        "zones": _postgres_zones(),
    }
    k = float(settings.EMAILHUB_STO_PRIOR_STRENGTH)
    report = RefreshReport()
    _ensure_population(now)
    while max_steps is None or report.steps < max_steps:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT last_event_id FROM campaigns_engagementpopulation WHERE id = %s FOR UPDATE",
                [POPULATION_ID],
            )
            after = int(cursor.fetchone()[0])
            cursor.execute(_FOLD_SQL, {**params, "after": after})
            rows = cursor.fetchall()
            watermark = int(rows[0][2]) if rows and rows[0][2] is not None else after
            touched = [(contact_id, histogram) for contact_id, histogram, _ in rows if contact_id is not None]
            if touched:
                cursor.execute(
                    "SELECT histogram FROM campaigns_engagementpopulation WHERE id = %s", [POPULATION_ID]
                )
                prior = prepared_prior(cursor.fetchone()[0], k=k)
                cursor.execute(
                    """
                    UPDATE campaigns_engagementprofile AS p SET best_hour = v.hour
                      FROM unnest(%s::bigint[], %s::smallint[]) AS v(contact_id, hour)
                     WHERE p.contact_id = v.contact_id
                    """,
                    [[c for c, _ in touched], [best_hour_fast(h, prior) for _, h in touched]],
                )
        report.steps += 1
        report.contacts += len(touched)
        report.last_event_id = watermark
        if watermark == after:
            break
    return report


def population_histogram() -> list[float] | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT histogram FROM campaigns_engagementpopulation WHERE id = %s", [POPULATION_ID])
        row = cursor.fetchone()
    return list(row[0]) if row else None


def best_hours(contact_ids: Iterable[int], window: Collection[int] | None = None) -> dict[int, int]:
    """contact id → best local hour inside `window` (None: any), for an audience step.

    For the optimized fan-out: one query for the step's profiles, one for the population, then
    one pass in Python over 24 bins per contact (about 4 µs each). Contacts without a profile
    get the population's peak in the window (or 10:00 / the window's first hour).
    """
    ids = list(contact_ids)
    k = float(settings.EMAILHUB_STO_PRIOR_STRENGTH)
    order = ordered_window(window)
    population = population_histogram()
    prior = prepared_prior(population, k=k)
    fallback = best_hour(None, population, k=k, window=order)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT contact_id, histogram FROM campaigns_engagementprofile WHERE contact_id = ANY(%s)", [ids]
        )
        profiles = dict(cursor.fetchall())
    hours = {}
    for contact_id in ids:
        histogram = profiles.get(contact_id)
        hours[contact_id] = (
            best_hour_fast(histogram, prior, order) if histogram and sum(histogram) > 0 else fallback
        )
    return hours
