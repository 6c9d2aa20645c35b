"""bench/sto.py, fan-out part: a 1,000,000-recipient `optimized` campaign against an `immediate`
one of the same audience, in the same run.

    .venv/bin/python bench/sto_fanout.py [--contacts 1000000] [--runs 2]
    (or bench/sto.py --fanout, which calls run() below)

Target (issue 11): optimized adds < 30% to the fan-out's wall time.

Own database (`emailhub_bench_sto_fanout`) and Redis database 11, claimed as bench/fanout.py
claims its own (bench/lib/common.py). The audience is bench/lib/audience.py's generated list (1% suppressed), then, once and
not timed, spread over 20 timezones (half- and quarter-hour offsets included) with an
engagement profile and a random stored best hour for 90% of the contacts (the rest fall back
to the population's hour). Each run empties messages, outbox and Redis, CHECKPOINTs, creates the
campaign already `sending` and times fan_out() in a fresh process (bench/lib/fanout_process.py, bench/fanout.py's child),
immediate and optimized alternating. Checked after each run: rows == expected recipients; for
the optimized run, the distinct due instants and the slot units in Redis (a few hundred).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.lib.audience import bench_template, ensure_audience, reset_state  # noqa: E402
from bench.lib.common import bench_database, prepare_alone  # noqa: E402
from bench.lib.fanout_process import run_child  # noqa: E402
from core.schedule_index import DUE  # noqa: E402

DATABASE = bench_database("emailhub_bench_sto_fanout")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
ZONES = [
    "UTC", "Europe/London", "Europe/Berlin", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Tokyo",
    "Australia/Adelaide", "Australia/Lord_Howe", "Pacific/Chatham", "America/New_York",
    "America/Los_Angeles", "America/St_Johns", "America/Sao_Paulo", "Africa/Lagos", "Asia/Tehran",
    "Pacific/Kiritimati", "Pacific/Honolulu", "Asia/Shanghai", "Europe/Moscow", "America/Caracas",
]  # fmt: skip


def ensure_profiles(list_id: int) -> None:
    """Timezones and profiles for the list's contacts (once; reused while present)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM campaigns_engagementprofile AS p JOIN campaigns_listmembership AS lm"
            " ON lm.contact_id = p.contact_id WHERE lm.contact_list_id = %s",
            [list_id],
        )
        if cursor.fetchone()[0]:
            return
        print("spreading timezones and writing profiles (once; not timed) ...", flush=True)
        cursor.execute(
            "UPDATE campaigns_contact AS c SET timezone = (%s::text[])[1 + c.id %% %s]"
            " FROM campaigns_listmembership AS lm WHERE lm.contact_id = c.id AND lm.contact_list_id = %s",
            [ZONES, len(ZONES), list_id],
        )
        cursor.execute(
            """
            INSERT INTO campaigns_engagementprofile (contact_id, histogram, decayed_at, best_hour)
            SELECT lm.contact_id, array_fill(0.0::float8, ARRAY[24]), now(), (random() * 23.999)::int
              FROM campaigns_listmembership AS lm
             WHERE lm.contact_list_id = %s AND lm.contact_id %% 10 <> 0
            ON CONFLICT DO NOTHING
            """,
            [list_id],
        )
        cursor.execute("DELETE FROM campaigns_engagementpopulation")
        cursor.execute(
            "INSERT INTO campaigns_engagementpopulation (histogram, decayed_at, last_event_id)"
            " VALUES (%s, now(), 0)",
            [[1.0 + (8 <= h <= 9) * 5 + (19 <= h <= 21) * 4 for h in range(24)]],
        )
        for table in ("campaigns_contact", "campaigns_engagementprofile"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def one_run(env: dict[str, str], list_id: int, expected: int, kind: str, number: int) -> dict[str, Any]:
    from campaigns.models import Campaign
    from delivery.models import Message

    reset_state(REDIS_URL)
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    extra: dict[str, Any] = {}
    if kind == "optimized":
        extra = {
            "schedule_type": "optimized",
            "window_start": (timezone.now() + timedelta(hours=1)).replace(microsecond=0),
            "window_hours": 24,
            "holdout_percent": 10,
        }
    campaign = Campaign.objects.create(
        name=f"bench sto {kind} {number}",
        template=bench_template(),
        contact_list_id=list_id,
        priority="normal",
        status=Campaign.Status.SENDING,
        started_at=timezone.now(),
        **extra,
    )
    result = run_child(env, campaign.pk, None, 1800)
    rows = Message.objects.filter(campaign=campaign).count()
    if rows != expected:
        raise RuntimeError(f"{kind}: {rows} rows, expected {expected}")
    result["rows"] = rows
    if kind == "optimized":
        result["distinct_dues"] = (
            Message.objects.filter(campaign=campaign).values("due_at").distinct().count()
        )
        client = redis.Redis.from_url(REDIS_URL)
        result["slot_units"] = sum(
            1 for member in client.zrange(DUE, 0, -1) if member.startswith(f"c:{campaign.pk}:".encode())
        )
    print(
        f"  {kind} run {number}: {result['wall_s']:.2f} s, {rows / result['wall_s']:,.0f} rows/s"
        + (
            f", {result['distinct_dues']} due instants, {result['slot_units']} slot units"
            if kind == "optimized"
            else ""
        ),
        flush=True,
    )
    return result


def run(contacts: int = 1_000_000, runs: int = 2) -> dict[str, float]:
    env = prepare_alone(DATABASE, REDIS_URL)
    list_id, expected, _ = ensure_audience(contacts, 100)
    ensure_profiles(list_id)
    walls: dict[str, list[float]] = {"immediate": [], "optimized": []}
    units = 0
    for number in range(runs):
        for kind in ("immediate", "optimized"):
            result = one_run(env, list_id, expected, kind, number)
            walls[kind].append(result["wall_s"])
            units = max(units, result.get("slot_units", 0))
    immediate, optimized = median(walls["immediate"]), median(walls["optimized"])
    return {
        "sto_fanout_immediate_seconds": immediate,
        "sto_fanout_optimized_seconds": optimized,
        "sto_fanout_optimized_overhead_share": optimized / immediate - 1,
        "sto_fanout_optimized_slot_units": float(units),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contacts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for name, value in run(args.contacts, args.runs).items():
        print(f"{name}: {value:.3f}")


if __name__ == "__main__":
    main()
