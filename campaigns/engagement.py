"""Engagement profiles: per-contact 24-bin histograms of human opens and clicks by local hour.

`refresh_profiles()` (the beat task `campaigns.refresh_engagement`, every 60 s) folds the human
open and click events recorded since the watermark into the profiles. A fold is one transaction
whose statement count does not depend on the number of contacts or events:

1. lock the population row (two refreshes never fold one event twice) and read the watermark;
2. the fold's range (delivery's `engagement_event_range`): up to _STEPS_PER_FOLD steps of
   EMAILHUB_ENGAGEMENT_REFRESH_STEP events, stopping before the first unsettled one; the steps
   are counted (RefreshReport.steps) but no longer run one statement each;
3. one `CREATE TEMP TABLE … AS` reads the range's human events once (delivery's
   `HUMAN_ENGAGEMENT_CTE`), maps them to contacts (a campaign message's contact, else the
   recipient address), bins them by the hour of `occurred_at AT TIME ZONE contact.timezone`
   (PostgreSQL's tz database, DST-correct), weights them (click > open; a hit within
   EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES of the message's send counts
   EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT: its hour is the hour we sent as much as the reader's
   habit), decays them to the refresh instant and pivots them to 24 bins per contact; a backlog
   runs it as a parallel plan (workers scan, join and weigh, the leader aggregates);
4. the population histogram decayed and moved by the fold's 24 bin sums, the watermark advanced;
5. one UPDATE of the touched contacts that have a profile (their bins decayed to the same instant
   plus the fold's) and one INSERT of the others, the best hour (no window) chosen in SQL with
   exactly best_hour_fast's arithmetic against the new population: each touched profile is
   written once per fold. (668 s for a 1M-contact / 10M-event backlog with a per-step upsert,
   73–96 s with per-step staged cells; docs/scheduling.md has the figures of this form.)

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
from delivery.selectors import HUMAN_ENGAGEMENT_CTE, engagement_event_range

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


# A fold (one transaction, one write per touched profile) covers at most this many steps of
# EMAILHUB_ENGAGEMENT_REFRESH_STEP events, so a huge backlog is still committed in bounded pieces.
_STEPS_PER_FOLD = 200
# A fold over at least this many events is planned as the bulk job it is (see _BULK_SETTINGS).
_BULK_EVENTS = 50_000
_WORK_MEM = "128MB"
# Measured on the 1M-contact / 10M-event backlog (docs/scheduling.md has the figures):
# - the planner, misled by the nullable `contact_id` of the message join, probed contacts by
#   index once per event (nested loops over 9M events); every input of the fold is read whole,
#   so hash joins are the plan;
# - Gather's default per-tuple cost hid the plan that is twice as fast on two cores: workers
#   scan, join and weigh the events, the leader aggregates (a partial aggregate per worker
#   would build a million groups in each and merge three million);
# - the 24-way pivot of a million contacts holds ~600 MB of aggregate state: with less it
#   spills to disk in batches;
# - JIT spent ~8 s compiling the pivot's expressions for a query that runs in seconds.
_BULK_SETTINGS = (
    "SET LOCAL enable_nestloop = off",
    "SET LOCAL enable_mergejoin = off",
    "SET LOCAL parallel_setup_cost = 10",
    "SET LOCAL parallel_tuple_cost = 0.001",
    "SET LOCAL work_mem = '512MB'",
)
_FRESH = "pg_temp.engagement_fresh"

_EVENT_FACTOR = _decay("date_part('epoch', %(now)s - h.occurred_at)")
# A contact and the zone its events are binned in: a zone PostgreSQL's tz database does not know
# (contacts' zones are validated against Python's zoneinfo) bins in UTC instead of making
# `AT TIME ZONE` raise and stop every refresh. Joined per contact, not per event.
_KNOWN_CONTACTS = (
    "(SELECT c.id, c.email, COALESCE(z.name, 'UTC') AS tz"
    " FROM campaigns_contact AS c LEFT JOIN pg_timezone_names AS z ON z.name = c.timezone)"
)
_BIN_COLUMNS = ",\n       ".join(
    f"COALESCE(sum(w) FILTER (WHERE bin = {h}), 0) AS h{h}" for h in range(HOURS)
)

# The fold's events, once: delivery's human opens and clicks in (after, upto] mapped to contacts
# (a campaign message's contact, else the recipient address), binned by the hour of
# `occurred_at AT TIME ZONE contact's zone` (PostgreSQL's tz database, DST-correct), weighted
# (click > open; a hit within EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES of the message's send counts
# EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT), decayed to the refresh instant and pivoted to 24 bin
# columns per contact. `OFFSET 0` computes each event's bin and weight once (inlined, the 24
# FILTERs would evaluate the zone conversion 24 times per event).
_FRESH_SQL = f"""
CREATE TEMP TABLE {_FRESH.split(".")[1]} ON COMMIT DROP AS
WITH {HUMAN_ENGAGEMENT_CTE}
SELECT contact_id,
       {_BIN_COLUMNS}
  FROM (SELECT COALESCE(by_id.id, by_address.id) AS contact_id,
               date_part('hour', h.occurred_at AT TIME ZONE COALESCE(by_id.tz, by_address.tz))::int AS bin,
               (CASE h.kind WHEN 'clicked' THEN %(click_weight)s ELSE %(open_weight)s END)::float8
                 * (CASE WHEN h.occurred_at >= h.sent_at AND h.occurred_at < h.sent_at + %(arrival)s
                         THEN %(arrival_weight)s ELSE 1 END)::float8
                 * {_EVENT_FACTOR} AS w
          FROM human_engagement AS h
          LEFT JOIN {_KNOWN_CONTACTS} AS by_id ON by_id.id = h.contact_id
          LEFT JOIN {_KNOWN_CONTACTS} AS by_address
                 ON h.contact_id IS NULL AND by_address.email = h.recipient
         WHERE COALESCE(by_id.id, by_address.id) IS NOT NULL
        OFFSET 0) AS weighted
 GROUP BY contact_id
"""
# The population's share of the fold: the 24 bin sums.
_FRESH_SUMS_SQL = (
    "SELECT ARRAY["
    + ", ".join(f"COALESCE(sum(h{h}), 0)" for h in range(HOURS))
    + f"]::float8[] FROM {_FRESH}"
)

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


def _scores(bin_sql: str) -> str:
    """24 score columns s0..s23: best_hour_fast in SQL, the same float8 operations in the same
    order: the default kernel over the contact's bins (circular) plus the prepared prior (k·π
    smoothed, computed in Python). `bin_sql` formats `{h}` into the contact's bin h."""
    return ", ".join(
        f"0.25::float8 * {bin_sql.format(h=(h - 1) % HOURS)} + 0.5::float8 * {bin_sql.format(h=h)}"
        f" + 0.25::float8 * {bin_sql.format(h=(h + 1) % HOURS)} + %(prior{h})s::float8 AS s{h}"
        for h in range(HOURS)
    )


# array_position finds the first maximum: ties go to the earliest hour, as in _argmax.
_BEST = (
    "array_position(ARRAY["
    + ", ".join(f"s.s{h}" for h in range(HOURS))
    + "], greatest("
    + ", ".join(f"s.s{h}" for h in range(HOURS))
    + ")) - 1"
)
_PROFILE_FACTOR = _decay("date_part('epoch', %(now)s - q.decayed_at)")
_MERGED_COLUMNS = ", ".join(f"q.histogram[{h + 1}] * d.f + fr.h{h} AS m{h}" for h in range(HOURS))

# Once per fold, each touched profile written once: existing profiles get their bins decayed to
# the refresh instant plus the fold's, and the best hour (no window) chosen against the new
# population; then contacts without a profile get one. Each derived value sits in a LATERAL
# subquery fenced by OFFSET 0: inlined, the 24 scores × 3 bins × the merge would be expanded
# into one expression thousands of terms long and computed that many times per row. The
# population lock held by the fold makes the read-then-write and the NOT EXISTS safe. New profiles
# go in in key order: the primary key then grows at its right edge instead of splitting pages
# all over (a backlog's million inserts: half the time).
_UPDATE_SQL = f"""
UPDATE campaigns_engagementprofile AS p
   SET histogram = n.histogram, decayed_at = %(now)s, best_hour = n.best_hour
  FROM (SELECT fr.contact_id, {_array("m.m{h}")} AS histogram, {_BEST} AS best_hour
          FROM {_FRESH} AS fr
          JOIN campaigns_engagementprofile AS q ON q.contact_id = fr.contact_id
         CROSS JOIN LATERAL (
                SELECT {_MERGED_COLUMNS} FROM (SELECT {_PROFILE_FACTOR} AS f OFFSET 0) AS d OFFSET 0) AS m
         CROSS JOIN LATERAL (SELECT {_scores("m.m{h}")} OFFSET 0) AS s) AS n
 WHERE p.contact_id = n.contact_id
"""
_INSERT_SQL = f"""
INSERT INTO campaigns_engagementprofile (contact_id, histogram, decayed_at, best_hour)
SELECT fr.contact_id, {_array("fr.h{h}")}, %(now)s, {_BEST}
  FROM {_FRESH} AS fr
 CROSS JOIN LATERAL (SELECT {_scores("fr.h{h}")} OFFSET 0) AS s
 WHERE NOT EXISTS (SELECT FROM campaigns_engagementprofile AS p WHERE p.contact_id = fr.contact_id)
 ORDER BY fr.contact_id
"""


@dataclass
class RefreshReport:
    steps: int = 0
    contacts: int = 0  # profile writes (a contact touched in two folds counts twice)
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


def _steps_of(count: int, step: int, upto: int, last: int) -> int:
    """The steps of `step` events that (after, upto] is made of, as the step counter reports
    them: a last step that only moves the watermark over skipped ids counts as one."""
    return -(-count // step) + (1 if count % step == 0 and upto > last else 0)


def refresh_profiles(
    *, now: datetime | None = None, step: int | None = None, max_steps: int | None = None
) -> RefreshReport:
    """Fold every settled human open/click since the watermark into the profiles (see module doc)."""
    now = now or timezone.now()
    step = step or settings.EMAILHUB_ENGAGEMENT_REFRESH_STEP
    cutoff = now - timedelta(seconds=settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS)
    params: dict[str, Any] = {
        "now": now,
        "half_life": _half_life_seconds(),
        "click_weight": float(settings.EMAILHUB_ENGAGEMENT_CLICK_WEIGHT),
        "open_weight": float(settings.EMAILHUB_ENGAGEMENT_OPEN_WEIGHT),
        "arrival": timedelta(minutes=settings.EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES),
        "arrival_weight": float(settings.EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT),
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
            after = int(cursor.fetchone()[0])
            steps = _STEPS_PER_FOLD if max_steps is None else min(_STEPS_PER_FOLD, max_steps - report.steps)
            upto, count, last = engagement_event_range(after, steps * step, cutoff)
            moved = _steps_of(count, step, upto, last)
            report.steps += moved
            if moved < steps:
                report.steps += 1  # the step that finds nothing new (or only unsettled events)
                done = True
            if max_steps is not None and report.steps >= max_steps:
                done = True
            if upto != after:
                cursor.execute(f"SET LOCAL work_mem = '{_WORK_MEM}'")
                cursor.execute("SET LOCAL jit = off")
                # The planner caches the per-row score subquery keyed on the 24 bins: hashing a
                # million distinct rows cost more than computing the scores.
                cursor.execute("SET LOCAL enable_memoize = off")
                if count >= _BULK_EVENTS:
                    for setting in _BULK_SETTINGS:
                        cursor.execute(setting)
                fold = {**params, "after": after, "upto": upto}
                cursor.execute(_FRESH_SQL, fold)
                cursor.execute(_FRESH_SUMS_SQL)
                step_sum = cursor.fetchone()[0]
                cursor.execute(_POPULATION_SQL, {**fold, "step_sum": step_sum})
                prior = prepared_prior(cursor.fetchone()[0], k=k) or [0.0] * HOURS
                fold.update({f"prior{h}": v for h, v in enumerate(prior)})
                cursor.execute(_UPDATE_SQL, fold)
                report.contacts += cursor.rowcount
                cursor.execute(_INSERT_SQL, fold)
                report.contacts += cursor.rowcount
                # Dropped explicitly: inside an outer transaction (tests) ON COMMIT is later.
                cursor.execute(f"DROP TABLE {_FRESH}")
        report.last_event_id = upto
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
