"""Reading Celery messages straight out of the Redis broker, to see what was published; pointing this
process at an unreachable broker, or at a RabbitMQ vhost of its own."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis as redis_lib
from kombu import pools

from emailhub.celery import app


def queued_tasks(client: redis_lib.Redis, queue: str, *, probes: bool = False) -> list[tuple[str, list[Any]]]:
    """(task name, args) of every message waiting in `queue`, oldest first; the reconciler's
    queue probes (delivery.queue_probe) only with `probes`."""
    tasks = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # kombu LPUSHes and BRPOPs
        envelope = json.loads(raw)
        body = json.loads(base64.b64decode(envelope["body"]))
        if probes or envelope["headers"]["task"] != "delivery.queue_probe":
            tasks.append((envelope["headers"]["task"], body[0]))
    return tasks


def reset_broker_connections() -> None:
    """Drop the cached broker connection and producer pools, so the next publish connects to
    `broker_write_url` as it is set now. Celery has no public call for it (`app.close()` also
    deregisters the app and keeps the producer pool), so this does what Celery does after a fork
    (`Celery._after_fork`); tests only."""
    pools.reset()  # kombu's global registry of pools, keyed by connection
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def broker_unreachable() -> Iterator[None]:
    """Point this process's Celery app at a port where nothing listens, then restore it."""
    original = app.conf.broker_write_url
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"
    reset_broker_connections()
    try:
        yield
    finally:
        app.conf.broker_write_url = original
        reset_broker_connections()


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


@contextmanager
def rabbit_broker() -> Iterator[tuple[str, str]]:
    """A vhost of our own on the local RabbitMQ, this process's Celery app pointed at it; removed
    after. Yields (broker URL, vhost)."""
    vhost = f"emailhub_test_{uuid.uuid4().hex[:8]}"
    try:
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"RabbitMQ not manageable here: {exc}")
    url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    original = (app.conf.broker_url, app.conf.broker_write_url, app.conf.broker_read_url)
    app.conf.broker_url = app.conf.broker_write_url = app.conf.broker_read_url = url
    reset_broker_connections()
    try:
        yield url, vhost
    finally:
        app.conf.broker_url, app.conf.broker_write_url, app.conf.broker_read_url = original
        reset_broker_connections()
        rabbitmqctl("delete_vhost", vhost)
