"""Tracking benchmark: open-pixel and click hits against a real gunicorn web process.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/tracking.py [--hits 20000] [--concurrency 8] [--web-workers 2]
        [--client raw|requests] [--django-only] [--sync-worker]

It starts, and always stops (also on error or Ctrl-C), a database of its own
(`emailhub_bench_tracking`, created and migrated if missing), Redis database 9 and gunicorn (the
`web` command of scripts/stack.py; `--django-only` serves Django's application without the
WSGI fast path, `--sync-worker` drops `--worker-class gthread`: the two ways to measure what a
hit cost before). Tokens are made before the clock starts; half the hits are opens
(`GET /t/o/<token>`, 200 image/gif), half clicks (`GET /t/c/<token>`, 302, not followed), on
`--concurrency` keep-alive connections: by default one asyncio loop writing prepared requests
(cheap, so the figure is the server's), or with `--client requests` a requests.Session per
thread (about 1 ms of client CPU per hit, which then sets the rate). The client's CPU time is
printed beside the wall time.

What it measures:
- hits/s: hits answered / wall time of the client loop, and request p50/p99 (client side);
- that no hit INSERTs (the event table is empty after the client loop: the hits are in Redis);
- the drain: `drain_hits` in this process, hits recorded per second, and INSERT statements per
  batch (one per EMAILHUB_TRACKING_DRAIN_BATCH hits).
The client shares the 2 cores with gunicorn, so the hit rate is a floor. The last lines
are `tracking_<metric>: value unit`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402

from bench.lib.common import LOG_DIR, bench_database, prepare, run_clients  # noqa: E402
from bench.lib.smtp_sink import free_port  # noqa: E402
from bench.lib.stats import percentile  # noqa: E402
from scripts.stack import PROCESSES, Stack, with_option  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_tracking")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
BROWSER = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko)"


def hit_all(base: str, paths: list[str], concurrency: int) -> tuple[float, list[float]]:
    request_ms, errors = [0.0] * len(paths), []
    indexes = itertools.count()

    def client() -> None:
        with requests.Session() as session:
            session.headers["User-Agent"] = BROWSER
            while not errors and (i := next(indexes)) < len(paths):
                started = time.perf_counter()
                response = session.get(base + paths[i], allow_redirects=False, timeout=30)
                request_ms[i] = (time.perf_counter() - started) * 1000
                if response.status_code not in (200, 302):
                    errors.append(f"HTTP {response.status_code} for {paths[i][:40]}")

    elapsed = run_clients(client, concurrency)
    if errors:
        raise RuntimeError(errors[0])
    return elapsed, sorted(request_ms)


def hit_all_raw(base: str, paths: list[str], concurrency: int) -> tuple[float, list[float]]:
    """`concurrency` keep-alive connections on one asyncio loop, each request prepared as bytes
    beforehand; a connection the server closes (`Connection: close`) is reopened."""
    host, port = base.removeprefix("http://").split(":")
    requests_bytes = [
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {BROWSER}\r\n\r\n".encode() for path in paths
    ]
    request_ms = [0.0] * len(paths)
    indexes = iter(range(len(paths)))

    async def client() -> None:
        reader = writer = None
        for i in indexes:
            started = time.perf_counter()
            if writer is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(requests_bytes[i])
            head = (await reader.readuntil(b"\r\n\r\n")).lower()
            status = int(head[9:12])
            if status not in (200, 302):
                raise RuntimeError(f"HTTP {status} for {paths[i][:40]}")
            length = (
                int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                if b"content-length:" in head
                else 0
            )
            await reader.readexactly(length)
            if b"connection: close" in head:
                writer.close()
                reader = writer = None
            request_ms[i] = (time.perf_counter() - started) * 1000
        if writer is not None:
            writer.close()

    async def clients() -> None:
        await asyncio.gather(*(client() for _ in range(concurrency)))

    started = time.perf_counter()
    asyncio.run(clients())
    return time.perf_counter() - started, sorted(request_ms)


def start_web(stack: Stack, port: int, workers: int, *, django_only: bool, sync_worker: bool) -> None:
    """The web command of scripts/stack.py; with `django_only`, Django's own application instead
    of emailhub.wsgi's fast-path wrapper, and with `sync_worker`, without `--worker-class gthread
    --threads N` (gunicorn's default sync worker, which closes every connection): what a hit cost
    before each change."""
    argv = ["emailhub.wsgi:django_application" if django_only and arg == "emailhub.wsgi" else arg
            for arg in PROCESSES["web"]]  # fmt: skip
    if sync_worker:
        for option in ("--worker-class", "--threads"):
            at = argv.index(option)
            del argv[at : at + 2]
    argv = with_option(with_option(argv, "--bind", f"127.0.0.1:{port}"), "--workers", str(workers))
    url = f"http://127.0.0.1:{port}/healthz"

    def ready(_: object) -> bool:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)

    stack.start("web", argv, ready=ready)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hits", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument(
        "--django-only",
        action="store_true",
        help="serve Django's application without the WSGI fast path (the views, all middleware)",
    )
    parser.add_argument("--sync-worker", action="store_true", help="gunicorn's sync worker, not gthread")
    parser.add_argument(
        "--client",
        choices=("raw", "requests"),
        default="raw",
        help="raw: one asyncio loop writing prepared requests on keep-alive connections (cheap, so the "
        "figure is the server's); requests: a requests.Session per thread (about 1 ms of client CPU per hit)",
    )
    args = parser.parse_args()

    env = prepare(BENCH_DB, REDIS_URL)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from delivery.services.tracking import drain_hits
    from delivery.tracking.tokens import click_token, open_token

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delivery_emailevent, delivery_message CASCADE")
        cursor.execute(
            """INSERT INTO delivery_message (to_email, priority, status, sent_at, attempts, created_at)
               SELECT 'user' || n || '@example.com', 'normal', 'sent', now() - interval '1 hour', 1, now()
                 FROM generate_series(1, %s) AS n RETURNING id""",
            [args.messages],
        )
        ids = [row[0] for row in cursor.fetchall()]
    redis.Redis.from_url(REDIS_URL).flushdb()
    paths = [
        f"/t/o/{open_token(ids[n % len(ids)])}"
        if n % 2
        else f"/t/c/{click_token(ids[n % len(ids)], n % 5, f'https://shop.example.com/p/{n % 5}')}"
        for n in range(args.hits)
    ]
    stack = Stack(env=env, log_dir=LOG_DIR)
    try:
        port = free_port()
        start_web(stack, port, args.web_workers, django_only=args.django_only, sync_worker=args.sync_worker)
        base = f"http://127.0.0.1:{port}"
        run = hit_all if args.client == "requests" else hit_all_raw
        run(base, paths[:500], args.concurrency)  # warm-up: imports, connections
        redis.Redis.from_url(REDIS_URL).flushdb()
        cpu_started = time.process_time()
        elapsed, request_ms = run(base, paths, args.concurrency)
        client_cpu = time.process_time() - cpu_started
    finally:
        stack.stop_all()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_emailevent")
        rows_after_hits = cursor.fetchone()[0]
    queued = redis.Redis.from_url(REDIS_URL).llen("emailhub:tracking:hits")
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as queries:
        report = drain_hits(budget_seconds=3600)
    drain_elapsed = time.perf_counter() - started
    inserts = sum(1 for q in queries.captured_queries if "INSERT INTO delivery_emailevent" in q["sql"])

    served = "Django only (no fast path)" if args.django_only else "emailhub.wsgi (fast path)"
    worker = "sync" if args.sync_worker else "gthread"
    print(
        f"hits {args.hits}, {args.client} client, concurrency {args.concurrency}, "
        f"{args.web_workers} gunicorn {worker} workers, {served}"
    )
    print(f"client CPU during the hits: {client_cpu:.1f} s of {elapsed:.1f} s wall")
    print(f"event rows written during the hits: {rows_after_hits}; hits queued in Redis: {queued}")
    print(
        f"drain: {report.hits} hits in {report.batches} batches, {inserts} INSERTs, {report.recorded} recorded"
    )
    print(f"tracking_hits_per_s: {args.hits / elapsed:.0f} hits/s")
    print(f"tracking_request_p50: {percentile(request_ms, 50):.2f} ms")
    print(f"tracking_request_p99: {percentile(request_ms, 99):.2f} ms")
    print(f"tracking_drain_per_s: {report.hits / drain_elapsed:.0f} hits/s")
    print(f"tracking_inserts_per_1000_hits: {inserts * 1000 / max(report.hits, 1):.1f} statements")


if __name__ == "__main__":
    main()
