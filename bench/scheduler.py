"""Scheduler benchmark: claim throughput of the Redis schedule index, and dispatch lateness.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/scheduler.py [--runs 5] [--only claim,dispatch] [--units 1000000]
                                        [--messages 10000] [--spread 6] [--schedulers 1]

Targets (the issue): claim >= 300,000 due units/s and >= 1.0x the naive loop in the same run
(`claim_ratio`); dispatch lateness p99 < 0.5 s for 10,000
single-message units.

The bench has a database (`emailhub_bench_scheduler`) and a Redis database (10) of its own,
created and migrated if missing, like bench/transactional.py but not the same ones: every bench
empties its tables and flushes its Redis database, and must not do it under another bench or a
test run going on at the same time (bench/fanout.py, bench/campaign.py and
bench/transactional.py share `emailhub_bench` and Redis 14; bench/delivery.py has 12; the demo
13; the tests 15, or whatever REDIS_URL their session sets, 11 has been seen). `--database` and
`--redis-url` choose others. Before touching anything the bench refuses to start if another
client is connected to its Redis database or its PostgreSQL database, or if the Redis database
is not empty. Its Redis database is flushed before each dispatch run and at the end (the claim
part would leave ~2M set entries, a few hundred MB, behind).

claim     --units due units (`m:<n>`, scored over the past hour) are written once to a template
          key with pipelined ZADDs (not timed) and copied, server-side in steps of 2,000 (a short
          Lua script), to the due set before each timed pass; the lease set is emptied between
          passes. (One COPY or DEL of a 1M-entry set would stall the shared Redis, and whoever
          else uses it, for 0.1-0.4 s; the steps take about a millisecond each.) Three passes per
          run, each timed from the first call to the one that finds the set empty:
          - `claim`: core.schedule_index.claim(--batch, 30), what run_scheduler calls: the Lua
            script by EVALSHA (ZRANGE BYSCORE + ZREM, the units joined into one string that is
            both the lease (SET) and the reply, ZADD of the token to the claims set, Redis
            TIME) and the parsing of the reply into Unit objects;
          - `lua`: the same script through the same client, the reply left as one bytes
            string (units counted, not parsed): Redis and the round trip alone;
          - `naive`: the source design, a loop of ZRANGEBYSCORE -inf now LIMIT 0 --batch then
            ZREM of those, two round trips, no lease, not atomic across claimers.
          The three passes rotate their order from run to run so that a noisy moment of this
          shared machine does not always hit the same one. Then a fourth, interleaved pass:
          one drain of the same 1M-unit set in which the three take turns batch by batch, each
          call timed alone, so that all three see the same moments of the machine's load (the
          sequential passes moved 2-5x between runs under other benches); `claim_ratio`, the
          headline, is the median over runs of that pass's claim() / naive.
dispatch  A run: fresh `scheduler` process(es) (scripts/stack.py PROCESSES, standard command,
          `--schedulers` of them, no Celery worker: the send tasks stay in the broker lists to
          be counted), --warmup messages due at once (imports, connections; not measured),
          then --messages `scheduled` messages, alternately critical and high, inserted with
          generate_series and due evenly over --spread seconds starting --lead seconds later
          (10,000 over 6 s: ~1,700 falling due per second), indexed with schedule_index.add (what the
          API does after its commit). The bench then waits for the last due time before it
          polls PostgreSQL, so its own queries do not compete with the scheduler meanwhile.
          Lateness = queued_at - due_at per message, from PostgreSQL. queued_at is
          clock_timestamp() in dispatch's UPDATE; the same transaction records the outbox rows,
          commits, and the send tasks are published to the broker right after the commit, then
          the claim is acked and run_scheduler logs "dispatched N unit(s), M message(s)". So
          queued_at is a lower bound of the publish time. For one scheduler the bench also
          gives an upper bound: messages sorted by queued_at are matched to the log lines in
          order (batches do not overlap in one process; checked), and log time + 1 ms (the log
          has millisecond resolution) - due_at is the "publish bound" lateness.
          Checks: every message `queued`, the outbox empty, the due and lease sets empty, and
          the broker lists (all list keys of the Redis database) hold each id exactly once.
          Also the scheduler's peak RSS (VmHWM of its process group) and CPU per message.

The last lines are the medians across runs, one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import resource
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from django.db import connection  # noqa: E402

from bench.lib.common import bench_database, prepare  # noqa: E402
from bench.lib.stats import group_stats, percentile  # noqa: E402
from scripts.stack import Stack  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_scheduler")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
LOG_DIR = ROOT / "bench" / ".cache" / "logs" / "scheduler"
TEMPLATE_KEY = "bench:scheduler:template"  # the filled due set, copied before each claim pass
LEASE_SECONDS = 30.0

# "2025-01-31 11:33:33,123 INFO scheduling.management.commands.run_scheduler dispatched 3 unit(s),
# 3 message(s) in 4.1 ms (claim 0.4, sql 1.9, commit+publish 1.5, ack 0.3; gc 0.0)"
DISPATCHED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+ dispatched (\d+) unit\(s\), (\d+) message\(s\)"
    r"(?: in [\d.]+ ms \(.*\))?$",
    re.MULTILINE,
)
STEPS = re.compile(
    r"dispatched \d+ unit\(s\), (\d+) message\(s\) in ([\d.]+) ms \(claim ([\d.]+), sql ([\d.]+), "
    r"commit\+publish ([\d.]+), ack ([\d.]+); gc ([\d.]+)\)$",
    re.MULTILINE,
)
STEP_NAMES = ("total", "claim", "sql", "commit+publish", "ack", "gc")


def setup(database: str, redis_url: str) -> dict[str, str]:
    """Create and migrate the bench database, point this process at it; return the env."""
    # run_scheduler's per-claim INFO line is what the publish bound is read from; INFO is the
    # default, but an inherited EMAILHUB_LOG_LEVEL=WARNING would silence it.
    return prepare(database, redis_url, EMAILHUB_LOG_LEVEL="INFO")


def ensure_alone(r: redis.Redis) -> None:
    """Refuse to flush or truncate what someone else is using right now."""
    db = int(r.connection_pool.connection_kwargs.get("db", 0))
    me = r.client_id()
    others = [c for c in r.client_list() if int(c["db"]) == db and int(c["id"]) != me]
    keys = r.dbsize()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        sessions = cursor.fetchone()[0]
    if others or keys or sessions:
        raise RuntimeError(
            f"Redis database {db} has {len(others)} other client(s) and {keys} key(s); "
            f"PostgreSQL database {connection.settings_dict['NAME']} has {sessions} other session(s). "
            "Someone may be using them: choose others with --redis-url/--database (or flush an "
            "abandoned Redis database of yours by hand)."
        )


# --- claim throughput ----------------------------------------------------------------------------


# This Redis serves other benches and test runs at the same time, and one command on a 1M-entry
# set (COPY ~350 ms, DEL ~110 ms) would stall all of them: the set work below goes in steps of a
# few thousand entries, each a millisecond or so.
STEP = 2000  # also keeps Lua's unpack() well under its ~8,000 values limit

_COPY_STEP = """
local items = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES')
local args = {}
for i = 1, #items, 2 do
  args[i] = items[i + 1]
  args[i + 1] = items[i]
end
if #args > 0 then
  redis.call('ZADD', KEYS[2], unpack(args))
end
return #items / 2
"""


def delete_gently(r: redis.Redis, *keys: str) -> None:
    from core import schedule_index

    for key in keys:
        if key == schedule_index.CLAIMS:
            # Each claim's units live in a list of their own: drop those lists with the index.
            while tokens := r.zrange(key, 0, 999):
                r.delete(*[schedule_index.CLAIM_PREFIX + t.decode() for t in tokens])
                r.zrem(key, *tokens)
            continue
        while r.zremrangebyrank(key, 0, 5 * STEP - 1):
            pass


def copy_gently(r: redis.Redis, source: str, target: str) -> None:
    start = 0
    while copied := int(r.eval(_COPY_STEP, 2, source, target, start, start + STEP - 1)):
        start += copied


def fill_template(r: redis.Redis, units: int) -> float:
    """Write `units` due units to TEMPLATE_KEY, scored over the past hour; return seconds taken."""
    started = time.perf_counter()
    delete_gently(r, TEMPLATE_KEY)
    oldest = time.time() - 3600  # all due: claim compares with Redis TIME, i.e. now
    step = 3000 / units  # distinct scores, as real due times would mostly be
    pipe = r.pipeline(transaction=False)
    for start in range(0, units, STEP):
        pipe.zadd(TEMPLATE_KEY, {f"m:{n}": oldest + n * step for n in range(start, min(start + STEP, units))})
        if len(pipe) == 25:  # 50,000 units a round trip
            pipe.execute()
    pipe.execute()
    if r.zcard(TEMPLATE_KEY) != units:
        raise RuntimeError(f"template holds {r.zcard(TEMPLATE_KEY)} units, expected {units}")
    return time.perf_counter() - started


def timed_pass(r: redis.Redis, units: int, drain: Callable[[], int]) -> float:
    """Reset the due set from the template and empty the lease set (untimed), time drain()."""
    from core import schedule_index

    # Synchronously and before the clock starts (not UNLINK: its background free would compete
    # with the timed loop for the two cores).
    delete_gently(r, schedule_index.DUE, schedule_index.CLAIMS)
    copy_gently(r, TEMPLATE_KEY, schedule_index.DUE)
    if r.zcard(schedule_index.DUE) != units:
        raise RuntimeError(
            f"the due set holds {r.zcard(schedule_index.DUE)} units after the copy, expected {units}"
        )
    started = time.perf_counter()
    claimed = drain()
    elapsed = time.perf_counter() - started
    left = r.zcard(schedule_index.DUE)
    if claimed != units or left:
        raise RuntimeError(f"claimed {claimed} of {units} units, {left} left in the due set")
    return units / elapsed


def drain_with_claim(batch: int) -> int:
    from core import schedule_index

    total = 0
    while units := schedule_index.claim(batch, LEASE_SECONDS).units:
        total += len(units)
    return total


def drain_with_lua(batch: int) -> int:
    from core import redis_clients, schedule_index

    # The exact script and call run_scheduler's claim() makes (EVALSHA over the same client),
    # minus the parsing of the reply into Unit objects: what Redis and the round trip cost alone.
    client, total = redis_clients.schedule(), 0
    while True:
        joined, _, _ = schedule_index._claim_script(
            keys=[schedule_index.DUE, schedule_index.CLAIMS],
            args=[batch, LEASE_SECONDS, schedule_index.CLAIM_PREFIX, uuid.uuid4().hex],
            client=client,
        )
        if not joined:
            return total
        total += joined.count(b" ") + 1


def drain_naive(batch: int) -> int:
    from core import redis_clients, schedule_index

    # The source design: read what is due, then remove it. Two round trips, and two claimers can
    # read the same units between them; counted by what ZREM really removed.
    client, total = redis_clients.schedule(), 0
    while True:
        units = client.zrangebyscore(schedule_index.DUE, "-inf", time.time(), start=0, num=batch)
        if not units:
            return total
        total += client.zrem(schedule_index.DUE, *units)


def claim_steps(batch: int) -> dict[str, Callable[[], int]]:
    """One batch of each method; each returns the units it took (0: the set is empty)."""
    from core import redis_clients, schedule_index

    client = redis_clients.schedule()

    def claim() -> int:
        return len(schedule_index.claim(batch, LEASE_SECONDS).units)

    def lua() -> int:
        joined, _, _ = schedule_index._claim_script(
            keys=[schedule_index.DUE, schedule_index.CLAIMS],
            args=[batch, LEASE_SECONDS, schedule_index.CLAIM_PREFIX, uuid.uuid4().hex],
            client=client,
        )
        return joined.count(b" ") + 1 if joined else 0

    def naive() -> int:
        units = client.zrangebyscore(schedule_index.DUE, "-inf", time.time(), start=0, num=batch)
        return int(client.zrem(schedule_index.DUE, *units)) if units else 0

    return {"claim": claim, "lua": lua, "naive": naive}


def interleaved_pass(r: redis.Redis, units: int, batch: int) -> dict[str, float]:
    """One drain of the full due set in which the three methods take turns batch by batch, each
    timed alone: they share the same set and the same moments of this machine's load, which
    moves sequential passes of several seconds each by 2-5x. Returns units/s per method."""
    from core import schedule_index

    delete_gently(r, schedule_index.DUE, schedule_index.CLAIMS)
    copy_gently(r, TEMPLATE_KEY, schedule_index.DUE)
    steps = claim_steps(batch)
    names = list(steps)
    seconds = dict.fromkeys(names, 0.0)
    taken = dict.fromkeys(names, 0)
    turn = 0
    while True:
        name = names[turn % len(names)]
        turn += 1
        started = time.perf_counter()
        got = steps[name]()
        seconds[name] += time.perf_counter() - started
        if not got:
            break
        taken[name] += got
    if sum(taken.values()) != units or r.zcard(schedule_index.DUE):
        raise RuntimeError(f"interleaved pass took {taken} of {units} units")
    return {name: taken[name] / seconds[name] for name in names}


CLAIM_METHODS: dict[str, Callable[[int], int]] = {
    "claim": drain_with_claim,
    "lua": drain_with_lua,
    "naive": drain_naive,
}


def bench_claims(args: argparse.Namespace, r: redis.Redis) -> list[dict[str, float]]:
    from core import schedule_index

    print(f"\n== claim: {args.units:,} due units, batches of {args.batch}, {args.runs} run(s)", flush=True)
    fill_seconds = fill_template(r, args.units)
    memory = r.memory_usage(TEMPLATE_KEY) or 0  # sampled estimate, good enough for bytes/unit
    print(
        f"  filled the template in {fill_seconds:.1f} s (not timed); Redis memory of the set "
        f"~{memory / 2**20:.0f} MB ({memory / args.units:.0f} B/unit)",
        flush=True,
    )
    runs: list[dict[str, float]] = []
    names = list(CLAIM_METHODS)
    for number in range(1, args.runs + 1):
        shift = (number - 1) % len(names)
        order = names[shift:] + names[:shift]  # rotate: claim/lua/naive, lua/naive/claim, ...
        load = os.getloadavg()[0]
        result = {
            name: timed_pass(r, args.units, lambda m=name: CLAIM_METHODS[m](args.batch)) for name in order
        }
        mixed = interleaved_pass(r, args.units, args.batch)
        result.update({f"interleaved_{name}": value for name, value in mixed.items()})
        runs.append(result)
        print(
            f"  run {number} (load {load:.2f}): claim() {result['claim']:,.0f}/s, lua script "
            f"{result['lua']:,.0f}/s, ZRANGEBYSCORE+ZREM {result['naive']:,.0f}/s; claim() / naive "
            f"{result['claim'] / result['naive']:.2f}x\n"
            f"    interleaved batch by batch: claim() {mixed['claim']:,.0f}/s, lua script {mixed['lua']:,.0f}/s, "
            f"ZRANGEBYSCORE+ZREM {mixed['naive']:,.0f}/s; claim() / naive {mixed['claim'] / mixed['naive']:.2f}x",
            flush=True,
        )
    delete_gently(r, TEMPLATE_KEY, schedule_index.DUE, schedule_index.CLAIMS)
    return runs


# --- dispatch lateness ---------------------------------------------------------------------------


def insert_scheduled(count: int, first_due: float, spread: float, tag: str) -> list[int]:
    """Insert `count` scheduled messages due evenly from `first_due` over `spread` s; index them."""
    from core import schedule_index

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO delivery_message (to_email, subject, text, priority, status, due_at)
            SELECT %(tag)s || n || '@example.com', 'Reminder ' || %(tag)s || n, 'Your appointment is soon.',
                   CASE WHEN n %% 2 = 0 THEN 'critical' ELSE 'high' END, 'scheduled',
                   to_timestamp(%(first)s) + (n - 1) * %(step)s * interval '1 second'
              FROM generate_series(1, %(count)s) AS n
            RETURNING id, due_at
            """,
            {"tag": tag, "first": first_due, "step": spread / count, "count": count},
        )
        rows = cursor.fetchall()
    # What the API does after its commit (index_after_commit): one ZADD of all the units.
    schedule_index.add([(schedule_index.message_unit(message_id), due_at) for message_id, due_at in rows])
    return [message_id for message_id, _ in rows]


def wait_until_queued(ids: list[int], timeout: float, poll: float) -> None:
    from core import schedule_index

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                """SELECT (SELECT count(*) FROM delivery_message WHERE id = ANY(%s) AND status = 'scheduled'),
                          (SELECT count(*) FROM core_outboxtask)""",
                [ids],
            )
            scheduled, outbox = cursor.fetchone()
            if scheduled == 0 and outbox == 0 and schedule_index.sizes() == {"due": 0, "leased": 0}:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"after {timeout:.0f}s: {scheduled} still scheduled, {outbox} outbox row(s), "
                    f"index {schedule_index.sizes()} (see {LOG_DIR})"
                )
            time.sleep(poll)


def published_ids(r: redis.Redis) -> tuple[Counter[int], int]:
    """Every message id in a send task waiting in the broker (all list keys), and the task count."""
    ids: Counter[int] = Counter()
    tasks = 0
    for key in r.scan_iter(count=1000):
        if r.type(key) != b"list":
            continue
        for raw in r.lrange(key, 0, -1):
            envelope = json.loads(raw)
            if envelope["headers"]["task"] != "delivery.send_messages":
                raise RuntimeError(f"unexpected task in {key!r}: {envelope['headers']['task']}")
            body = json.loads(base64.b64decode(envelope["body"]))
            ids.update(body[0][0])  # body = [args, kwargs, embed]; args = [ids]
            tasks += 1
    return ids, tasks


def publish_bounds(log: str, rows: list[tuple[int, float, float]]) -> dict[int, float] | None:
    """Map each message to the log time of the dispatch that queued it (one scheduler only).

    `rows` are (id, queued_at, due_at) epochs of every message the scheduler queued. Batches of
    one process do not overlap: batch k's UPDATE runs after batch k-1's log line. So sorted by
    queued_at, the first M1 messages are the first line's, the next M2 the second's, etc.
    Returns None if the log and the rows disagree (then no bound is reported).
    """
    lines = [
        (datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(messages))
        for stamp, _, messages in DISPATCHED.findall(log)
    ]
    if sum(messages for _, messages in lines) != len(rows):
        return None
    ordered = sorted(rows, key=lambda row: row[1])
    bounds: dict[int, float] = {}
    position, previous_log = 0, 0.0
    for logged, messages in lines:
        batch = ordered[position : position + messages]
        position += messages
        # Millisecond truncation: the line was written within [logged, logged + 1 ms).
        if batch and (batch[0][1] < previous_log - 0.001 or batch[-1][1] > logged + 0.001):
            return None
        for message_id, _, _ in batch:
            bounds[message_id] = logged + 0.001
        previous_log = logged
    return bounds


def one_dispatch_run(
    args: argparse.Namespace, env: dict[str, str], r: redis.Redis, number: int
) -> dict[str, Any]:
    # Same starting point for every run: empty tables, empty index and broker, fresh processes.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delivery_message, core_outboxtask CASCADE")
    r.flushdb()
    stack = Stack(env=env, log_dir=LOG_DIR)
    try:
        keys = [f"scheduler-{n}" for n in range(args.schedulers)]
        groups = {key: stack.start("scheduler", key=key, timeout=60).popen.pid for key in keys}
        warm_ids = insert_scheduled(args.warmup, time.time(), 0.0, f"warm{number}-")
        wait_until_queued(warm_ids, 30, 0.05)

        cpu_before = sum(group_stats(pgid)[1] for pgid in groups.values())
        first_due = time.time() + args.lead
        ids = insert_scheduled(args.messages, first_due, args.spread, f"run{number}-")
        indexed_margin = first_due - time.time()  # must be > 0: indexed before anything fell due
        last_due = first_due + args.spread
        # Stay off the CPU until everything is due: two cores, and the scheduler needs one.
        time.sleep(max(0.0, last_due - time.time()))
        wait_until_queued(ids, 60, 0.05)
        cpu = sum(group_stats(pgid)[1] for pgid in groups.values()) - cpu_before
        rss_kb = sum(group_stats(pgid)[0] for pgid in groups.values())
    finally:
        logs = {key: process.log() for key, process in stack.processes.items()}
        stack.stop_all()

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT id, EXTRACT(EPOCH FROM queued_at), EXTRACT(EPOCH FROM due_at), status
                 FROM delivery_message WHERE id = ANY(%s)""",
            [warm_ids + ids],
        )
        fetched = cursor.fetchall()
    if any(status != "queued" for *_, status in fetched):
        raise RuntimeError(f"not all queued: {Counter(status for *_, status in fetched)}")
    rows = [(message_id, float(queued), float(due)) for message_id, queued, due, _ in fetched]
    measured = set(ids)
    lateness = sorted((queued - due) * 1000 for message_id, queued, due in rows if message_id in measured)

    published, tasks = published_ids(r)
    expected = set(warm_ids) | measured
    duplicates = sum(1 for message_id in measured if published[message_id] > 1)
    missing = sum(1 for message_id in measured if published[message_id] == 0)
    if duplicates or missing or set(published) != expected:
        raise RuntimeError(
            f"broker: {missing} measured id(s) missing, {duplicates} published more than once, "
            f"{len(set(published) - expected)} unknown id(s)"
        )

    batches = [int(m) for log in logs.values() for _, units, m in DISPATCHED.findall(log)]
    # Where the scheduler's time went, from its own per-dispatch timings (run_scheduler's log).
    steps = [[float(v) for v in found] for log in logs.values() for found in STEPS.findall(log)]
    slowest = max(steps, key=lambda row: row[1]) if steps else None
    result: dict[str, Any] = {
        **{f"lateness_p{p}": percentile(lateness, p) for p in (50, 95, 99)},
        "lateness_max": lateness[-1],
        "lateness_min": lateness[0],
        "indexed_margin": indexed_margin,
        "tasks": tasks,
        "published": sum(published[message_id] for message_id in measured),
        "dispatches": len(batches),
        "scheduler_cpu_us": cpu * 1e6 / args.messages,
        "scheduler_peak_rss": rss_kb / 1024,
        "step_sums_ms": {name: sum(row[i + 1] for row in steps) for i, name in enumerate(STEP_NAMES)},
        "slowest_dispatch": slowest,
    }
    if args.schedulers == 1:
        bounds = publish_bounds(logs[keys[0]], rows)
        if bounds is not None:
            late = sorted(
                (bounds[message_id] - due) * 1000 for message_id, _, due in rows if message_id in measured
            )
            result.update({f"publish_bound_p{p}": percentile(late, p) for p in (50, 99)})
            result["publish_bound_max"] = late[-1]
    return result


def bench_dispatch(args: argparse.Namespace, env: dict[str, str], r: redis.Redis) -> list[dict[str, Any]]:
    print(
        f"\n== dispatch: {args.messages:,} single-message units (critical/high alternately) due over "
        f"{args.spread:g} s from {args.lead:g} s ahead ({args.messages / args.spread:,.0f}/s), "
        f"{args.schedulers} scheduler(s), {args.runs} run(s); logs in {LOG_DIR.relative_to(ROOT)}",
        flush=True,
    )
    runs = []
    for number in range(1, args.runs + 1):
        load = os.getloadavg()[0]
        res = one_dispatch_run(args, env, r, number)
        runs.append(res)
        if res["indexed_margin"] <= 0:
            print(
                f"  WARNING: indexing ended {-res['indexed_margin']:.2f} s after the first unit fell due "
                "(the bench, not the scheduler, made those late); raise --lead",
                flush=True,
            )
        bound = (
            f"; publish bound (log) p50 {res['publish_bound_p50']:.1f} p99 {res['publish_bound_p99']:.1f} "
            f"max {res['publish_bound_max']:.1f} ms"
            if "publish_bound_p99" in res
            else ""
        )
        print(
            f"  run {number} (load {load:.2f}): queued_at-due_at p50 {res['lateness_p50']:.1f} p95 "
            f"{res['lateness_p95']:.1f} p99 {res['lateness_p99']:.1f} max {res['lateness_max']:.1f} "
            f"min {res['lateness_min']:.2f} ms{bound}\n"
            f"    {res['dispatches']} dispatch(es) ({(args.messages + args.warmup) / max(res['dispatches'], 1):.1f} "
            f"msgs each, incl. warm-up), {res['tasks']} send task(s) in the broker holding each of the "
            f"{res['published']:,} measured ids once; scheduler CPU {res['scheduler_cpu_us']:.0f} us/msg, "
            f"peak RSS {res['scheduler_peak_rss']:.0f} MB; indexed {res['indexed_margin']:.2f} s before "
            "the first due",
            flush=True,
        )
        sums, slowest = res["step_sums_ms"], res["slowest_dispatch"]
        if slowest is not None:
            print(
                "    scheduler's own timings, sum over its dispatches: "
                + ", ".join(f"{name} {sums[name]:.0f}" for name in STEP_NAMES)
                + " ms; slowest dispatch: "
                + f"{slowest[0]:.0f} msgs in {slowest[1]:.1f} ms ("
                + ", ".join(
                    f"{name} {value:.1f}" for name, value in zip(STEP_NAMES[1:], slowest[2:], strict=True)
                )
                + ")",
                flush=True,
            )
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="claim,dispatch", help="comma-separated: claim, dispatch")
    parser.add_argument("--units", type=int, default=1_000_000, help="due units for the claim part")
    parser.add_argument("--batch", type=int, default=1000, help="units per claim call")
    parser.add_argument("--messages", type=int, default=10_000, help="single-message units to dispatch")
    parser.add_argument("--spread", type=float, default=6.0, help="seconds over which they fall due")
    parser.add_argument("--lead", type=float, default=2.0, help="seconds from insert to the first due")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured messages due at once first")
    parser.add_argument("--schedulers", type=int, default=1, help="scheduler processes")
    parser.add_argument("--database", default=BENCH_DB)
    parser.add_argument("--redis-url", default=REDIS_URL)
    args = parser.parse_args()
    parts = {part.strip() for part in args.only.split(",")}
    if not parts <= {"claim", "dispatch"} or args.runs < 1 or args.schedulers < 1 or args.spread <= 0:
        parser.error("--only takes claim and/or dispatch; --runs, --schedulers, --spread must be positive")
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    env = setup(args.database, args.redis_url)
    r = redis.Redis.from_url(args.redis_url, socket_timeout=30)
    print(
        f"database {args.database}, redis {args.redis_url}, load average {os.getloadavg()[0]:.2f}", flush=True
    )
    claims: list[dict[str, float]] = []
    dispatches: list[dict[str, Any]] = []
    ensure_alone(r)  # before the try: its `finally` flushes
    try:
        if "claim" in parts:
            claims = bench_claims(args, r)
        if "dispatch" in parts:
            dispatches = bench_dispatch(args, env, r)
    finally:
        # The claim part's sets take a few hundred MB of the shared Redis; ASYNC frees them in
        # Redis's background thread instead of blocking everyone for a fraction of a second.
        r.flushdb(asynchronous=True)

    print(
        f"\nbench process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; "
        f"load average at the end {os.getloadavg()[0]:.2f}"
    )
    if claims:
        c, lua, naive = (median(run[name] for run in claims) for name in ("claim", "lua", "naive"))
        print(
            f"median of {len(claims)} run(s): claim() {c:,.0f}/s ({'meets' if c >= 300_000 else 'MISSES'} "
            f"300,000/s), {c / naive:.2f}x the ZRANGEBYSCORE+ZREM loop; Lua script alone {lua / naive:.2f}x"
        )
        print(f"scheduler_claim_units_per_s: {c:.0f} units/s")
        print(f"scheduler_claim_lua_units_per_s: {lua:.0f} units/s")
        print(f"scheduler_naive_claim_units_per_s: {naive:.0f} units/s")
        print(f"scheduler_claim_vs_naive_ratio: {c / naive:.2f} x")
        ratios = sorted(run["interleaved_claim"] / run["interleaved_naive"] for run in claims)
        print(f"scheduler_claim_interleaved_ratio_per_run: {' '.join(f'{x:.2f}' for x in ratios)}")
        # The headline: claim() over the naive loop, interleaved batch by batch (median of runs).
        print(f"claim_ratio: {median(ratios):.2f}")
    if dispatches:
        p99 = median(run["lateness_p99"] for run in dispatches)
        print(f"median of {len(dispatches)} run(s): lateness p99 {'meets' if p99 < 500 else 'MISSES'} 0.5 s")
        keys = ["lateness_p50", "lateness_p95", "lateness_p99", "lateness_max"]
        keys += [k for k in ("publish_bound_p50", "publish_bound_p99") if all(k in run for run in dispatches)]
        for key in keys:
            print(f"scheduler_dispatch_{key}: {median(run[key] for run in dispatches):.1f} ms")
        print(f"scheduler_peak_rss: {median(run['scheduler_peak_rss'] for run in dispatches):.0f} MB")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        sys.exit(130)
