"""Segment counts over 1,000,000 contacts and 10,000,000 events, and what the engagement index
costs event ingestion.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/segments.py [--runs 5] [--contacts 1000000] [--events 10000000] [--rebuild]
                                       [--ingest 200000] [--ingest-runs 3] [--no-ingest]

Targets (issue 23): the count of a segment < 1 s with attribute and list conditions, < 3 s with
an engagement window over 10,000,000 events.

Data (bench.lib.segment_data, not timed): a database of its own (`emailhub_bench_segments`,
created and migrated if missing) holding 1M contacts with attributes (city, age, plan, signup),
three lists (every 5th, 20th, 100th contact: 200k, 50k, 10k members), a year of monthly
campaigns and their ~4.2M messages, and ~10M events on them in production's mix (mostly
`delivered`; human, machine (MPP) and proxy opens; human and scanner clicks; some bounces,
complaints, unsubscribes), generated once with set-based SQL, then VACUUM ANALYZE; reused while
it has the right size and its newest campaign is under 20 days old (`--rebuild` forces it).

Measured, warm (one untimed call first), median of `--runs` calls each:
- campaigns.segment_sql.count for each case of CASES (the product's function: its SQL, its
  statement timeout, which this bench raises to 120 s so that a slow plan shows its real time,
  said apart when it is above the product's EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS);
- campaigns.segment_sql.sample (50 contacts) for a few of them;
- EXPLAIN (ANALYZE, BUFFERS) of the engagement cases' count statements, captured from count()
  itself, written in full to bench/.cache/logs/segments-explain.log (a one-line summary each is
  printed before the results);
- the engagement index's cost on event ingestion: a set-based INSERT … SELECT of `--ingest`
  events (production's mix, on the newest campaign's messages, prepared in a temporary table
  before the clock) into delivery_emailevent, with the index, and with it dropped in the same
  transaction (DROP INDEX is transactional: the ROLLBACK that ends every run brings it back,
  no 10M-row rebuild), in an order alternating from run to run, each after a VACUUM (the
  rolled-back rows' dead index entries gone: inserting the same keys again over them cost the
  index 1.4x → 3x over three runs) and a CHECKPOINT (the first change of a page after one writes
  the page to the WAL: a batch of events some time after the previous one). The WAL each writes
  is printed. `event_ingest_index_cost_ratio` is the median time with the index over the median
  time without (1.10: ingestion 10% slower).
  Fan-out of a list campaign does not touch delivery_emailevent (it reads contacts,
  memberships and suppressions, writes messages and outbox rows), so the index cannot change it:
  stated, not measured.

The last lines are the medians, one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django.db import connection, transaction  # noqa: E402

from bench.lib.common import LOG_DIR, bench_database, prepare_alone  # noqa: E402
from bench.lib.segment_data import SegmentData, ensure_segment_data  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_segments")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
EXPLAIN_LOG = LOG_DIR / "segments-explain.log"
# The product's default is 15 s: a plan slower than that would only show as a timeout.
BENCH_TIMEOUT_S = 120
HANOI = {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"}
OPENED_90 = {"engagement": "opened", "op": "at_least", "value": 1, "within": {"days": 90}}


def cases(data: SegmentData) -> list[tuple[str, dict[str, Any], float, bool]]:
    """(name, filter, target seconds, engagement?) of every count timed."""
    big_list = next(iter(data.lists.values()))  # the 200k one (bench.lib.segment_data.list_names)
    newest = data.history[-1]
    return [
        ("attribute_equals", HANOI, 1.0, False),
        (
            "attribute_number_range",
            {"and": [
                {"attribute": "age", "type": "number", "op": "gte", "value": 25},
                {"attribute": "age", "type": "number", "op": "lt", "value": 35},
            ]},
            1.0, False,
        ),
        ("list_in", {"list": big_list, "op": "in"}, 1.0, False),
        (
            "list_in_attribute",
            {"and": [{"list": big_list, "op": "in"}, {"attribute": "plan", "type": "string", "op": "equals", "value": "pro"}]},
            1.0, False,
        ),
        ("opened_90d", OPENED_90, 3.0, True),
        ("opened_3x_90d", {**OPENED_90, "value": 3}, 3.0, True),
        ("never_opened", {"engagement": "opened", "op": "none"}, 3.0, True),
        ("not_opened_campaign", {"engagement": "opened", "op": "none", "campaign": newest}, 3.0, True),
        ("attribute_opened_90d", {"and": [HANOI, OPENED_90]}, 3.0, True),
    ]  # fmt: skip


def timed_count(node: Any) -> tuple[float, int]:
    from campaigns.segment_sql import count

    started = time.perf_counter()
    n = count(node)
    return time.perf_counter() - started, n


def captured_count_sql(node: Any) -> tuple[str, dict[str, Any]]:
    """The count statement count() runs for `node`, and its parameters."""
    from campaigns.segment_sql import count

    seen: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "count(*)" in sql:
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        count(node)
    return seen[-1]


def explain(name: str, node: Any, log: Any) -> str:
    sql, params = captured_count_sql(node)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = '{BENCH_TIMEOUT_S}s'")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
        text = cursor.mogrify(sql, params).decode()
    log.write(
        f"\n=== {name} ({time.strftime('%Y-%m-%d %H:%M:%S')}, load {os.getloadavg()[0]:.2f})\n{text}\n\n"
    )
    log.write("\n".join(plan) + "\n")
    # The shape in a few words: the joins and sub-plans, the engagement index's scan, the time.
    shape = [
        line.strip().split("  (")[0].lstrip("-> ")
        for line in plan
        if any(
            word in line
            for word in ("Join", "SubPlan", "Gather", "Index Only Scan", "Index Scan", "Bitmap Heap")
        )
    ]
    total = next((line for line in plan if line.startswith("Execution Time")), "")
    return f"{name}: {total}; " + " | ".join(dict.fromkeys(shape))


# --- ingestion: the engagement index's cost ---------------------------------------------------

# The segments' engagement indexes (delivery/models.py, migration 0019): the cost measured is theirs.
ENGAGEMENT_INDEXES = ("emailevent_human_idx", "emailevent_feedback_idx")

EVENT_COLUMNS = (
    "kind, provider, provider_event_id, occurred_at, payload, created_at, message_id, bounce, detail, "
    "recipient, classification"
)


def prepare_ingest(n: int, newest_campaign: int) -> None:
    """A temporary table of `n` new events in production's mix (bench.lib.segment_data's
    probabilities, for a message of each), on the newest campaign's messages, dated now."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_ingest")
        cursor.execute(
            """
            CREATE TEMP TABLE bench_ingest AS
            SELECT s.kind, 'ses'::varchar AS provider, NULL::varchar AS provider_event_id,
                   now() AS occurred_at, '{}'::jsonb AS payload, now() AS created_at, m.id AS message_id,
                   CASE s.kind WHEN 'bounced' THEN 'permanent' ELSE '' END::varchar AS bounce, ''::text AS detail, m.to_email AS recipient, s.class AS classification
              FROM (SELECT id, to_email FROM delivery_message WHERE campaign_id = %(campaign)s
                     ORDER BY random() LIMIT %(messages)s) AS m
             CROSS JOIN LATERAL (
                 SELECT * FROM (VALUES ('delivered', ''), ('opened', 'human'), ('opened', 'machine'),
                                       ('opened', 'proxy'), ('clicked', 'human'), ('bounced', ''))
                     AS k(kind, class)
                  WHERE random() + 0 * m.id < CASE k.kind || k.class WHEN 'delivered' THEN 0.98
                        WHEN 'openedhuman' THEN 0.83 WHEN 'openedmachine' THEN 0.35
                        WHEN 'openedproxy' THEN 0.10 WHEN 'clickedhuman' THEN 0.12 ELSE 0.02 END
             ) AS s
             LIMIT %(n)s
            """,
            {"campaign": newest_campaign, "messages": int(n / 2.3) + 1, "n": n},
        )
        cursor.execute("SELECT count(*), count(*) FILTER (WHERE classification = 'human') FROM bench_ingest")
        rows, human = cursor.fetchone()
        cursor.execute("ANALYZE bench_ingest")
    print(
        f"ingestion: {rows:,} events prepared ({human:,} human opens and clicks: the index's share)",
        flush=True,
    )


def ingest_once(with_index: bool) -> tuple[float, int, float]:
    """INSERT the prepared events, timed, in a transaction rolled back (with the index dropped in
    it when not `with_index`); then VACUUM (not timed), so that every run finds the same table
    and indexes, not the dead entries of the runs before it. Returns (seconds, rows, WAL MB)."""
    with transaction.atomic(), connection.cursor() as cursor:
        if not with_index:
            for index in ENGAGEMENT_INDEXES:
                cursor.execute(f"DROP INDEX {index}")
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        (lsn,) = cursor.fetchone()
        started = time.perf_counter()
        cursor.execute(
            f"INSERT INTO delivery_emailevent ({EVENT_COLUMNS}) SELECT {EVENT_COLUMNS} FROM bench_ingest"
        )
        wall = time.perf_counter() - started
        rows = cursor.rowcount
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", [lsn])
        wal = float(cursor.fetchone()[0]) / 1e6
        transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM delivery_emailevent")
        # Each run after a checkpoint, as a batch arriving some time after the last one: the
        # first change of every page after a checkpoint writes the whole page to the WAL.
        cursor.execute("CHECKPOINT")
    return wall, rows, wal


def measure_ingest(n: int, runs: int, newest_campaign: int) -> dict[str, list[float]]:
    prepare_ingest(n, newest_campaign)
    times: dict[str, list[float]] = {"with": [], "without": [], "wal_with": [], "wal_without": []}
    rows = 0
    ingest_once(True)  # warm: the table's and the indexes' pages the INSERT touches
    for number in range(1, runs + 1):
        order = [True, False] if number % 2 else [False, True]
        for with_index in order:
            wall, rows, wal = ingest_once(with_index)
            times["with" if with_index else "without"].append(wall)
            times["wal_with" if with_index else "wal_without"].append(wal)
        print(
            f"ingestion run {number} (load average {os.getloadavg()[0]:.2f}): {rows:,} events with the "
            f"engagement index {times['with'][-1]:.3f} s ({rows / times['with'][-1]:,.0f}/s, "
            f"WAL {times['wal_with'][-1]:.0f} MB), without {times['without'][-1]:.3f} s "
            f"({rows / times['without'][-1]:,.0f}/s, WAL {times['wal_without'][-1]:.0f} MB): "
            f"x{times['with'][-1] / times['without'][-1]:.2f}",
            flush=True,
        )
    times["rows"] = [float(rows)]
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_ingest")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--contacts", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--rebuild", action="store_true", help="generate the data again")
    parser.add_argument("--ingest", type=int, default=200_000, help="events per ingestion run")
    parser.add_argument("--ingest-runs", type=int, default=3)
    parser.add_argument("--no-ingest", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS"] = str(BENCH_TIMEOUT_S)

    load = os.getloadavg()
    prepare_alone(BENCH_DB, REDIS_URL)
    from django.conf import settings

    from campaigns.segment_filter import parse
    from campaigns.segment_sql import sample

    data = ensure_segment_data(args.contacts, args.events, rebuild=args.rebuild)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('delivery_emailevent')), "
                       "pg_size_pretty(pg_relation_size('emailevent_human_idx') + pg_relation_size('emailevent_feedback_idx')), "
                       "current_setting('work_mem'), current_setting('max_parallel_workers_per_gather'), "
                       "current_setting('shared_buffers'), version()")  # fmt: skip
        events_size, index_size, work_mem, workers, shared_buffers, version = cursor.fetchone()
    print(
        f"database {BENCH_DB}: {data.contacts:,} contacts, lists {data.list_sizes}, {len(data.history)} campaigns, "
        f"{data.messages:,} messages, {data.events:,} events ({events_size} with indexes; engagement index "
        f"{index_size}); {'built in ' + format(data.built_s, '.0f') + ' s' if data.built_s else 'reused'}\n"
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start; "
        f"work_mem {work_mem}, max_parallel_workers_per_gather {workers}, shared_buffers {shared_buffers}; "
        f"{version.split(' on ')[0]}; count() timeout raised to {BENCH_TIMEOUT_S} s "
        f"(product: EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS default 15 s)",
        flush=True,
    )
    assert settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS == BENCH_TIMEOUT_S

    results: dict[str, dict[str, Any]] = {}
    plans = []
    EXPLAIN_LOG.parent.mkdir(parents=True, exist_ok=True)
    with EXPLAIN_LOG.open("w") as log:
        log.write(f"bench/segments.py, {time.strftime('%Y-%m-%d %H:%M:%S')}: the count statements' plans\n")
        for name, data_filter, target, engagement in cases(data):
            node = parse(data_filter)
            first, n = timed_count(node)  # warm
            times = [timed_count(node)[0] for _ in range(args.runs)]
            results[name] = {
                "median": median(times),
                "times": times,
                "count": n,
                "target": target,
                "first": first,
            }
            print(
                f"count {name}: {n:,} contacts, median {median(times):.3f} s of {args.runs} "
                f"({' '.join(f'{t:.3f}' for t in times)}; first {first:.3f}) "
                f"{'meets' if median(times) < target else 'MISSES'} < {target:g} s",
                flush=True,
            )
            if engagement:
                plans.append(explain(name, node, log))
    print(f"EXPLAIN (ANALYZE, BUFFERS) of the engagement counts, in full in {EXPLAIN_LOG}:")
    for line in plans:
        print(f"  {line}")

    samples: dict[str, float] = {}
    for name, data_filter, _, _ in cases(data):
        if name not in ("attribute_equals", "opened_90d", "attribute_opened_90d", "never_opened"):
            continue
        node = parse(data_filter)
        sample(node, size=50)
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            rows = sample(node, size=50)
            times.append(time.perf_counter() - started)
        samples[name] = median(times)
        print(f"sample {name}: {len(rows)} contacts, median {median(times):.3f} s", flush=True)

    ingest = None
    if not args.no_ingest:
        ingest = measure_ingest(args.ingest, args.ingest_runs, data.history[-1])

    print(
        "fan-out of a list campaign and the engagement index: unaffected by construction (the index is "
        "on delivery_emailevent, which a list fan-out neither reads nor writes); not measured"
    )
    missed = [name for name, r in results.items() if r["median"] >= r["target"]]
    print(f"{'MISSES' if missed else 'meets'} the targets (< 1 s attribute/list, < 3 s engagement)"
          + (f": {', '.join(missed)}" if missed else "") + f"; load average now {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name, r in results.items():
        print(f"segment_count_{name}_matched: {r['count']} contacts")
    for name, seconds in samples.items():
        print(f"segment_sample_{name}_s: {seconds:.3f} s")
    if ingest:
        rows = ingest["rows"][0]
        with_s, without_s = median(ingest["with"]), median(ingest["without"])
        print(f"event_ingest_rows_per_s: {rows / with_s:.0f} events/s")
        print(f"event_ingest_noindex_rows_per_s: {rows / without_s:.0f} events/s")
        print(f"event_ingest_index_cost_ratio: {with_s / without_s:.2f}")
    for name, r in results.items():
        print(f"segment_count_{name}_s: {r['median']:.3f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
