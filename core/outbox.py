"""The transactional outbox: a task is recorded with the change it announces, published after commit.

On the normal path the task goes to the broker right after the commit and its outbox row is
deleted, so latency stays low. If the process dies between commit and publish, or the broker
is unreachable, the row stays and the relay (a beat task every second) publishes it.
Publishing twice is harmless: every task starts with a conditional claim in PostgreSQL.

The outbox names no app's task: each app registers its event kinds from its AppConfig.ready
(`register_kind`), saying which task a kind publishes, with which arguments, on which queue.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.utils.nodenames import anon_nodename
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone
from kombu.utils.uuid import uuid

from core.models import OutboxEvent
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

Payload = dict[str, Any]


@dataclass(frozen=True)
class EventKind:
    """How an outbox row of one kind becomes a task: its name, arguments and queue."""

    task_name: str
    args: Callable[[Payload], list[Any]]
    queue: Callable[[Payload], str]
    kwargs: Callable[[Payload], dict[str, Any]] | None = None


_kinds: dict[str, EventKind] = {}


def register_kind(
    kind: str,
    task_name: str,
    *,
    args: Callable[[Payload], list[Any]],
    queue: Callable[[Payload], str],
    kwargs: Callable[[Payload], dict[str, Any]] | None = None,
) -> None:
    """Say how events of `kind` are published. Registering a kind again with the same task
    replaces it (AppConfig.ready may run twice in tests); another task for it is a mistake."""
    if len(kind) > OutboxEvent._meta.get_field("kind").max_length:  # type: ignore[operator]
        raise ValueError(f"outbox event kind {kind!r} is longer than the kind column")
    known = _kinds.get(kind)
    if known is not None and known.task_name != task_name:
        raise ValueError(f"outbox event kind {kind!r} is already registered for {known.task_name}")
    _kinds[kind] = EventKind(task_name, args, queue, kwargs)


def registered_kinds() -> dict[str, str]:
    """Each registered kind and the task it publishes."""
    return {kind: spec.task_name for kind, spec in _kinds.items()}


def _publish(kind: str, payload: Payload, producer: Any) -> None:
    spec = _kinds.get(kind)
    if spec is None:
        raise ValueError(f"unknown outbox event kind {kind!r}")
    args = spec.args(payload)
    kwargs = spec.kwargs(payload) if spec.kwargs is not None else {}
    route = _route(spec.queue(payload))
    # The queue declared once per channel, as kombu's maybe_declare would (it caches per
    # connection too, but binds a copy of the queue to the channel on every call first: 4% of an
    # accepted request's CPU in py-spy).
    declared = _declared.setdefault(producer.channel, set())
    if route.queue_name not in declared:
        producer.maybe_declare(route.queue)
        declared.add(route.queue_name)
    task_id = uuid()
    producer.publish(
        # Payloads come from JSON (the outbox's jsonb column, or are stored there), so the
        # standard library's encoder is enough; kombu's walks every value for its own types.
        json.dumps([args, kwargs, _EMBED]),
        exchange=route.exchange,
        routing_key=route.routing_key,
        content_type="application/json",
        content_encoding="utf-8",
        retry=False,
        delivery_mode=route.delivery_mode,
        headers=_task_headers(spec.task_name, task_id, args, kwargs),
        correlation_id=task_id,
        reply_to=celery_app.thread_oid,
    )


# The task messages are Celery's protocol 2, built here as `Celery.send_task` builds them
# (`app.amqp.as_task_v2`, then `send_task_message`'s routing), with what is the same for every
# message of a queue worked out once. send_task did that work on every call: its router, a
# dozen configuration look-ups through Django's settings, the retry policy merged, the queue's
# exchange resolved, kombu's JSON encoder walking the arguments (bench/publish.py, kept producer:
# 289–347 µs of CPU a task through send_task, 132–161 µs built here).
# tests/test_outbox_messages.py checks the messages against send_task's own, on Redis and on
# RabbitMQ. Not sent: Celery's before/after_task_publish signals, which nothing here listens to.
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


# The settings and task options that Celery.send_task would apply and _publish does not (none
# is set in this project): each would change the messages, so each is refused at start-up
# (core/checks.py) rather than ignored.
_UNSUPPORTED_SETTINGS = {
    "task_routes": None,
    "task_compression": None,
    "task_protocol": 2,
    "task_send_sent_event": False,
    "task_default_priority": None,
    "task_inherit_parent_priority": False,
}
# Time limits are not here: a message without them runs under the task's and the worker's own.
# Nor are a task decorator's own priority, expires or compression, which send_task would also
# apply: the outbox's tasks set none (tests/test_outbox_messages.py compares the messages).


def unsupported_publish_settings() -> list[str]:
    """What the configuration asks of a publish that core.outbox's own messages would not do."""
    return [
        f"CELERY_{name.upper()} is set to {getattr(celery_app.conf, name)!r}; core.outbox builds task "
        f"messages itself and supports only {default!r} (core/outbox.py _publish)"
        for name, default in _UNSUPPORTED_SETTINGS.items()
        if getattr(celery_app.conf, name, default) != default
    ]


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


# Events per broker round trip where the transport batches publishes (kombu's Redis transport
# pipelines the LPUSHes; RabbitMQ publishes each at once). One round trip per task was what made
# the scheduler late: publishing the 550 tasks of 1,000 due messages took 2.4 s of a 2.6 s dispatch
# whose CPU was 0.56 s, the rest waiting on the socket on a loaded machine; pipelined, the whole
# dispatch took 1.15 s (profiled; bench/scheduler.py, docs/performance.md).
PUBLISH_BATCH = 500


class _KeptProducer(threading.local):
    producer: Any = None
    pid: int = 0


_kept = _KeptProducer()
_keep_per_thread = False


def keep_producer_per_thread() -> None:
    """Publish, in this process, through one producer per thread kept across calls (the web's,
    installed from emailhub/wsgi.py) instead of one acquired from Celery's pool per call.

    Acquiring from the pool, and kombu's Redis channel making a new redis-py client for every
    LPUSH (its response-callback table rebuilt each time), were ~100 of the ~250 µs of CPU a
    request's publish took (profiled). The kept producer has its own broker connection, outside
    the pool (so web threads can never exhaust the pool's limit), and, on Redis, one client over
    the channel's connection pool. The messages are the same `send_task` messages. A failed
    publish closes it (the outbox row stays for the relay, as before); the next one reconnects.
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
def _producer() -> Iterator[Any]:
    if not _keep_per_thread:
        with celery_app.producer_or_acquire() as producer:
            yield producer
        return
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


def _publish_all(events: list[tuple[int, str, Payload]], published: list[int]) -> None:
    """Publish over one producer connection, appending each id that went out to `published`;
    a failure stops the loop and propagates, `published` still says what went out. In a batch
    an event counts as out once its batch is flushed: a failed batch is left to the relay whole
    (an event of it that did go out is published twice, which is harmless)."""
    with _producer() as producer:
        # One event (a web request's) is one LPUSH without a pipeline: the same round trip,
        # less CPU.
        if len(events) == 1 or not producer.supports_batch_publish:
            for event_id, kind, payload in events:
                _publish(kind, payload, producer)
                published.append(event_id)
            return
        for start in range(0, len(events), PUBLISH_BATCH):
            chunk = events[start : start + PUBLISH_BATCH]
            # Room for a queue's expiry commands too (LPUSH + a PEXPIRE per priority step).
            with producer.batch(max_size=PUBLISH_BATCH * 16):
                for _, kind, payload in chunk:
                    _publish(kind, payload, producer)
            published.extend(event_id for event_id, _, _ in chunk)


def _publish_after_commit(events: list[tuple[int, str, Payload]]) -> None:
    published: list[int] = []
    try:
        _publish_all(events, published)
    except Exception as exc:  # noqa: BLE001 - the relay publishes what we could not
        logger.warning("publishing %d outbox event(s) failed (%s); the relay will retry", len(events), exc)
    if published:
        _delete(published)


# The DELETE commits with synchronous_commit off (set_config(…, true): for its own transaction
# only). It records nothing that must survive a PostgreSQL crash: a lost DELETE leaves rows whose
# tasks went out, and the relay publishes them again, which the conditional claims make
# harmless. The accept path's own commit stays synchronous. Without this the web waited for two
# WAL flushes per accepted message (the INSERT's and the DELETE's) where the reference waits for
# one: the combined INSERT and the DELETE were 54% and 23% of a request's wall time in py-spy.
_DELETE_SQL = """
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM delivery_outboxevent WHERE id = ANY(%s) AND EXISTS (SELECT FROM relaxed)
"""


def _delete(event_ids: list[int]) -> None:
    # Plain SQL: QuerySet.delete() runs Django's deletion collector, ~1 ms per request here for
    # a table nothing references (profiled on POST /api/v1/messages).
    with connection.cursor() as cursor:
        cursor.execute(_DELETE_SQL, [event_ids])


def record_many(events: list[tuple[str, Payload]], *, publisher: Executor | None = None) -> None:
    """Record events in the caller's transaction (one INSERT) and publish them after it commits.

    With `publisher` (an executor), publishing happens on its thread, so the caller can go on
    with its next transaction meanwhile (fan-out does); the caller waits for the executor before
    it finishes. A crash before they are published leaves the rows to the relay, as always.
    """
    if not events:
        return
    for kind, _ in events:
        if kind not in _kinds:
            # Refused before the row exists: the relay could never publish it.
            raise ValueError(f"unknown outbox event kind {kind!r}")
    rows = OutboxEvent.objects.bulk_create(
        [OutboxEvent(kind=kind, payload=payload) for kind, payload in events]
    )
    pending = [(row.pk, row.kind, row.payload) for row in rows]
    if publisher is None:
        transaction.on_commit(lambda: _publish_after_commit(pending))
    else:
        transaction.on_commit(lambda: publisher.submit(_publish_after_commit, pending))


def record(kind: str, payload: Payload) -> None:
    record_many([(kind, payload)])


def insert_with_event(
    statement: str, params: Sequence[Any], kind: str, payload_sql: str, payload_params: Sequence[Any] = ()
) -> tuple[Any, ...] | None:
    """Run the caller's `INSERT … RETURNING …` and record one event of `kind` in the same SQL
    statement, then publish it after commit as record_many does. Returns the statement's row, or
    None (and records nothing) when it inserted none.

    `payload_sql` is the event's JSON payload as a SQL expression over the returned columns,
    which it names `inserted` (e.g. `jsonb_build_object('id', inserted.id, 'n', %s)` with
    `payload_params` `[3]`). One statement is
    one round trip, and outside a transaction (autocommit) it is its own transaction: the row
    and its event commit together without BEGIN, SAVEPOINT or COMMIT (POST /api/v1/messages:
    8 round trips became 3 with the health check and the DELETE, docs/architecture.md).
    """
    if kind not in _kinds:
        raise ValueError(f"unknown outbox event kind {kind!r}")
    sql = (
        f"WITH inserted AS ({statement}), event AS ("
        f"INSERT INTO delivery_outboxevent (kind, payload) SELECT %s, {payload_sql} FROM inserted"
        " RETURNING id, payload::text) SELECT inserted.*, event.* FROM inserted, event"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, kind, *payload_params])
        found = cursor.fetchone()
    if found is None:
        return None  # the caller's INSERT inserted nothing (ON CONFLICT DO NOTHING): no event
    *row, event_id, payload = found
    pending = [(event_id, kind, json.loads(payload))]
    transaction.on_commit(lambda: _publish_after_commit(pending))
    return tuple(row)


def oldest_pending(kind: str) -> datetime | None:
    """When the oldest unpublished event of `kind` was recorded (None: none is waiting)."""
    return OutboxEvent.objects.filter(kind=kind).aggregate(oldest=Min("created_at"))["oldest"]


def relay(limit: int = 500) -> int:
    """Publish outbox rows that were committed but not published; return how many went out."""
    cutoff = timezone.now() - timedelta(seconds=settings.EMAILHUB_OUTBOX_GRACE_SECONDS)
    with transaction.atomic():
        events = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(created_at__lte=cutoff)
            .order_by("id")
            .values_list("id", "kind", "payload")[:limit]
        )
        published: list[int] = []
        try:
            _publish_all(events, published)
        except Exception as exc:  # noqa: BLE001 - leave the rest for the next tick
            logger.warning("outbox relay stopped after %d event(s): %s", len(published), exc)
        if published:
            _delete(published)
    if published:
        logger.info("outbox relay published %d event(s)", len(published))
    return len(published)
