"""Send-time optimization benchmark: how often the chosen hour is right, and what a refresh costs.

Run from the repository root:

    .venv/bin/python bench/sto.py [--contacts 50000] [--seed 11] [--skip-refresh]
                                  [--refresh-contacts 1000000] [--refresh-events 10000000]

Part 1, accuracy (pure Python, no database). A seeded synthetic population of `--contacts`
contacts spread over 24 IANA zones. Each contact has a true preferred local hour drawn from a
multi-peak population (morning 07–09, lunch 12, evening 19–21, plus a flat share). Their history
is a sender that mailed them at 10:00 local on past days (the source design's default), and:
- human events (30% clicks): a share arrives "on arrival", right after the 10:00 send (25% of
  opens, 10% of clicks: the send-time confound), the rest around the true hour, a wrapped
  normal of σ = 1.5 h; timestamps are UTC instants binned in the contact's zone with zoneinfo,
  spread over the last 90 days (so decay applies);
- machine opens: 40% of contacts read on Apple Mail with Privacy Protection, which opens every
  message at delivery (10:00 + seconds). emailhub's classifier marks them `machine` and the
  refresh skips them; to measure what a miss would cost, 2% of them are leaked in as human.
At 2, 5, 10 and 30 human events per contact, the share of contacts whose chosen hour is within
±1 h (circular) of their true hour, for: emailhub's best_hour (decayed, click-weighted,
shrunk toward the population, smoothed), the source design's raw argmax of all opens over 90
days, and the population peak alone; and the share whose answer moves when the machine opens
are added.

Part 2, refresh (PostgreSQL). A bench database (`emailhub_bench_sto`, created and migrated by
bench/lib/common.py) with `--refresh-contacts` contacts over 24 zones and `--refresh-events` human
and machine opens/clicks generated with generate_series (reused when already there); the
profiles and the population are emptied, then campaigns.engagement.refresh_profiles() folds
every event, timed. The reference in the same run: one GROUP BY (contact, local hour) over the
same events, the least a full recount costs. `--refresh-runs` pairs (reference, refresh), each
from empty profiles; the figures are their medians, and the ratio is the median of each run's
refresh / reference (the machine's load moves both together).

The last lines are `name: value unit`.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.common import bench_database  # noqa: E402
from campaigns.besthour import best_hour, smooth  # noqa: E402

ZONES = [
    "UTC", "Europe/London", "Europe/Berlin", "Europe/Helsinki", "Europe/Moscow", "Asia/Dubai",
    "Asia/Kolkata", "Asia/Kathmandu", "Asia/Shanghai", "Asia/Tokyo", "Australia/Sydney",
    "Australia/Lord_Howe", "Pacific/Auckland", "Pacific/Honolulu", "America/Anchorage",
    "America/Los_Angeles", "America/Denver", "America/Chicago", "America/New_York",
    "America/Sao_Paulo", "America/St_Johns", "Africa/Lagos", "Africa/Johannesburg", "Asia/Tehran",
]  # fmt: skip
# (centre hour, weight, spread in hours) of the population of true preferred hours.
PEAKS = [(8.0, 0.35, 1.0), (12.5, 0.15, 0.7), (20.0, 0.35, 1.2)]
FLAT_SHARE = 0.15
SIGMA_HOURS = 1.5
SEND_HOUR = 10
HISTORY_DAYS = 90
CLICK_SHARE = 0.3
CONFOUND = {"opened": 0.25, "clicked": 0.10}
MPP_SHARE = 0.4
LEAK = 0.02
EVENT_COUNTS = (2, 5, 10, 30)
HALF_LIFE_DAYS = 30.0
K = 5.0
CLICK_WEIGHT, OPEN_WEIGHT = 2.0, 1.0
ARRIVAL_HOURS = 1.0


def circular_distance(a: int, b: int) -> int:
    d = abs(a - b) % 24
    return min(d, 24 - d)


def true_hour(rng: random.Random) -> int:
    if rng.random() < FLAT_SHARE:
        return rng.randrange(24)
    centre, _, spread = rng.choices(PEAKS, weights=[w for _, w, _ in PEAKS])[0]
    return int(math.floor(rng.gauss(centre, spread))) % 24


def raw_argmax(counts: list[int]) -> int:
    """The source design: the hour with most opens over 90 days, 10:00 without any."""
    return max(range(24), key=lambda hour: (counts[hour], -hour)) if any(counts) else SEND_HOUR


def local_instant(zone: ZoneInfo, day: datetime, hours: float) -> datetime:
    """`hours` after local midnight of `day` in `zone`, as a UTC instant."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=zone)
    return (midnight + timedelta(hours=hours)).astimezone(UTC)


def simulate(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    contacts = []
    for _ in range(args.contacts):
        zone = ZoneInfo(rng.choice(ZONES))
        contacts.append((zone, true_hour(rng), rng.random() < MPP_SHARE))
    results: dict[str, float] = {}
    half_life = HALF_LIFE_DAYS * 86400.0
    for n_events in EVENT_COUNTS:
        histograms, raw_counts, raw_with_machine, leaked = [], [], [], []
        for zone, hour, mpp in contacts:
            hist = [0.0] * 24
            opens = [0] * 24
            sends = sorted(rng.sample(range(1, HISTORY_DAYS + 1), k=min(n_events, HISTORY_DAYS)))
            for i in range(n_events):
                day = now - timedelta(days=sends[i % len(sends)])
                kind = "clicked" if rng.random() < CLICK_SHARE else "opened"
                if rng.random() < CONFOUND[kind]:
                    hours = SEND_HOUR + rng.expovariate(3.0)  # read on arrival: ~20 min after
                else:
                    hours = hour + 0.5 + rng.gauss(0.0, SIGMA_HOURS)
                at = local_instant(zone, day, hours)
                local = at.astimezone(zone).hour
                weight = CLICK_WEIGHT if kind == "clicked" else OPEN_WEIGHT
                if 0 <= hours - SEND_HOUR < ARRIVAL_HOURS:
                    weight *= args.arrival_weight  # what the refresh does: it knows sent_at
                hist[local] += weight * 2 ** (-(now - at).total_seconds() / half_life)
                if kind == "opened":
                    opens[local] += 1
            machine_hist = [0.0] * 24
            machine_opens = [0] * 24
            if mpp:
                for day_offset in sends:
                    at = local_instant(zone, now - timedelta(days=day_offset), SEND_HOUR + 0.001)
                    local = at.astimezone(zone).hour
                    machine_opens[local] += 1
                    if rng.random() < LEAK:
                        machine_hist[local] += OPEN_WEIGHT * 2 ** (-(now - at).total_seconds() / half_life)
            histograms.append(hist)
            raw_counts.append(opens)
            raw_with_machine.append([a + b for a, b in zip(opens, machine_opens, strict=True)])
            leaked.append([a + b for a, b in zip(hist, machine_hist, strict=True)])
        population = [sum(h[b] for h in histograms) for b in range(24)]
        population_peak = max(range(24), key=lambda b: smooth(population)[b])

        ours = [best_hour(h, population, k=args.k, smoothing=args.kernel) for h in histograms]
        ours_leaked = [best_hour(h, population, k=args.k, smoothing=args.kernel) for h in leaked]
        raw = [raw_argmax(c) for c in raw_with_machine]
        raw_clean = [raw_argmax(c) for c in raw_counts]
        truth = [hour for _, hour, _ in contacts]

        def within(chosen: list[int], truth: list[int] = truth) -> float:
            return sum(circular_distance(c, t) <= 1 for c, t in zip(chosen, truth, strict=True)) / len(truth)

        results[f"sto_within_1h_best_hour_at_{n_events}"] = within(ours)
        results[f"sto_within_1h_raw_argmax_at_{n_events}"] = within(raw)
        results[f"sto_within_1h_population_peak_at_{n_events}"] = within([population_peak] * len(truth))
        results[f"sto_machine_moved_best_hour_at_{n_events}"] = sum(
            a != b for a, b in zip(ours, ours_leaked, strict=True)
        ) / len(truth)
        results[f"sto_machine_moved_raw_argmax_at_{n_events}"] = sum(
            a != b for a, b in zip(raw, raw_clean, strict=True)
        ) / len(truth)
        print(
            f"{n_events:>2} events/contact: within ±1 h  best_hour {within(ours):.3f}"
            f"  raw argmax {within(raw):.3f}  population peak {within([population_peak] * len(truth)):.3f}"
            f";  moved by machine opens: best_hour (2% leaked) {results[f'sto_machine_moved_best_hour_at_{n_events}']:.3%}"
            f", raw argmax {results[f'sto_machine_moved_raw_argmax_at_{n_events}']:.3%}",
            flush=True,
        )
    return results


BENCH_DB = bench_database("emailhub_bench_sto")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")


def refresh_bench(args: argparse.Namespace) -> dict[str, float]:
    from bench.lib.common import prepare

    prepare(BENCH_DB, REDIS_URL, EMAILHUB_ENGAGEMENT_SETTLE_SECONDS="0")
    from django.db import connection

    from campaigns import engagement

    contacts, events = args.refresh_contacts, args.refresh_events
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM campaigns_contact WHERE email LIKE 'sto-%%'")
        have_contacts = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM delivery_emailevent WHERE recipient LIKE 'sto-%%'")
        have_events = cursor.fetchone()[0]
        if (have_contacts, have_events) != (contacts, events):
            print(f"generating {contacts:,} contacts and {events:,} events (not timed)…", flush=True)
            t = time.perf_counter()
            cursor.execute(
                "TRUNCATE delivery_emailevent, campaigns_engagementprofile, campaigns_engagementpopulation"
            )
            cursor.execute("DELETE FROM campaigns_contact WHERE email LIKE 'sto-%%'")
            cursor.execute(
                """
                INSERT INTO campaigns_contact (email, name, timezone, attributes, status, updated_at)
                SELECT 'sto-' || n || '@example.com', '', (%s::text[])[1 + n %% %s], '{}', 'active', now()
                  FROM generate_series(1, %s) AS n
                """,
                [ZONES, len(ZONES), contacts],
            )
            # Each contact's events cluster around an hour of its own (n % 24), spread over 90
            # days; 30% clicks; 10% machine opens (skipped by the refresh, but scanned).
            cursor.execute(
                """
                INSERT INTO delivery_emailevent (kind, provider, recipient, bounce, classification, detail,
                                                 occurred_at, payload, created_at)
                SELECT CASE WHEN random() < 0.3 THEN 'clicked' ELSE 'opened' END, 'bench',
                       'sto-' || (1 + (g %% %(contacts)s)) || '@example.com', '',
                       CASE WHEN random() < 0.1 THEN 'machine' ELSE 'human' END, '',
                       now() - make_interval(days => (random() * 90)::int)
                             - make_interval(hours => ((g %% %(contacts)s) %% 24 + 3 * random())::int),
                       '{}', now() - interval '1 hour'
                  FROM generate_series(1, %(events)s) AS g
                """,
                {"contacts": contacts, "events": events},
            )
            connection.commit() if not connection.get_autocommit() else None
            cursor.execute("VACUUM ANALYZE delivery_emailevent")
            cursor.execute("VACUUM ANALYZE campaigns_contact")
            print(f"generated in {time.perf_counter() - t:.1f} s", flush=True)
    runs = []
    for run in range(args.refresh_runs):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE campaigns_engagementprofile, campaigns_engagementpopulation")
            cursor.execute("CHECKPOINT")
            load = os.getloadavg()[0]
            t = time.perf_counter()
            cursor.execute(
                """
                SELECT count(*) FROM (
                    SELECT c.id, extract(hour FROM e.occurred_at AT TIME ZONE c.timezone) AS h, count(*)
                      FROM delivery_emailevent AS e JOIN campaigns_contact AS c ON c.email = e.recipient
                     WHERE e.classification = 'human' AND e.kind IN ('opened', 'clicked')
                     GROUP BY 1, 2) AS x
                """
            )
            reference = time.perf_counter() - t
        t = time.perf_counter()
        report = engagement.refresh_profiles(step=args.step)
        elapsed = time.perf_counter() - t
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*), count(best_hour) FROM campaigns_engagementprofile")
            profiles, with_hour = cursor.fetchone()
        runs.append((elapsed, reference))
        print(
            f"refresh run {run + 1}: {events:,} events → {profiles:,} profiles ({with_hour:,} with a best hour)"
            f" in {elapsed:.1f} s, {report.steps} steps of {args.step:,}; reference GROUP BY {reference:.1f} s"
            f" (ratio {elapsed / reference:.2f}); load average at start {load:.1f}",
            flush=True,
        )
    elapsed = statistics.median(e for e, _ in runs)
    return {
        "sto_refresh_runs": float(len(runs)),
        "sto_refresh_seconds": elapsed,
        "sto_refresh_events_per_second": events / elapsed,
        "sto_refresh_reference_group_by_seconds": statistics.median(r for _, r in runs),
        "sto_refresh_ratio_to_group_by": statistics.median(e / r for e, r in runs),
    }


def fanout_part(contacts: int) -> dict[str, float]:
    """bench/sto_fanout.py in a process of its own (its own database and Redis database, not
    needed by the other parts); its figures are its last lines, `name: value`."""
    script = Path(__file__).resolve().parent / "sto_fanout.py"
    done = subprocess.run(
        [sys.executable, str(script), "--contacts", str(contacts)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    print(done.stdout, end="", flush=True)
    figures = (line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith("sto_fanout_"))
    return {name: float(value) for name, value in figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contacts", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--skip-refresh", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    # Fan-out of a 1M optimized campaign against an immediate one (bench/sto_fanout.py).
    parser.add_argument("--fanout", action="store_true")
    parser.add_argument("--fanout-contacts", type=int, default=1_000_000)
    parser.add_argument("--refresh-contacts", type=int, default=1_000_000)
    parser.add_argument("--refresh-events", type=int, default=10_000_000)
    parser.add_argument("--step", type=int, default=500_000)
    parser.add_argument("--refresh-runs", type=int, default=2)
    parser.add_argument("--k", type=float, default=K)
    parser.add_argument("--arrival-weight", type=float, default=0.2)  # the setting's default
    parser.add_argument(
        "--kernel", type=lambda v: tuple(float(x) for x in v.split(",")), default=(0.25, 0.5, 0.25)
    )
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, float] = {}
    if not args.skip_accuracy:
        results.update(simulate(args))
    if not args.skip_refresh:
        results.update(refresh_bench(args))
    if args.fanout:
        results.update(fanout_part(args.fanout_contacts))
    for name, value in results.items():
        unit = "s" if name.endswith("seconds") else ("events/s" if name.endswith("per_second") else "share")
        if name.endswith("ratio_to_group_by"):
            unit = "x"
        if name.endswith("_runs"):
            unit = "runs"
        print(f"{name}: {value:.3f} {unit}")


if __name__ == "__main__":
    main()
