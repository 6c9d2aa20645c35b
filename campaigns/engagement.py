"""Engagement profiles: per-contact 24-bin histograms of human opens and clicks by local hour.

`refresh_profiles()` (the beat task `campaigns.refresh_engagement`, every 60 s) folds the human
open and click events recorded since the watermark into the profiles. A fold is one transaction
whose statement count does not depend on the number of contacts:

1. lock the population row (two refreshes never fold one event twice) and read the watermark;
2. per step of EMAILHUB_ENGAGEMENT_REFRESH_STEP events (up to _STEPS_PER_FOLD steps), one
   statement: the step's human events (delivery's `HUMAN_ENGAGEMENT_STEP_CTES`) mapped to
   contacts (a campaign message's contact, else the recipient address), binned by the hour of
   `occurred_at AT TIME ZONE contact.timezone` (PostgreSQL's tz database, DST-correct), weighted
   (click > open; a hit within EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES of the message's send counts
   EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT: its hour is the hour we sent as much as the reader's
   habit), decayed to the refresh instant and appended as (contact, hour, weight) cells to a
   temporary staging table; it returns the step's watermark and its 24 bin sums;
3. the population histogram decayed and moved by the steps' sums, the watermark advanced;
4. one INSERT … ON CONFLICT DO UPDATE: the cells pivoted to 24 bins per contact, added to the
   contact's existing bins decayed to the same instant, the best hour (no window) chosen in SQL
   with exactly best_hour_fast's arithmetic against the new population — each touched profile
   is written once per fold however many steps touched it (a per-step upsert rewrote ~400,000
   profiles per step of a 1M-contact backlog: 668 s where this takes ~73 s).

Decay: a weight w at time t is worth w·2^(−(T−t)/half-life) at T. Decay is linear, so bins
decayed to the same instant can be added, and the population histogram is, at every refresh,
the sum of all profiles decayed to that instant.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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


_EVENT_FACTOR = _decay("extract(epoch FROM %(now)s - occurred_at)::float8")
_STAGING = "pg_temp.engagement_cells"
# A fold (one transaction, one write per touched profile) covers at most this many steps, so a
# huge backlog is still committed in bounded pieces.
_STEPS_PER_FOLD = 200
_WORK_MEM = "128MB"

# One step: the step's human events (delivery's CTEs) → weighted, decayed cells per (contact,
# local hour), appended to the fold's staging table; returns the step's watermark and its 24
# bin sums (the population's share of the step).
_STAGE_SQL = f"""
WITH {HUMAN_ENGAGEMENT_STEP_CTES},
zones AS (
    SELECT unnest(%(zones)s::text[]) AS name
), hits AS (
    -- One contact lookup per event: by the message's contact, else by address.
    SELECT COALESCE(by_id.id, by_address.id) AS contact_id, COALESCE(z.name, 'UTC') AS tz, h.kind,
           h.occurred_at,
           h.occurred_at >= h.sent_at AND h.occurred_at < h.sent_at + %(arrival)s AS on_arrival
      FROM human_engagement AS h
      LEFT JOIN campaigns_contact AS by_id ON by_id.id = h.contact_id
      LEFT JOIN campaigns_contact AS by_address ON h.contact_id IS NULL AND by_address.email = h.recipient
      LEFT JOIN zones AS z ON z.name = COALESCE(by_id.timezone, by_address.timezone)
     WHERE COALESCE(by_id.id, by_address.id) IS NOT NULL
), weighted AS (
    SELECT contact_id,
           extract(hour FROM occurred_at AT TIME ZONE tz)::int AS bin,
           (CASE kind WHEN 'clicked' THEN %(click_weight)s ELSE %(open_weight)s END)::float8
             * (CASE WHEN on_arrival THEN %(arrival_weight)s ELSE 1 END)::float8
             * {_EVENT_FACTOR} AS w
      FROM hits
), staged AS (
    INSERT INTO {_STAGING} (contact_id, bin, w)
    SELECT contact_id, bin, sum(w) FROM weighted GROUP BY contact_id, bin
    RETURNING bin, w
)
SELECT COALESCE((SELECT w.upto FROM event_window AS w), %(after)s),
       (SELECT array_agg(COALESCE(b.w, 0) ORDER BY hours.h)::float8[]
          FROM generate_series(0, 23) AS hours(h)
          LEFT JOIN (SELECT bin, sum(w) AS w FROM staged GROUP BY bin) AS b ON b.bin = hours.h)
"""

_POPULATION_DECAYED = _array("pop.histogram[{i}] * d.f + (%(step_sum)s::float8[])[{i}]")
_POPULATION_FACTOR = _decay("extract(epoch FROM %(now)s - pop.decayed_at)::float8")
_POPULATION_SQL = f"""
UPDATE campaigns_engagementpopulation AS pop
   SET histogram = (SELECT {_POPULATION_DECAYED} FROM (SELECT {_POPULATION_FACTOR} AS f) AS d),
       decayed_at = GREATEST(pop.decayed_at, %(now)s),
       last_event_id = %(upto)s
 WHERE pop.id = {POPULATION_ID}
RETURNING pop.histogram
"""

_FRESH_BINS = _array("COALESCE(sum(w) FILTER (WHERE bin = {h}), 0)")
_MERGED_BINS = _array("p.histogram[{i}] * d.f + f.histogram[{i}]")
_PROFILE_FACTOR = _decay("extract(epoch FROM %(now)s - p.decayed_at)::float8")
# best_hour_fast in SQL, the same float8 operations in the same order: the default kernel over
# the contact's bins (circular) plus the prepared prior (k·π smoothed, computed in Python).
_SCORES = (
    "ARRAY["
    + ", ".join(
        f"0.25::float8 * m.histogram[{(h - 1) % HOURS + 1}] + 0.5::float8 * m.histogram[{h + 1}]"
        f" + 0.25::float8 * m.histogram[{(h + 1) % HOURS + 1}] + %(prior{h})s::float8"
        for h in range(HOURS)
    )
    + "]"
)
# array_position finds the first maximum: ties go to the earliest hour, as in _argmax.
_BEST = (
    "array_position(s.scores, greatest(" + ", ".join(f"s.scores[{i + 1}]" for i in range(HOURS)) + ")) - 1"
)

# Once per fold: pivot the staged cells to 24 bins per contact, add them to the contact's
# existing bins decayed to the refresh instant, choose the best hour, and write each touched
# profile once. The population lock held by the fold makes the read-then-write safe.
# Each derived value sits in a LATERAL subquery fenced by OFFSET 0: inlined, the 24 scores × 3
# bins × the 24-element merge would be expanded into one expression thousands of terms long
# (planning alone took over a minute) and computed that many times per row.
_UPSERT_SQL = f"""
WITH fresh AS (
    SELECT contact_id, {_FRESH_BINS} AS histogram FROM {_STAGING} GROUP BY contact_id
)
INSERT INTO campaigns_engagementprofile AS p (contact_id, histogram, decayed_at, best_hour)
SELECT f.contact_id, m.histogram, %(now)s, {_BEST}
  FROM fresh AS f
  LEFT JOIN campaigns_engagementprofile AS p ON p.contact_id = f.contact_id
 CROSS JOIN LATERAL (
        SELECT CASE WHEN p.contact_id IS NULL THEN f.histogram ELSE {_MERGED_BINS} END AS histogram
          FROM (SELECT {_PROFILE_FACTOR} AS f OFFSET 0) AS d
        OFFSET 0) AS m
 CROSS JOIN LATERAL (SELECT {_SCORES} AS scores OFFSET 0) AS s
ON CONFLICT (contact_id) DO UPDATE
   SET histogram = EXCLUDED.histogram, decayed_at = EXCLUDED.decayed_at, best_hour = EXCLUDED.best_hour
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
    params: dict[str, Any] = {
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
    done = False
    while not done and (max_steps is None or report.steps < max_steps):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT last_event_id FROM campaigns_engagementpopulation WHERE id = %s FOR UPDATE",
                [POPULATION_ID],
            )
            after = position = int(cursor.fetchone()[0])
            # A backlog step hash-joins its events to every contact's address and a fold
            # aggregates up to a million contacts: with the default 4 MB each spilled to disk.
            cursor.execute(f"SET LOCAL work_mem = '{_WORK_MEM}'")
            # The planner caches the per-row score subquery keyed on the 24-bin array: hashing
            # a million distinct arrays cost more than computing the scores (≈ 20 s of 54).
            cursor.execute("SET LOCAL enable_memoize = off")
            # Dropped explicitly below: inside an outer transaction (tests) ON COMMIT is later.
            cursor.execute(
                f"CREATE TEMP TABLE {_STAGING.split('.')[1]} (contact_id bigint, bin smallint, w float8)"
                " ON COMMIT DROP"
            )
            step_sum = [0.0] * HOURS
            for _ in range(_STEPS_PER_FOLD):
                cursor.execute(_STAGE_SQL, {**params, "after": position})
                upto, sums = cursor.fetchone()
                report.steps += 1
                if int(upto) == position:
                    done = True  # nothing new, or only events that have not settled yet
                    break
                position = int(upto)
                step_sum = [a + b for a, b in zip(step_sum, sums, strict=True)]
                if max_steps is not None and report.steps >= max_steps:
                    done = True
                    break
            if position != after:
                cursor.execute(_POPULATION_SQL, {**params, "step_sum": step_sum, "upto": position})
                prior = prepared_prior(cursor.fetchone()[0], k=k) or [0.0] * HOURS
                cursor.execute(_UPSERT_SQL, {**params, **{f"prior{h}": v for h, v in enumerate(prior)}})
                report.contacts += cursor.rowcount
            cursor.execute(f"DROP TABLE {_STAGING}")
        report.last_event_id = position
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
