"""Fan-out benchmark: a campaign's list of 1,000,000 contacts becomes message rows and send tasks.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/fanout.py [--runs 3] [--contacts 1000000] [--step N] [--explain]
    .venv/bin/python bench/fanout.py --segment [--runs 3] [--contacts 1000000] [--events 10000000]

Target (the issue): >= 150,000 recipients/s (1M in under 7 s), fan-out peak RSS under 300 MB.

The bench has a database (`emailhub_bench_fanout`, created and migrated if missing) and Redis
database (11) of its own, and refuses to start while any other session or client uses them:
every run empties tables and flushes Redis, which must not happen under another bench.

Data, not timed: the contacts, their list memberships and the suppressions (every 100th contact,
1%, `--suppress-every`) are generated in SQL with generate_series once and reused while the list
has the right number of members. Their emails, `b<size>s<every>-<n>@example.com`, keep lists of
different sizes apart.

Each run starts from an emptied `delivery_message`/`core_outboxtask`, a flushed Redis
database 11 and a CHECKPOINT (so the WAL of the previous run is not flushed during this one),
creates a campaign already `sending` (not through lifecycle.schedule, which would also publish a
fan-out task that nobody here consumes), then starts a fresh Python process that runs
campaigns.fanout.fan_out(campaign_id) once, as the `campaigns.fan_out` task does. That process:
- times fan_out() alone (wall clock), after django.setup() and opening its database connection;
  everything fan_out() does counts: the INSERT … SELECT steps, the outbox rows, publishing one
  `delivery.send_messages` task per EMAILHUB_BATCH_SIZE_NORMAL (100) ids to Redis after each
  step's commit, and deleting the published outbox rows;
- reports its own peak RSS (VmHWM: the process is started for this alone, so it is fan-out's
  plus the Django/Celery baseline, which is printed apart), its CPU time, and the CPU time of
  its PostgreSQL backend (/proc/<backend pid>/stat) over the call: where the time goes;
- splits the wall time by wrapping, in that process only, what fan_out() calls: the step's
  INSERT … SELECT, the database COMMIT (where the deferred foreign-key checks run),
  send_tasks.record_sends and the publishing after commit; a perf_counter pair each, per step.
The parent then checks: rows == non-suppressed list members, the Redis list `normal` holds exactly
one task per 100 ids of each step (no worker runs here to consume them), the outbox is empty.
After the runs, one step is run once more under EXPLAIN (ANALYZE, BUFFERS) in a rolled-back
transaction, with the foreign-key checks made immediate so that their triggers' time shows, to
show how PostgreSQL spends a step (full plan with --explain).

References in the same run, same rows, same table (its indexes and deferred foreign keys), in an
order that rotates with the fan-out from run to run: Django `bulk_create` (model instances built
from the rows, BULK_CREATE_CHUNK per INSERT, one transaction) and psycopg2 `copy_expert` from an
in-memory text buffer built before the clock starts (its build time printed apart). The rows are
(contact, address) of run 1's fan-out, the other columns as fan-out writes them.
`fanout_copy_ratio` and `fanout_bulk_create_ratio` are fan-out's median rows/s over theirs (and
each run's ratio is printed too). Django's bulk_create of 1M rows takes minutes here; use
--contacts 200000 for a quicker sitting.

The segment case (`--segment`, issue 23): the campaign's audience is the segment SEGMENT_FILTER
(an attribute condition, city = Hanoi, and an engagement one, a human open in the last 90 days)
instead of a list, over bench/segments.py's database (`emailhub_bench_segments`,
bench.lib.segment_data: 1M contacts, half of them in Hanoi, a year of campaigns and ~10M events,
generated once and reused). Fan-out walks every contact by id (keyset) and inserts, one
INSERT … SELECT per step, a message for each one matching the filter (anchored at the campaign's
start), active and not suppressed. Everything above holds, except: a run starts by deleting the
bench campaigns' messages (not a TRUNCATE: the table holds the year's messages and the events
point at them) and vacuuming delivery_message; the expected recipients and matched contacts
come from a query shaped unlike fan-out's (hash semi-joins over the window's human opens and the
suppressions) and are checked against the rows and against total_count + excluded_count; the
references copy the same (contact, address) rows the segment fan-out created, into the same
table (with the year's 4M rows and their indexes); Django's bulk_create only with --bulk-create
(386k rows took 228 s at load 4, 1,700 rows/s). The lines are `fanout_segment_<key>`, with
`fanout_segment_matched`, `fanout_segment_recipients` and `fanout_segment_contacts_walked_per_s`;
the target is `fanout_segment_copy_ratio` >= 0.5.

The last lines are the medians across runs, one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.lib.audience import bench_template, ensure_audience, reset_state  # noqa: E402
from bench.lib.common import bench_database, prepare_alone  # noqa: E402
from bench.lib.fanout_process import child, run_child  # noqa: E402
from bench.lib.segment_data import SegmentData, ensure_segment_data  # noqa: E402

# A database and a Redis database of its own. Not bench/transactional.py's (emailhub_bench, 14):
# each bench empties its tables and flushes its Redis database at every run, and other benches
# run on this machine at the same time (bench.lib.common.claim_bench refuses to share).
BENCH_DB = bench_database("emailhub_bench_fanout")
# --segment: bench/segments.py's database and data (bench.lib.segment_data), a year of events.
SEGMENT_DB = bench_database("emailhub_bench_segments")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
# The segment of issue 23: half the contacts are in Hanoi, most of them opened (a human open) in
# the last 90 days; an attribute condition and an engagement one over ~10M events.
SEGMENT_FILTER = {
    "and": [
        {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"},
        {"engagement": "opened", "op": "at_least", "value": 1, "within": {"days": 90}},
    ]
}


@dataclass
class Audience:
    """What a bench campaign is sent to: a list (`contact_list_id`) or a segment (`segment_id`
    and the filter it was scheduled with), and how runs start from the same state."""

    campaign: dict[str, Any]  # Campaign fields naming the audience
    expected: int = 0
    segment: bool = False

    def reset(self) -> None:
        if not self.segment:
            reset_state(REDIS_URL)
            return
        reset_segment_state()


def reset_segment_state() -> None:
    """reset_state() for the segments' database, whose delivery_message holds a year of messages
    and ~10M events on them (a TRUNCATE … CASCADE would take them too): the bench campaigns'
    messages deleted (they have no events: the foreign-key triggers are skipped for the delete),
    the table vacuumed so that every run inserts into the same table, the outbox emptied."""
    from campaigns.models import Campaign

    bench = list(Campaign.objects.filter(name__startswith="bench ").values_list("id", flat=True))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM delivery_message WHERE campaign_id = ANY(%s)", [bench])
        cursor.execute("TRUNCATE core_outboxtask")
    Campaign.objects.filter(pk__in=bench).delete()
    if bench:
        with connection.cursor() as cursor:
            cursor.execute("VACUUM delivery_message")
    redis.Redis.from_url(REDIS_URL).flushdb()


def segment_audience(contacts: int, events: int) -> tuple[Audience, SegmentData]:
    """The segment's data (generated once), the segment, and its expected recipients by a query
    shaped unlike fan-out's: hash semi-joins over the window's human opens and the suppressions."""
    from campaigns.models import Segment

    data = ensure_segment_data(contacts, events)
    segment, _ = Segment.objects.update_or_create(
        name="bench fan-out segment", defaults={"filter": SEGMENT_FILTER}
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE campaigns_segment")
    return Audience({"segment_id": segment.pk, "audience_filter": SEGMENT_FILTER}, segment=True), data


def segment_expected(started_at: Any) -> dict[str, int]:
    """Contacts matching the filter (whatever their status) and those fan-out may mail, for a
    campaign started at `started_at` (the window ends there)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH opened AS (  -- a person's click is an open too (delivery.selectors.ENGAGEMENT_EVENTS)
                SELECT DISTINCT recipient FROM delivery_emailevent
                 WHERE kind IN ('opened', 'clicked') AND classification = 'human' AND occurred_at >= %(since)s
            )
            SELECT count(*),
                   count(*) FILTER (WHERE c.status = 'active' AND s.email IS NULL)
              FROM campaigns_contact AS c
              JOIN opened AS o ON o.recipient = c.email
              LEFT JOIN campaigns_suppression AS s ON s.email = c.email
             WHERE c.attributes ->> 'city' = 'Hanoi' AND c.anonymised_at IS NULL
            """,
            {"since": started_at - timedelta(days=90)},
        )
        matched, expected = cursor.fetchone()
    return {"matched": int(matched), "expected": int(expected)}


# --- audience ----------------------------------------------------------------------------------


def redis_flushes(redis_url: str = REDIS_URL) -> int:
    """FLUSHDB + FLUSHALL calls the Redis server has seen (any client, any database)."""
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("flushdb", "flushall"))


def queued_tasks(queue: str, redis_url: str = REDIS_URL) -> int:
    """Tasks waiting in a kombu Redis queue (the list `queue`, plus its priority sub-lists)."""
    client = redis.Redis.from_url(redis_url)
    total = 0
    for key in client.scan_iter(match=f"{queue}*"):
        name = key.decode()
        # kombu names the lists of priorities other than 0 `<queue>\x06\x16<priority>`.
        if (name == queue or name.startswith(f"{queue}\x06\x16")) and client.type(key) == b"list":
            total += int(client.llen(key))
    return total


# --- the measured process ----------------------------------------------------------------------


# --- the parent --------------------------------------------------------------------------------


def one_run(args: argparse.Namespace, env: dict[str, str], audience: Audience, number: int) -> dict[str, Any]:
    from campaigns.models import Campaign
    from core.models import OutboxTask
    from delivery.models import Message

    audience.reset()
    with connection.cursor() as cursor:
        # The previous run wrote ~1 GB of WAL; flush it now rather than during this run.
        cursor.execute("CHECKPOINT")
    campaign = Campaign.objects.create(
        name=f"bench fan-out {number}",
        template=bench_template(),
        **audience.campaign,
        priority="normal",
        status=Campaign.Status.SENDING,
        started_at=timezone.now(),
    )
    expected = audience.expected
    if audience.segment:  # the window ends at this campaign's start
        found = segment_expected(campaign.started_at)
        expected = found["expected"]
    flushes = redis_flushes()
    r = run_child(env, campaign.pk, args.step, args.timeout)
    flushes = redis_flushes() - flushes

    # Checks: every recipient exactly once, one task per 100 ids, outbox empty.
    campaign.refresh_from_db()
    rows = Message.objects.filter(campaign=campaign).count()
    r["tasks_in_redis"] = queued_tasks("normal")
    problems = []
    if not (r["finished"] and campaign.fanout_done):
        problems.append(f"fan-out did not finish: {r}")
    if rows != expected or r["created"] != expected or campaign.total_count != expected:
        problems.append(
            f"{rows} message rows (report {r['created']}, total_count {campaign.total_count}), "
            f"expected {expected}"
        )
    if audience.segment:
        # Matched = created + excluded (inactive, suppressed): the step's own count, checked.
        r["matched"] = campaign.total_count + campaign.excluded_count
        if r["matched"] != found["matched"]:
            problems.append(f"fan-out matched {r['matched']} contacts, expected {found['matched']}")
    if r["tasks_in_redis"] != r["tasks"]:
        problems.append(
            f"{r['tasks_in_redis']} tasks in Redis queue `normal`, {r['tasks']} recorded"
            # Redis databases are numbered, not owned: another bench or test run may empty ours.
            + (f" (and Redis saw {flushes} FLUSHDB/FLUSHALL meanwhile, not from here)" if flushes else "")
        )
    if (left := OutboxTask.objects.count()) != 0:
        problems.append(f"{left} outbox rows left unpublished")
    if problems:
        raise RuntimeError("; ".join(problems))
    r["rows"] = rows
    r["campaign_id"] = campaign.pk
    r["rows_per_s"] = rows / r["wall_s"]
    r["members_per_s"] = r["members"] / r["wall_s"]
    r["other_s"] = r["wall_s"] - sum(
        r[f"{name}_s"] for name in ("step_sql", "commit", "record_outbox", "publish")
    )
    return r


# --- references: the same rows by Django bulk_create and by COPY, same table, same run ----------

# The columns fan-out's INSERT … SELECT writes (transitions._STEP_SQL); every other column takes
# its database default, as it does there.
REFERENCE_COLUMNS = (
    "campaign_id",
    "contact_id",
    "template_id",
    "to_email",
    "priority",
    "status",
    "queued_at",
)
BULK_CREATE_CHUNK = 5000  # model instances alive at a time (1M at once would take ~2 GB)


def audience_rows(campaign_id: int) -> list[tuple[int, str]]:
    """(contact id, address) of every message fan-out created for the campaign, in its order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT contact_id, to_email FROM delivery_message WHERE campaign_id = %s ORDER BY contact_id",
            [campaign_id],
        )
        return list(cursor.fetchall())


def _reference_campaign(number: int, name: str, audience: Audience) -> Any:
    from campaigns.models import Campaign

    audience.reset()
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # as before each fan-out run
    return Campaign.objects.create(
        name=f"bench {name} {number}",
        template=bench_template(),
        **audience.campaign,
        priority="normal",
        status=Campaign.Status.SENDING,
        started_at=timezone.now(),
    )


def _count_rows(campaign_id: int) -> int:
    from delivery.models import Message

    return Message.objects.filter(campaign_id=campaign_id).count()


def reference_bulk_create(rows: list[tuple[int, str]], number: int, audience: Audience) -> dict[str, float]:
    """Django's bulk_create of the same rows in one transaction: model instances built from the
    rows (timed: that is what bulk_create needs), BULK_CREATE_CHUNK per INSERT, COMMIT."""
    from delivery.models import Message

    campaign = _reference_campaign(number, "bulk_create", audience)
    now = timezone.now()
    started = time.perf_counter()
    with transaction.atomic():
        for start in range(0, len(rows), BULK_CREATE_CHUNK):
            Message.objects.bulk_create(
                [
                    Message(
                        campaign_id=campaign.pk, contact_id=contact_id, template_id=campaign.template_id,
                        to_email=email, priority="normal", status="queued", queued_at=now,
                    )
                    for contact_id, email in rows[start : start + BULK_CREATE_CHUNK]
                ]
            )  # fmt: skip
    wall = time.perf_counter() - started
    if (written := _count_rows(campaign.pk)) != len(rows):
        raise RuntimeError(f"bulk_create wrote {written} rows, expected {len(rows)}")
    return {"wall_s": wall, "rows_per_s": len(rows) / wall}


def reference_copy(rows: list[tuple[int, str]], number: int, audience: Audience) -> dict[str, float]:
    """psycopg2 COPY of the same rows from an in-memory text buffer, one transaction. The buffer
    is built before the clock starts (reported apart): the reference is COPY itself."""
    import io

    campaign = _reference_campaign(number, "copy", audience)
    built = time.perf_counter()
    now = timezone.now().isoformat()
    prefix, suffix = f"{campaign.pk}\t", f"\t{campaign.template_id}\t"
    buffer = io.StringIO(
        "".join(f"{prefix}{contact_id}{suffix}{email}\tnormal\tqueued\t{now}\n" for contact_id, email in rows)
    )
    build = time.perf_counter() - built
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.cursor.copy_expert(
            f"COPY delivery_message ({', '.join(REFERENCE_COLUMNS)}) FROM STDIN", buffer
        )
    wall = time.perf_counter() - started
    if (written := _count_rows(campaign.pk)) != len(rows):
        raise RuntimeError(f"COPY wrote {written} rows, expected {len(rows)}")
    return {"wall_s": wall, "rows_per_s": len(rows) / wall, "buffer_s": build}


def explain_step(audience: Audience, step: int | None, full: bool) -> None:
    """EXPLAIN ANALYZE the first step's SQL on the emptied table, rolled back.

    The statement is the one materialise_step() runs (captured from a first call, rolled back),
    with the foreign keys' checks made immediate, so that the plan shows their cost too (in
    fan_out() they are deferred to the COMMIT, which the timings above show apart).
    """
    from django.conf import settings

    from campaigns.models import Campaign
    from campaigns.segments import audience_condition
    from delivery.services import transitions

    audience.reset()
    step = step or settings.EMAILHUB_FANOUT_STEP
    seen: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "INSERT INTO delivery_message" in sql:
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.cursor() as cursor:
        campaign = Campaign.objects.create(
            name="bench explain", template=bench_template(), **audience.campaign, status="sending",
            started_at=timezone.now(),
        )  # fmt: skip
        condition = audience_condition(campaign)
        with connection.execute_wrapper(capture):
            transitions.materialise_step(
                campaign_id=campaign.pk, list_id=campaign.contact_list_id, cursor=0, limit=step,
                template_id=campaign.template_id, priority=campaign.priority,
                condition=condition.sql if condition else None,
                condition_params=condition.params if condition else None,
            )  # fmt: skip
        transaction.set_rollback(True)
    sql, params = seen[0]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    print(f"one step of {step} members, FK checks immediate, EXPLAIN (ANALYZE, BUFFERS), rolled back:")
    words = ("Insert on", "Trigger", "Execution Time", "Planning Time", "SubPlan", "emailevent")
    for line in plan:
        if full or any(word in line for word in words):
            print(f"  {line.strip() if not full else line}")


# The final lines, `fanout_<key>: <median> <unit>`, in this order.
METRICS = [
    ("rows_per_s", "rows/s", "{:.0f}"),
    ("members_per_s", "recipients/s", "{:.0f}"),
    ("total_s", "s", "{:.2f}"),
    ("peak_rss", "MB", "{:.0f}"),
    ("tasks_published", "tasks", "{:.0f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--contacts", type=int, default=1_000_000)
    parser.add_argument("--step", type=int, default=None, help="members per step (default: the setting)")
    parser.add_argument(
        "--suppress-every", type=int, default=100, help="suppress every Nth contact (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one fan-out may take")
    parser.add_argument("--explain", action="store_true", help="print the full plan of one step")
    parser.add_argument(
        "--segment", action="store_true",
        help="fan out SEGMENT_FILTER over bench/segments.py's contacts and events instead of a list",
    )  # fmt: skip
    parser.add_argument("--events", type=int, default=10_000_000, help="--segment: events in the database")
    parser.add_argument("--bulk-create", action="store_true", help="--segment: the bulk_create reference too")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.step)
        return 0
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.segment:
        env = prepare_alone(SEGMENT_DB, REDIS_URL)
        audience, data = segment_audience(args.contacts, args.events)
        audience.reset()  # a run interrupted earlier may have left its campaign's rows
        found = segment_expected(timezone.now())
        print(
            f"database {SEGMENT_DB}, redis {REDIS_URL}; segment {SEGMENT_FILTER} over {data.contacts:,} contacts "
            f"and {data.events:,} events ({data.messages:,} history messages in delivery_message): "
            f"{found['matched']:,} contacts match now, {found['expected']:,} of them recipients "
            f"(active, not suppressed); {args.runs} run(s)",
            flush=True,
        )
    else:
        env = prepare_alone(BENCH_DB, REDIS_URL)
        list_id, expected, suppressed = ensure_audience(args.contacts, args.suppress_every)
        audience = Audience({"contact_list_id": list_id}, expected=expected)
        print(
            f"database {BENCH_DB}, redis {REDIS_URL}; list of {args.contacts:,} contacts, {suppressed:,} "
            f"suppressed: {expected:,} recipients; {args.runs} run(s)",
            flush=True,
        )
    runs: list[dict[str, Any]] = []
    # Django's bulk_create of the segment's 386k rows into the year's 4M took 228 s (1,700 rows/s)
    # at load 4: with --segment it runs only when asked.
    reference_names = ["bulk_create", "copy"] if args.bulk_create or not args.segment else ["copy"]
    references: dict[str, list[dict[str, float]]] = {name: [] for name in reference_names}
    rows: list[tuple[int, str]] = []
    try:
        for number in range(1, args.runs + 1):
            # The three in a rotating order (fan-out first in run 1: its rows are the references'
            # rows), so that a noisy moment of this shared machine does not always hit one.
            names = ["fanout", *reference_names]
            shift = (number - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                if name == "fanout":
                    r = one_fanout_run(args, env, audience, number)
                    runs.append(r)
                    if not rows:
                        rows = audience_rows(r["campaign_id"])
                    continue
                load = os.getloadavg()[0]
                ref = (reference_bulk_create if name == "bulk_create" else reference_copy)(
                    rows, number, audience
                )
                references[name].append(ref)
                extra = (
                    f" (the buffer built beforehand in {ref['buffer_s']:.2f} s, not timed)"
                    if "buffer_s" in ref
                    else ""
                )
                print(
                    f"run {number} (load average {load:.2f} before): reference {name} of the same {len(rows):,} rows "
                    f"into delivery_message: {ref['wall_s']:.2f} s = {ref['rows_per_s']:,.0f} rows/s{extra}",
                    flush=True,
                )
        explain_step(audience, args.step, args.explain)
    finally:
        audience.reset()  # leaves no million message rows nor 10,000 tasks behind
    return summarise(runs, references, segment=args.segment)


def one_fanout_run(
    args: argparse.Namespace, env: dict[str, str], audience: Audience, number: int
) -> dict[str, Any]:
    load = os.getloadavg()[0]
    r = one_run(args, env, audience, number)
    walked = "contacts walked" if audience.segment else "members"
    matched = (
        f"{r['matched']:,} contacts matched the segment, {r['rows']:,} of them recipients; "
        if audience.segment
        else ""
    )
    print(
        f"run {number} (load average {load:.2f} before): {matched}{r['rows']:,} rows in {r['wall_s']:.2f} s "
        f"= {r['rows_per_s']:,.0f} rows/s ({r['members_per_s']:,.0f} {walked}/s), "
        f"{r['steps']} steps of {r['step_size']}, {r['tasks']:,} tasks in Redis `normal`\n"
        f"  time: step INSERT…SELECT {r['step_sql_s']:.2f} s ({100 * r['step_sql_s'] / r['wall_s']:.0f}%), "
        f"outbox rows {r['record_outbox_s']:.2f} s ({100 * r['record_outbox_s'] / r['wall_s']:.0f}%), "
        f"publish+delete outbox {r['publish_s']:.2f} s ({100 * r['publish_s'] / r['wall_s']:.0f}%), "
        f"COMMIT (with the deferred FK checks) {r['commit_s']:.2f} s "
        f"({100 * r['commit_s'] / r['wall_s']:.0f}%), "
        f"rest (lock, campaign row, Python) {r['other_s']:.2f} s "
        f"({100 * r['other_s'] / r['wall_s']:.0f}%)\n"
        f"  CPU: fan-out process {r['cpu_s']:.2f} s, its PostgreSQL backend {r['backend_cpu_s']:.2f} s; "
        f"WAL {r['wal_mb']:,.0f} MB, checkpoints during the run {r['checkpoints']}\n"
        f"  peak RSS {r['peak_rss_kb'] / 1024:.0f} MB (VmHWM; ru_maxrss {r['ru_maxrss_kb'] / 1024:.0f} MB), "
        f"of which {r['rss_before_kb'] / 1024:.0f} MB before fan_out() (Django, Celery, connection)",
        flush=True,
    )
    return r


def summarise(
    runs: list[dict[str, Any]], references: dict[str, list[dict[str, float]]], *, segment: bool
) -> int:
    if not runs:  # --runs 0: the step's plan only
        return 0
    total = median(r["wall_s"] for r in runs)
    rss = median(r["peak_rss_kb"] for r in runs) / 1024
    members_per_s = median(r["members_per_s"] for r in runs)
    rows_per_s = median(r["rows_per_s"] for r in runs)
    copy_ratio = rows_per_s / median(ref["rows_per_s"] for ref in references["copy"])
    if segment:
        verdict = "meets" if copy_ratio >= 0.5 else "MISSES"
        target = ">= 0.5x the same run's COPY of the same rows"
    else:
        verdict = "meets" if members_per_s >= 150_000 and rss < 300 else "MISSES"
        target = ">= 150,000 recipients/s, peak RSS < 300 MB"
    print(
        f"median of {len(runs)} run(s): {verdict} the target ({target}); "
        f"load average now {os.getloadavg()[0]:.2f}"
    )
    prefix = "fanout_segment" if segment else "fanout"
    values = {
        "rows_per_s": rows_per_s,
        "members_per_s": members_per_s,
        "total_s": total,
        "peak_rss": rss,
        "tasks_published": median(r["tasks"] for r in runs),
    }
    if segment:
        print(f"{prefix}_matched: {median(r['matched'] for r in runs):.0f} contacts")
        print(f"{prefix}_recipients: {median(r['rows'] for r in runs):.0f} rows")
    for key, unit, fmt in METRICS:
        if segment and key == "members_per_s":
            key, unit = "contacts_walked_per_s", "contacts/s"
            values[key] = members_per_s
        print(f"{prefix}_{key}: {fmt.format(values[key])} {unit}")
    for name in references:
        print(
            f"{prefix}_{name}_rows_per_s: {median(ref['rows_per_s'] for ref in references[name]):.0f} rows/s"
        )
    # Ratios of the medians, and each run's ratio to the references of the same run beside them.
    for name in references:
        per_run = [
            run["rows_per_s"] / ref["rows_per_s"] for run, ref in zip(runs, references[name], strict=True)
        ]
        print(f"{prefix}_{name}_ratio_per_run: {' '.join(f'{x:.2f}' for x in per_run)}")
    for name in sorted(references, key=lambda name: name != "copy"):  # copy first
        print(
            f"{prefix}_{name}_ratio: {rows_per_s / median(ref['rows_per_s'] for ref in references[name]):.2f}"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the fan-out process was killed on the way out
        sys.exit(130)
