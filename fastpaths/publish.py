"""The outbox's fast publisher: Celery's protocol-2 task messages built here, over a kept producer.

Replaces: `Celery.send_task` (core.outbox.CeleryPublisher), which on every call runs its router,
a dozen configuration look-ups through Django's settings, merges the retry policy, resolves the
queue's exchange, walks the arguments with saferepr and kombu's JSON encoder; and, in the web
process, a producer acquired from Celery's pool per call, whose Redis channel makes a new
redis-py client (its response-callback table rebuilt) for every LPUSH.
Here the messages are built as `app.amqp.as_task_v2` and `send_task_message` build them, with what
is the same for every message of a queue worked out once; and a web thread keeps one producer
with one Redis client over the channel's connection pool (kombu's private `_create_client` and
`conn_or_acquire`).

Gain (bench/publish.py, docs/performance.md "Publishing"): 289–347 µs of CPU a task through
send_task, 132–161 µs built here; in the web process the kept producer took ~100 of the ~250 µs
a request's publish cost (profiled).

Pinned by: tests/test_outbox_messages.py (the messages equal send_task's, on Redis and RabbitMQ,
and a worker runs them), tests/test_outbox_kept_producer.py, and the outbox tests run with both
publishers (tests/conftest.py `publisher`). Not sent: Celery's before/after_task_publish
signals, which nothing here listens to; a task published from inside a task has no parent_id
(send_task would set the current task as its parent).

Off switch: leave `publish` out of EMAILHUB_FAST_PATHS (settings.EMAILHUB_OUTBOX_PUBLISHER then
names core.outbox.CeleryPublisher).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from celery.utils.nodenames import anon_nodename
from kombu.utils.uuid import uuid

from core.outbox import Publisher, Task
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@dataclass(frozen=True)
class _Route:
    queue_name: str
    queue: Any  # kombu.Queue
    exchange: str
    routing_key: str
    delivery_mode: int | str  # kombu maps "persistent"/"transient"


_routes: dict[str, _Route] = {}
# Channel → the queues declared on it; a new channel (a reconnect) starts empty.
_declared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _route(queue_name: str) -> _Route:
    """Where send_task_message would publish a task for `queue_name` (a direct exchange becomes
    the anonymous exchange with the queue's name as routing key), and the queue to declare."""
    route = _routes.get(queue_name)
    if route is None:
        queue = celery_app.amqp.queues[queue_name]  # created like send_task's if not configured
        exchange, routing_key = queue.exchange.name, queue.routing_key
        if queue.exchange.type == "direct":
            exchange, routing_key = "", queue_name
        delivery_mode = queue.exchange.delivery_mode or celery_app.conf.task_default_delivery_mode
        route = _Route(queue_name, queue, exchange, routing_key, delivery_mode)
        _routes[queue_name] = route
    return route


# The settings and task options that Celery.send_task would apply and these messages do not (none
# is set in this project): each would change the messages, so each is refused at start-up
# (core.E001) rather than ignored. Time limits are not here: a message without them runs under the
# task's and the worker's own. Nor are a task decorator's own priority, expires or compression,
# which send_task would also apply: the outbox's tasks set none (tests/test_outbox_messages.py).
_UNSUPPORTED_SETTINGS = {
    "task_routes": None,
    "task_compression": None,
    "task_protocol": 2,
    "task_send_sent_event": False,
    "task_default_priority": None,
    "task_inherit_parent_priority": False,
}

_origin: tuple[int, str] = (0, "")


def _origin_name() -> str:
    """send_task's `origin` header: this process's node name (a forked worker child has its own)."""
    global _origin
    pid = os.getpid()
    if _origin[0] != pid:
        _origin = (pid, anon_nodename())
    return _origin[1]


def _task_headers(task_name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "lang": "py",
        "task": task_name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        # The readable copies of the arguments, made with repr() and cut at Celery's 1,024
        # characters: Celery's own saferepr walk was a quarter of a publish's CPU (profiled).
        "argsrepr": _cut(repr(args)),
        "kwargsrepr": _cut(repr(kwargs)),
        "origin": _origin_name(),
        "ignore_result": None,  # send_task's: the task's own setting decides
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }


def _cut(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _KeptProducer(threading.local):
    producer: Any = None
    pid: int = 0


_kept = _KeptProducer()
_keep_per_thread = False


def keep_producer_per_thread() -> None:
    """Publish, in this process, through one producer per thread kept across calls (the web's,
    installed from emailhub/wsgi.py) instead of one acquired from Celery's pool per call.

    The kept producer has its own broker connection, outside the pool (so web threads can never
    exhaust the pool's limit), and, on Redis, one client over the channel's connection pool. A
    failed publish closes it (the outbox row stays for the relay); the next one reconnects.
    """
    global _keep_per_thread
    _keep_per_thread = True


def _new_kept_producer() -> Any:
    producer = celery_app.connection_for_write().Producer()
    channel: Any = producer.channel
    make_client = getattr(channel, "_create_client", None)
    if make_client is not None:  # kombu's Redis channel: one client instead of one per publish
        client = make_client()

        @contextmanager
        def conn_or_acquire(given: Any = None) -> Iterator[Any]:
            yield given or client

        channel.conn_or_acquire = conn_or_acquire
    return producer


@contextmanager
def _kept_producer() -> Iterator[Any]:
    producer = _kept.producer
    if producer is None or _kept.pid != os.getpid():  # none yet, or inherited across a fork
        producer = _new_kept_producer()
    _kept.producer, _kept.pid = None, os.getpid()
    try:
        yield producer
    except BaseException:
        try:
            producer.connection.close()
        except Exception:  # noqa: BLE001 - it is being thrown away; the error that matters propagates
            logger.debug("closing a failed publisher connection failed", exc_info=True)
        raise
    _kept.producer = producer


class ProtocolPublisher(Publisher):
    """The same messages as core.outbox.CeleryPublisher, built here (module docstring)."""

    def producer(self) -> AbstractContextManager[Any]:
        return _kept_producer() if _keep_per_thread else celery_app.producer_or_acquire()

    def configuration_problems(self) -> list[str]:
        return [
            f"CELERY_{name.upper()} is set to {getattr(celery_app.conf, name)!r}; the fast publisher "
            f"(fastpaths/publish.py) builds task messages itself and supports only {default!r}: "
            "unset it, or leave `publish` out of EMAILHUB_FAST_PATHS"
            for name, default in _UNSUPPORTED_SETTINGS.items()
            if getattr(celery_app.conf, name, default) != default
        ]

    def send(self, task: Task, producer: Any) -> None:
        route = _route(task.queue)
        # The queue declared once per channel, as kombu's maybe_declare would (it caches per
        # connection too, but binds a copy of the queue to the channel on every call first: 4% of
        # an accepted request's CPU in py-spy).
        declared = _declared.setdefault(producer.channel, set())
        if route.queue_name not in declared:
            producer.maybe_declare(route.queue)
            declared.add(route.queue_name)
        task_id = uuid()
        producer.publish(
            # Payloads come from JSON (the outbox's jsonb column, or are stored there), so the
            # standard library's encoder is enough; kombu's walks every value for its own types.
            json.dumps([task.args, task.kwargs, _EMBED]),
            exchange=route.exchange,
            routing_key=route.routing_key,
            content_type="application/json",
            content_encoding="utf-8",
            retry=False,
            delivery_mode=route.delivery_mode,
            headers=_task_headers(task.name, task_id, task.args, task.kwargs),
            correlation_id=task_id,
            reply_to=celery_app.thread_oid,
        )
