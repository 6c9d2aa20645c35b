"""The transactional outbox: a task is recorded with the change it announces, published after commit.

On the normal path the task goes to the broker right after the commit and its outbox row is
deleted, so latency stays low. If the process dies between commit and publish, or the broker
is unreachable, the row stays and the relay (a beat task every second) publishes it.
Publishing twice is harmless: every task starts with a conditional claim in PostgreSQL.

The outbox names no app's task: each app registers its task kinds from its AppConfig.ready
(`register_kind`), saying which task a kind publishes, with which arguments, on which queue.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone
from django.utils.module_loading import import_string
from redis.exceptions import NoScriptError, RedisError

from core import redis_clients
from core.models import OutboxTask
from core.sql import execute_prepared
from emailhub.celery import app as celery_app

logger = logging.getLogger(__name__)

Payload = dict[str, Any]


@dataclass(frozen=True)
class Doorbell:
    """A task that announces work waiting, not one row's work: while one such task is on the broker
    or running, another would do nothing the first will not, so it is not published. The first
    publisher sets `key` in Redis (expiring after `seconds`); a later one, finding it set, pushes
    a wake-up onto `key:wake` instead, which a running task may wait on for more work. The task
    deletes both when it has found nothing more, then looks once more (delivery's send_tasks
    `answer`). A task lost with its key set costs at most `seconds` before the next publisher
    rings again."""

    key: str
    seconds: float

    @property
    def wake_key(self) -> str:
        return f"{self.key}:wake"


# One round trip per doorbell: set it (the caller publishes its task), or, already set, push one
# wake-up (at most one is kept: it only says "claim again").
_RING = """
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return 1 end
redis.call('LPUSH', KEYS[2], 1)
redis.call('LTRIM', KEYS[2], 0, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 0
"""
_RING_SHA = hashlib.sha1(_RING.encode()).hexdigest()


@dataclass(frozen=True)
class TaskKind:
    """How an outbox row of one kind becomes a task: its name, arguments and queue, and for a
    payload that only announces waiting work, its doorbell."""

    task_name: str
    args: Callable[[Payload], list[Any]]
    queue: Callable[[Payload], str]
    kwargs: Callable[[Payload], dict[str, Any]] | None = None
    doorbell: Callable[[Payload], Doorbell | None] | None = None


_kinds: dict[str, TaskKind] = {}


def register_kind(
    kind: str,
    task_name: str,
    *,
    args: Callable[[Payload], list[Any]],
    queue: Callable[[Payload], str],
    kwargs: Callable[[Payload], dict[str, Any]] | None = None,
    doorbell: Callable[[Payload], Doorbell | None] | None = None,
) -> None:
    """Say how tasks of `kind` are published. Registering a kind again with the same task
    replaces it (AppConfig.ready may run twice in tests); another task for it is a mistake."""
    if len(kind) > OutboxTask._meta.get_field("kind").max_length:  # type: ignore[operator]
        raise ValueError(f"outbox task kind {kind!r} is longer than the kind column")
    known = _kinds.get(kind)
    if known is not None and known.task_name != task_name:
        raise ValueError(f"outbox task kind {kind!r} is already registered for {known.task_name}")
    _kinds[kind] = TaskKind(task_name, args, queue, kwargs, doorbell)


def registered_kinds() -> dict[str, str]:
    """Each registered kind and the task it publishes."""
    return {kind: spec.task_name for kind, spec in _kinds.items()}


def task_for(kind: str, payload: Payload) -> Task:
    """The task an outbox row of `kind` with `payload` publishes."""
    spec = _kinds.get(kind)
    if spec is None:
        raise ValueError(f"unknown outbox task kind {kind!r}")
    kwargs = spec.kwargs(payload) if spec.kwargs is not None else {}
    return Task(spec.task_name, spec.args(payload), kwargs, spec.queue(payload))


class Task(NamedTuple):
    """One task to put on the broker: what `Celery.send_task` is given."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str


# Tasks per broker round trip where the transport batches publishes (kombu's Redis transport
# pipelines the LPUSHes; RabbitMQ publishes each at once). One round trip per task was what made
# the scheduler late: publishing the 550 tasks of 1,000 due messages took 2.4 s of a 2.6 s dispatch
# whose CPU was 0.56 s, the rest waiting on the socket on a loaded machine; pipelined, the whole
# dispatch took 1.15 s (profiled; bench/scheduler.py, docs/performance.md).
PUBLISH_BATCH = 500


class Publisher:
    """Puts the outbox's tasks on the broker. The steps are fixed here; a publisher says where
    its producer comes from (`producer`) and how one task is sent over it (`send`).

    `publish` sends `tasks` in order and calls `sent(n)` each time the next `n` of them have gone
    out; a failure propagates, and what `sent` was told is all that went out. In a batch a task
    counts as out once its batch is flushed: a failed batch is left to the relay whole (a task of
    it that did go out is published twice, which the conditional claims make harmless).
    """

    def producer(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def send(self, task: Task, producer: Any) -> None:
        raise NotImplementedError

    def configuration_problems(self) -> list[str]:
        """What in the configuration this publisher would not honour (core.E001 at start-up)."""
        return []

    def publish(self, tasks: Sequence[Task], sent: Callable[[int], None]) -> None:
        with self.producer() as producer:
            # One task (a web request's) is one LPUSH without a pipeline: the same round trip,
            # less CPU.
            if len(tasks) == 1 or not producer.supports_batch_publish:
                for task in tasks:
                    self.send(task, producer)
                    sent(1)
                return
            for start in range(0, len(tasks), PUBLISH_BATCH):
                chunk = tasks[start : start + PUBLISH_BATCH]
                # Room for a queue's expiry commands too (LPUSH + a PEXPIRE per priority step).
                with producer.batch(max_size=PUBLISH_BATCH * 16):
                    for task in chunk:
                        self.send(task, producer)
                sent(len(chunk))


class CeleryPublisher(Publisher):
    """Celery's own `send_task`, over a producer from the app's pool: the plain publisher
    (EMAILHUB_FAST_PATHS without `publish`). fastpaths/publish.py builds the same messages for
    less CPU."""

    def producer(self) -> AbstractContextManager[Any]:
        return celery_app.producer_or_acquire()

    def send(self, task: Task, producer: Any) -> None:
        celery_app.send_task(
            task.name, args=task.args, kwargs=task.kwargs, queue=task.queue, producer=producer, retry=False
        )


_publisher: tuple[str, Publisher] | None = None


def publisher() -> Publisher:
    """The publisher settings.EMAILHUB_OUTBOX_PUBLISHER names (a dotted path to its class)."""
    global _publisher
    path = settings.EMAILHUB_OUTBOX_PUBLISHER
    if _publisher is None or _publisher[0] != path:
        _publisher = (path, import_string(path)())
    return _publisher[1]


def _publish_all(rows: list[tuple[int, str, Payload]], published: list[int]) -> None:
    """Publish the tasks of `rows` (id, kind, payload), appending each id that went out to `published`; a failure propagates,
    and `published` still says what went out (Publisher.publish)."""
    tasks = [task_for(kind, payload) for _, kind, payload in rows]
    start = len(published)

    def sent(count: int) -> None:
        done = len(published) - start
        published.extend(row_id for row_id, _, _ in rows[done : done + count])

    publisher().publish(tasks, sent)


def _publish_after_commit(rows: list[tuple[int, str, Payload]]) -> None:
    published = _answered(rows)
    rows = [row for row in rows if row[0] not in published]
    try:
        _publish_all(rows, published)
    except Exception as exc:  # noqa: BLE001 - the relay publishes what we could not
        logger.warning("publishing %d outbox task(s) failed (%s); the relay will retry", len(rows), exc)
    if published:
        if _background is not None:
            _background.put(published)
        else:
            _delete(published)


def _ring(bell: Doorbell) -> int:
    client = redis_clients.send_path()
    args = (2, bell.key, bell.wake_key, int(bell.seconds * 1000))
    try:
        return int(client.evalsha(_RING_SHA, *args))
    except NoScriptError:  # a Redis that has not seen it yet (restarted, flushed scripts)
        return int(client.eval(_RING, *args))


def _answered(rows: list[tuple[int, str, Payload]]) -> list[int]:
    """The ids of the rows whose doorbell is already ringing: a task published before them, still
    on the broker or running, will find their work, so they are deleted unpublished. Rows of one
    doorbell ring it once (the first is published if it was not set): one round trip. If Redis
    cannot say, every row is published: an extra task costs a claim that finds nothing, a missing
    one would cost a message its send."""
    by_bell: dict[Doorbell, list[int]] = {}
    for row_id, kind, payload in rows:
        spec = _kinds.get(kind)
        bell = spec.doorbell(payload) if spec is not None and spec.doorbell is not None else None
        if bell is not None:
            by_bell.setdefault(bell, []).append(row_id)
    if not by_bell:
        return []
    try:
        # One call per doorbell (there is one in practice): a pipeline would first ask SCRIPT
        # EXISTS, a second round trip on every accept.
        rung = [_ring(bell) for bell in by_bell]
    except RedisError as exc:
        logger.warning("doorbells unreadable (%s): publishing every task", exc)
        return []
    answered = []
    for (_, row_ids), first in zip(by_bell.items(), rung, strict=True):
        answered += row_ids[1:] if first else row_ids
    return answered


# The DELETE commits with synchronous_commit off (set_config(…, true): for its own transaction
# only). It records nothing that must survive a PostgreSQL crash: a lost DELETE leaves rows whose
# tasks went out, and the relay publishes them again, which the conditional claims make
# harmless. The accept path's own commit stays synchronous. Without this the web waited for two
# WAL flushes per accepted message (the INSERT's and the DELETE's) where the reference waits for
# one: the combined INSERT and the DELETE were 54% and 23% of a request's wall time in py-spy.
_DELETE_SQL = """
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM core_outboxtask WHERE id = ANY(%s) AND EXISTS (SELECT FROM relaxed)
"""


def _delete(row_ids: list[int]) -> None:
    # Plain SQL: QuerySet.delete() runs Django's deletion collector, ~1 ms per request here for
    # a table nothing references (profiled on POST /api/v1/messages).
    with connection.cursor() as cursor:
        cursor.execute(_DELETE_SQL, [row_ids])


class _BackgroundDeletes:
    """The DELETEs of published rows, batched on a thread of their own (one per process, started
    on first use, so after a fork too): the request that published goes on without waiting for
    one more round trip, and one DELETE removes the rows of many requests. What a killed process
    had not deleted yet is published again by the relay after EMAILHUB_OUTBOX_GRACE_SECONDS,
    which the conditional claims make harmless; so is what a failed DELETE left (logged)."""

    BATCH = 500
    GATHER_SECONDS = 0.05

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._pid: int | None = None
        self._lock = threading.Lock()

    def put(self, row_ids: list[int]) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    threading.Thread(target=self._run, name="outbox-deletes", daemon=True).start()
                    self._pid = os.getpid()
        self._queue.put(row_ids)

    def _run(self) -> None:
        while True:
            row_ids = list(self._queue.get())
            time.sleep(self.GATHER_SECONDS)  # let a busy process's next requests join this batch
            while len(row_ids) < self.BATCH:
                try:
                    row_ids += self._queue.get_nowait()
                except queue.Empty:
                    break
            try:
                _delete(row_ids)
            except Exception as exc:  # noqa: BLE001 - the relay publishes them again, harmlessly
                logger.warning("deleting %d published outbox row(s) failed: %s", len(row_ids), exc)
                connection.close()  # this thread's; the next batch connects afresh


_background: _BackgroundDeletes | None = None


def delete_in_background() -> None:
    """Delete published rows on a background thread of this process from now on (the web process:
    emailhub/wsgi.py). Elsewhere they are deleted before `record_many`'s caller goes on."""
    global _background
    if _background is None:
        _background = _BackgroundDeletes()


def ring_after_commit(kind: str, payload: Payload) -> None:
    """Publish the doorbell task of `kind` once the caller's transaction commits, with no outbox
    row: for work whose own rows are its outbox (core.outbound_events), which a periodic sweep
    finds if this ring is lost. A kind no app registered rings nothing."""
    spec = _kinds.get(kind)
    if spec is None:
        return

    def ring() -> None:
        bell = spec.doorbell(payload) if spec.doorbell is not None else None
        try:
            if bell is None or _ring(bell):
                publisher().publish([task_for(kind, payload)], lambda _: None)
        except Exception as exc:  # noqa: BLE001 - the sweep finds the work
            logger.warning("ringing %s failed (%s); its sweep will find the work", kind, exc)

    transaction.on_commit(ring)


def record_many(tasks: list[tuple[str, Payload]], *, publish_on: Executor | None = None) -> None:
    """Record tasks ((kind, payload)) in the caller's transaction (one INSERT) and publish them after it commits.

    With `publish_on` (an executor), publishing happens on its thread, so the caller can go on
    with its next transaction meanwhile (fan-out does); the caller waits for the executor before
    it finishes. A crash before they are published leaves the rows to the relay, as always.
    """
    if not tasks:
        return
    for kind, _ in tasks:
        if kind not in _kinds:
            # Refused before the row exists: the relay could never publish it.
            raise ValueError(f"unknown outbox task kind {kind!r}")
    rows = OutboxTask.objects.bulk_create([OutboxTask(kind=kind, payload=payload) for kind, payload in tasks])
    pending = [(row.pk, row.kind, row.payload) for row in rows]
    if publish_on is None:
        transaction.on_commit(lambda: _publish_after_commit(pending))
    else:
        transaction.on_commit(lambda: publish_on.submit(_publish_after_commit, pending))


def record(kind: str, payload: Payload) -> None:
    record_many([(kind, payload)])


def insert_with_task(
    statement: str,
    params: Sequence[Any],
    kind: str,
    payload_sql: str,
    payload_params: Sequence[Any] = (),
    *,
    also: str = "",
) -> tuple[Any, ...] | None:
    """Run the caller's `INSERT … RETURNING …` and record one task of `kind` in the same SQL
    statement, then publish it after commit as record_many does. Returns the statement's row, or
    None (and records nothing) when it inserted none.

    `payload_sql` is the task's JSON payload as a SQL expression over the returned columns,
    which it names `inserted` (e.g. `jsonb_build_object('id', inserted.id, 'n', %s)` with
    `payload_params` `[3]`). One statement is
    one round trip, and outside a transaction (autocommit) it is its own transaction: the row
    and its task commit together without BEGIN, SAVEPOINT or COMMIT (POST /api/v1/messages:
    8 round trips became 3 with the health check and the DELETE, docs/architecture.md).
    `also`, if given, is one more CTE over `inserted` (its body, without parameters), written in
    the same statement: the message's outbound event (core.outbound_events).
    """
    if kind not in _kinds:
        raise ValueError(f"unknown outbox task kind {kind!r}")
    sql = (
        f"WITH inserted AS ({statement}), task AS ("
        f"INSERT INTO core_outboxtask (kind, payload) SELECT %s, {payload_sql} FROM inserted"
        " RETURNING id, payload::text)"
        + (f", also AS ({also})" if also else "")
        + " SELECT inserted.*, task.* FROM inserted, task"
    )
    with connection.cursor() as cursor:
        # Planned once per connection: one such statement is sent per accepted message.
        execute_prepared(cursor, sql, [*params, kind, *payload_params])
        found = cursor.fetchone()
    if found is None:
        return None  # the caller's INSERT inserted nothing (ON CONFLICT DO NOTHING): no task
    *row, row_id, payload = found
    pending = [(row_id, kind, json.loads(payload))]
    transaction.on_commit(lambda: _publish_after_commit(pending))
    return tuple(row)


def oldest_pending(kind: str) -> datetime | None:
    """When the oldest unpublished task of `kind` was recorded (None: none is waiting)."""
    return OutboxTask.objects.filter(kind=kind).aggregate(oldest=Min("created_at"))["oldest"]


def relay(limit: int = 500) -> int:
    """Publish outbox rows that were committed but not published; return how many went out."""
    cutoff = timezone.now() - timedelta(seconds=settings.EMAILHUB_OUTBOX_GRACE_SECONDS)
    with transaction.atomic():
        rows = list(
            OutboxTask.objects.select_for_update(skip_locked=True)
            .filter(created_at__lte=cutoff)
            .order_by("id")
            .values_list("id", "kind", "payload")[:limit]
        )
        published: list[int] = []
        try:
            _publish_all(rows, published)
        except Exception as exc:  # noqa: BLE001 - leave the rest for the next tick
            logger.warning("outbox relay stopped after %d task(s): %s", len(published), exc)
        if published:
            _delete(published)
    if published:
        logger.info("outbox relay published %d task(s)", len(published))
    return len(published)
