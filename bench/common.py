"""What every benchmark does first: a database and a Redis database of its own, migrated."""

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

ROOT = Path(__file__).resolve().parent.parent


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


def run_clients(client: Callable[[], None], concurrency: int) -> float:
    """Run `client` on `concurrency` threads at once; the seconds until the last one finished."""
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started
