"""Transactional benchmark: critical messages through the HTTP API to an SMTP sink, on real processes.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/transactional.py [--runs 3] [--messages 1000] [--concurrency 4]

It starts, and always stops (also on error, Ctrl-C or SIGTERM): a database of its own
(`emailhub_bench`, created and migrated if missing), Redis database 14, an SMTP sink (Postfix
`smtp-sink` unless `--sink aiosmtpd`), gunicorn and the transactional Celery worker with the
commands of scripts/stack.py's PROCESSES. Each run starts them afresh on emptied tables and a
flushed Redis, sends `--warmup` unmeasured messages (imports, connections), then the measured.

What it measures, per run:
- accept rate: measured messages / wall time of the client loop (`--concurrency` threads, each
  with its own `requests.Session`, POSTing `priority: critical` messages, 202 expected);
- end-to-end rate: measured messages / (last `sent_at` - first `created_at`), from PostgreSQL;
- latency: `sent_at - created_at` per message. `created_at` is the INSERT's statement_timestamp()
  inside the API request; `sent_at` is clock_timestamp() right after the SMTP server's 250. It
  excludes the HTTP round trip before the INSERT (the client-side API time is printed apart);
- the sink's own count of received messages, which must equal what the database calls sent;
- peak RSS (sum of VmHWM) of the worker's process group, read from /proc before stopping it,
  and the CPU time the web and worker process groups spent per measured message;
- how many PostgreSQL sessions were opened while sending (pg_stat_database.sessions).
The last lines are the medians across runs (this machine is noisy), one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import prepare  # noqa: E402
from bench.smtp_sink import SinkUnavailable, free_port, open_sink  # noqa: E402
from scripts.stack import Stack  # noqa: E402

BENCH_DB = "emailhub_bench"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
LOG_DIR = ROOT / "bench" / ".cache" / "logs"


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile: a value that was really observed."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def group_stats(pgid: int) -> tuple[int, float]:
    """Sum of peak RSS (VmHWM, kB) and of CPU seconds over the live processes of a process group.

    Stack starts each process in its own session, so the group is the master and its forked
    children. Summing per-process peaks counts shared pages more than once: an upper bound.
    """
    rss_kb, cpu_ticks = 0, 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # After "(comm)", which may hold spaces: state ppid pgrp ... utime(11) stime(12).
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            cpu_ticks += int(fields[11]) + int(fields[12])
            status = (proc / "status").read_text()
            rss_kb += int(status.split("VmHWM:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    return rss_kb, cpu_ticks / os.sysconf("SC_CLK_TCK")


def db_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def message_body(i: int, tag: str) -> dict[str, str]:
    code = f"{i:06d}"
    return {
        "to": f"user{i}@example.com",
        "subject": f"Your sign-in code ({tag} #{i})",
        "text": f"Use {code} to sign in. It expires in 10 minutes.",
        "html": f"<html><body><p>Use <b>{code}</b> to sign in. It expires in 10 minutes.</p></body></html>",
        "priority": "critical",
    }


def post_messages(
    url: str, api_key: str, count: int, concurrency: int, tag: str
) -> tuple[list[int], float, list[float]]:
    """POST `count` messages from `concurrency` threads; return ids, wall seconds, per-request ms."""
    ids, api_ms, errors = [0] * count, [0.0] * count, []
    indexes = itertools.count()  # next() on it is atomic under the GIL: each index goes out once

    def client() -> None:
        # A keep-alive session, as a real client would use. (gunicorn's sync workers answer
        # `Connection: close`, so each request still opens a TCP connection.)
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {api_key}"
            while not errors and (i := next(indexes)) < count:
                started = time.perf_counter()
                try:
                    response = session.post(url, json=message_body(i, tag), timeout=30)
                except requests.RequestException as exc:  # e.g. the stack is stopping after Ctrl-C
                    errors.append(f"request failed: {exc}")
                    return
                api_ms[i] = (time.perf_counter() - started) * 1000
                if response.status_code != 202:
                    errors.append(f"HTTP {response.status_code}: {response.text[:300]}")
                    return
                ids[i] = response.json()["id"]

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"the API refused a message: {errors[0]}")
    return ids, elapsed, sorted(api_ms)


def wait_until_sent(ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT status, count(*) FROM delivery_message WHERE id = ANY(%s) GROUP BY status", [ids]
            )
            by_status = dict(cursor.fetchall())
            if by_status.get("sent", 0) == len(ids):
                return
            if set(by_status) & {"failed", "suppressed", "cancelled", "retry_wait"}:
                raise RuntimeError(f"some messages were not sent: {by_status} (see {LOG_DIR})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all sent after {timeout:.0f}s: {by_status} (see {LOG_DIR})")
            time.sleep(0.05)  # 20 cheap queries a second: negligible next to the measured load


# The final lines, `transactional_<key>: <median> <unit>`, in this order.
METRICS = [
    ("accept_per_s", "msgs/s"),
    ("e2e_per_s", "msgs/s"),
    ("latency_p50", "ms"),
    ("latency_p95", "ms"),
    ("latency_p99", "ms"),
    ("latency_max", "ms"),
    ("worker_peak_rss", "MB"),
]


def one_run(args: argparse.Namespace, env: dict[str, str], api_key: str, number: int) -> dict[str, Any]:
    # Same starting point for every run: empty tables, empty broker, fresh processes.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delivery_message, delivery_outboxevent CASCADE")
    redis.Redis.from_url(REDIS_URL).flushdb()
    sink = open_sink(args.sink)
    stack = Stack(env={**env, "SMTP_PORT": str(sink.port)}, log_dir=LOG_DIR)
    try:
        sink.start()
        web_port = free_port()
        groups = {
            "web": stack.start_web(web_port, workers=args.web_workers).popen.pid,
            "worker": stack.start("worker-transactional", timeout=60).popen.pid,
        }
        url = f"http://127.0.0.1:{web_port}/api/v1/messages"
        warm_ids, _, _ = post_messages(url, api_key, args.warmup, args.concurrency, f"warm-up {number}")
        wait_until_sent(warm_ids, args.timeout)

        cpu_before = {name: group_stats(pgid)[1] for name, pgid in groups.items()}
        sessions_before = db_sessions()
        ids, elapsed, api_ms = post_messages(url, api_key, args.messages, args.concurrency, f"run {number}")
        wait_until_sent(ids, args.timeout)
        cpu = {name: group_stats(pgid)[1] - cpu_before[name] for name, pgid in groups.items()}
        sessions = db_sessions() - sessions_before
        rss_kb, _ = group_stats(groups["worker"])
        with connection.cursor() as cursor:
            cursor.execute(
                """SELECT EXTRACT(EPOCH FROM sent_at - created_at) * 1000,
                          EXTRACT(EPOCH FROM created_at), EXTRACT(EPOCH FROM sent_at)
                     FROM delivery_message WHERE id = ANY(%s)""",
                [ids],
            )
            rows = [tuple(map(float, row)) for row in cursor.fetchall()]
    finally:
        stack.stop_all()
        received = sink.stop()
    if received != args.warmup + args.messages:  # the database said all were sent
        raise RuntimeError(f"the sink received {received} message(s), expected {args.warmup + args.messages}")
    latencies = sorted(r[0] for r in rows)
    return {
        "accept_per_s": args.messages / elapsed,
        "e2e_per_s": args.messages / (max(r[2] for r in rows) - min(r[1] for r in rows)),
        **{f"latency_p{p}": percentile(latencies, p) for p in (50, 95, 99)},
        "latency_max": latencies[-1],
        "worker_peak_rss": rss_kb / 1024,
        "api_p50": percentile(api_ms, 50),
        "api_p99": percentile(api_ms, 99),
        **{f"{name}_cpu_ms": seconds * 1000 / args.messages for name, seconds in cpu.items()},
        "db_sessions": sessions,
        "received": received,
        "sink": sink.name,
    }


def setup() -> tuple[dict[str, str], str]:
    """Create and migrate the bench database; return the processes' env and a fresh API key."""
    env = prepare(BENCH_DB, REDIS_URL)
    from delivery.authentication import create_api_key

    return env, create_api_key(f"bench-{time.time_ns()}")[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured messages first in each run")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads, a Session each")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--sink", choices=["postfix", "aiosmtpd"], default="postfix")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for all sent")
    args = parser.parse_args()
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    env, api_key = setup()
    print(
        f"database {BENCH_DB}, redis {REDIS_URL}, sink: {args.sink}, logs in {LOG_DIR}\n"
        f"{args.runs} run(s) of {args.messages} critical messages (+{args.warmup} warm-up each), "
        f"{args.concurrency} client threads, {args.web_workers} gunicorn workers"
    )
    runs: list[dict[str, Any]] = []
    for number in range(1, args.runs + 1):
        print(f"run {number}: load average {os.getloadavg()[0]:.2f} before start", flush=True)
        try:
            r = one_run(args, env, api_key, number)
        except SinkUnavailable as exc:
            print(
                f"Postfix smtp-sink is not available: {exc}\nRerun with --sink aiosmtpd to use the "
                "Python sink (`manage.py smtp_sink`, caps near 2,300 msgs/s) instead.",
                file=sys.stderr,
            )
            return 2
        runs.append(r)
        print(
            f"  {r['sink']} received {r['received']} (= database sent); accept {r['accept_per_s']:.0f} "
            f"msgs/s, end-to-end {r['e2e_per_s']:.0f} msgs/s\n"
            f"  accept->SMTP 250 latency p50 {r['latency_p50']:.1f} p95 {r['latency_p95']:.1f} "
            f"p99 {r['latency_p99']:.1f} max {r['latency_max']:.1f} ms; "
            f"API round trip p50 {r['api_p50']:.1f} p99 {r['api_p99']:.1f} ms\n"
            f"  CPU per message: web {r['web_cpu_ms']:.2f} ms, worker {r['worker_cpu_ms']:.2f} ms; "
            f"PostgreSQL sessions opened: {r['db_sessions']}; worker peak RSS {r['worker_peak_rss']:.0f} MB"
        )

    p99 = median(r["latency_p99"] for r in runs)
    print(
        f"median of {len(runs)} run(s), sink {runs[0]['sink']}: p99 {'meets' if p99 < 1000 else 'MISSES'} 1 s"
    )
    for key, unit in METRICS:
        print(f"transactional_{key}: {median(r[key] for r in runs):.0f} {unit}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        sys.exit(130)
