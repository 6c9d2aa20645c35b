"""What every benchmark does first: a database and a Redis database of its own, migrated (and,
for the benches that empty them at every run, claimed so that nothing else shares them)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import django
import redis
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
# The processes' logs of every bench that starts a Stack.
LOG_DIR = ROOT / "bench" / ".cache" / "logs"


def bench_database(name: str) -> str:
    """A bench's database name with BENCH_DATABASE_SUFFIX appended (`_h3`, say), so that two
    people's benches on one PostgreSQL server never share a database."""
    return name + os.environ.get("BENCH_DATABASE_SUFFIX", "")


def bench_env(database: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of every process of a bench: its own database and Redis database."""
    # The server and user of DATABASE_URL (or the project default), with the bench database.
    base = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/emailhub")
    return {
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "DATABASE_URL": urlunsplit(base._replace(path=f"/{database}")),
        "REDIS_URL": redis_url,
        # The broker named in the environment (RabbitMQ: amqp://…), else the bench's Redis database.
        "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL") or redis_url,
        **extra,
    }


def prepare(database: str, redis_url: str, **extra: str) -> dict[str, str]:
    """Create and migrate the bench database, point this process (Django) at it; return the env."""
    env = bench_env(database, redis_url, **extra)
    child_env = {**os.environ, **env}
    for argv in (["scripts/ensure_db.py"], ["manage.py", "migrate", "--noinput", "-v0"]):
        subprocess.run([sys.executable, *argv], cwd=ROOT, env=child_env, check=True)
    os.environ.update(env)  # this process reads and writes the same database and Redis
    django.setup()
    return env


def prepare_alone(database: str, redis_url: str) -> dict[str, str]:
    """prepare(), then claim_bench(): for a bench that empties its tables and Redis every run."""
    env = prepare(database, redis_url)
    claim_bench(redis_url)
    return env


# Session-level advisory lock key ("BENCH") held while a bench runs in its database.
_BENCH_LOCK = 0x42454E4348


def claim_bench(redis_url: str) -> None:
    """Refuse to run while anything else uses this bench's database or Redis database.

    Every run truncates tables and flushes Redis: sharing them with another run (of this bench
    or any other) would corrupt both silently. The advisory lock stays held by this process's
    connection until it exits, so a second run of the same bench fails here at once.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_BENCH_LOCK])
        if not cursor.fetchone()[0]:
            raise RuntimeError(f"another run holds database {connection.settings_dict['NAME']}: wait for it")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        sessions = int(cursor.fetchone()[0])
    client = redis.Redis.from_url(redis_url)
    own, db = client.client_id(), client.connection_pool.connection_kwargs.get("db", 0)
    others = [c for c in client.client_list() if int(c["db"]) == db and int(c["id"]) != own]
    client.close()
    if sessions or others:
        raise RuntimeError(
            f"{sessions} other PostgreSQL session(s) on {connection.settings_dict['NAME']} and "
            f"{len(others)} other client(s) on Redis database {db}: something else is using them "
            "(left-over workers? another bench?); stop it first"
        )


def run_clients(client: Callable[[], None], concurrency: int) -> float:
    """Run `client` on `concurrency` threads at once; the seconds until the last one finished."""
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started
