"""The Redis clients of a process: one per use, each with the timeouts that use can afford.

Every module that talks to Redis (REDIS_URL) asks here for the client of its use instead of
keeping its own: a process has one connection pool per use, the timeouts are chosen in one
place, and `reset()` forgets them all (a forked Celery child must not share its parent's
sockets; tests switch databases).

- `send_path()`: what a send or a tracking hit waits on (breakers, rate limits, probes, the
  tracking queue, SES's certificate cache). Redis trouble must cost it milliseconds, never
  seconds: 0.5 s to connect and per command, and a PING before reusing a connection idle for
  30 s (a Redis restart then costs one failed command, not one per pooled connection).
- `schedule()`: the schedule index (core/schedule_index.py). A claim or an add is worth a few
  seconds (the scheduler's own loop, a commit's hook): 2 s to connect, 5 s per command.
- `pages()`: the operator's pages (the dashboard's rates and shared refresh): a second, then the
  page shows what it has.

The broker's connections are kombu's (CELERY_BROKER_URL), not these.
"""

from __future__ import annotations

import redis as redis_lib
from django.conf import settings

_clients: dict[str, redis_lib.Redis] = {}


def _client(use: str, **timeouts: float) -> redis_lib.Redis:
    client = _clients.get(use)
    if client is None:
        client = _clients[use] = redis_lib.Redis.from_url(settings.REDIS_URL, **timeouts)  # type: ignore[arg-type]
    return client


def send_path() -> redis_lib.Redis:
    return _client("send_path", socket_timeout=0.5, socket_connect_timeout=0.5, health_check_interval=30)


def schedule() -> redis_lib.Redis:
    return _client("schedule", socket_timeout=5, socket_connect_timeout=2)


def pages() -> redis_lib.Redis:
    return _client("pages", socket_timeout=1, socket_connect_timeout=1)


def fresh(timeout: float) -> redis_lib.Redis:
    """A client of its own (the caller closes it), for a probe that must not reuse a pooled
    connection: the readiness check."""
    return redis_lib.Redis.from_url(
        settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )


def reset() -> None:
    """Close and forget every client of this process (after fork, or between tests)."""
    for client in _clients.values():
        client.close()
    _clients.clear()
