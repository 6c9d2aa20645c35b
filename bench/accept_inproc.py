"""In-process accept benchmark: CPU per accepted message of the WSGI application alone.

    .venv/bin/python bench/accept_inproc.py [--requests 2000] [--rounds 3]

bench/transactional.py measures the accept path through gunicorn and HTTP clients, where the
server, the clients and the other processes share the two cores. This one calls each WSGI
application directly from one thread, as gunicorn's worker would (same environ keys, a real body,
the real database and broker), so what it prints is the application's own CPU per request:
- `emailhub`: emailhub.wsgi.application, `POST /api/v1/messages` with a Bearer API key, critical
  messages (one INSERT with its outbox row, the publish to Redis, the outbox DELETE);
- `reference`: bench/reference/app.py's view (one INSERT, 202 JSON), the same body.
Each runs in a process of its own (two Django settings modules), `--rounds` times alternately,
after `--warmup` unmeasured requests. CPU is the process's (time.process_time: user + system,
C extensions included) over the measured requests; wall time is printed beside it.

Databases: `emailhub_bench_inproc` (created and migrated if missing) and transactional.py's
reference database, Redis database 13 (BENCH_INPROC_REDIS_URL) as database and broker; the tasks
it publishes are deleted at the end. The last lines are the medians, one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.common import bench_database  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_inproc")
REFERENCE_DB = bench_database("emailhub_bench_reference")
REDIS_URL = os.environ.get("BENCH_INPROC_REDIS_URL", "redis://127.0.0.1:6379/13")


def body(n: int) -> bytes:
    return json.dumps(
        {"to": f"inproc{n}@example.com", "subject": "Your code", "text": "123456", "priority": "critical"}
    ).encode()


def child(which: str, requests: int, warmup: int) -> None:
    """Call the application `requests` times after `warmup`; print one JSON line of figures."""
    headers: dict[str, str] = {}
    if which == "reference":
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.reference.settings"
        os.environ["REFERENCE_DATABASE"] = REFERENCE_DB
        import psycopg2

        from bench.reference import TABLE_SQL

        db = psycopg2.connect(dbname=REFERENCE_DB, user="postgres", host="127.0.0.1")
        with db, db.cursor() as cursor:
            cursor.execute(TABLE_SQL)
        db.close()
        from bench.reference.app import application
    else:
        import django

        django.setup()  # before the models' modules; emailhub.wsgi's own setup is then a no-op
        from delivery.authentication import create_api_key
        from emailhub.wsgi import application

        headers["HTTP_AUTHORIZATION"] = f"Bearer {create_api_key(f'inproc-{time.time_ns()}')[1]}"

    def call(n: int) -> None:
        payload = body(n)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/api/v1/messages",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8000",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(payload),
            "wsgi.errors": sys.stderr,
            "CONTENT_LENGTH": str(len(payload)),
            "CONTENT_TYPE": "application/json",
            **headers,
        }
        status: list[str] = []
        answer = b"".join(application(environ, lambda s, h, exc=None: status.append(s)))
        if not status[0].startswith("202"):
            raise RuntimeError(f"{which}: {status[0]} {answer[:300]!r}")

    for n in range(warmup):
        call(n)
    cpu, wall = time.process_time(), time.perf_counter()
    for n in range(requests):
        call(n)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu_us": cpu / requests * 1e6, "wall_us": wall / requests * 1e6}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--child", choices=["emailhub", "reference"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.requests, args.warmup)
        return 0

    from bench.lib.common import prepare

    env = prepare(BENCH_DB, REDIS_URL)  # and CELERY_BROKER_URL: the same Redis database
    subprocess.run(
        [sys.executable, "scripts/ensure_db.py"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{REFERENCE_DB}"},
        check=True,
    )
    import redis

    results: dict[str, list[dict[str, float]]] = {"emailhub": [], "reference": []}
    try:
        for number in range(args.rounds):
            order = ["reference", "emailhub"] if number % 2 == 0 else ["emailhub", "reference"]
            for which in order:
                load = os.getloadavg()[0]
                out = subprocess.run(
                    [sys.executable, __file__, "--child", which, "--requests", str(args.requests),
                     "--warmup", str(args.warmup)],
                    cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True, text=True,
                )  # fmt: skip
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                results[which].append(figures)
                print(
                    f"round {number + 1} {which} (load {load:.2f}): {figures['cpu_us']:.0f} µs CPU, "
                    f"{figures['wall_us']:.0f} µs wall per request",
                    flush=True,
                )
    finally:
        redis.Redis.from_url(REDIS_URL).flushdb()
    cpu = {which: median(r["cpu_us"] for r in runs) for which, runs in results.items()}
    wall = {which: median(r["wall_us"] for r in runs) for which, runs in results.items()}
    print(f"inproc_emailhub_cpu_us: {cpu['emailhub']:.0f} us")
    print(f"inproc_reference_cpu_us: {cpu['reference']:.0f} us")
    print(f"inproc_emailhub_wall_us: {wall['emailhub']:.0f} us")
    print(f"inproc_reference_wall_us: {wall['reference']:.0f} us")
    print(f"inproc_cpu_ratio: {cpu['emailhub'] / cpu['reference']:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
