"""The scheduler process: claims due units from the Redis sorted set and dispatches them.

Any number may run at once: claims are atomic (one Lua script), dispatch is conditional, and a
claimer that dies is reaped. It sleeps until the next due unit (at most --max-sleep), so
dispatch is not tied to a polling tick.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from core import redis_clients, schedule_index
from scheduling.dispatch import dispatch

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Dispatch scheduled sends, retries and campaigns when they fall due."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=1000, help="units claimed at a time")
        parser.add_argument(
            "--max-sleep", type=float, default=1.0, help="longest sleep between claims, seconds"
        )

    def handle(self, *args: Any, batch: int, max_sleep: float, **options: Any) -> None:
        # The claim script passes the units to ZREM with Lua's unpack(), which fails
        # somewhere near 8,000 arguments.
        if not 1 <= batch <= 5000 or max_sleep <= 0:
            raise CommandError("--batch must be 1 to 5000 and --max-sleep a positive number of seconds")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        lease = settings.EMAILHUB_SCHEDULER_LEASE_SECONDS
        self.stdout.write("scheduler running")
        self.stdout.flush()
        last_reap = 0.0
        pauses = _GcPauses()
        gc.callbacks.append(pauses)
        # Django, Celery and kombu leave a few hundred thousand long-lived objects that every
        # full collection walked: 0.4 s of a 0.9 s dispatch on a loaded machine (bench/scheduler.py,
        # the "gc" figure of these log lines). Frozen at start and after the first dispatch (whose
        # connections and lazy imports live as long as the process), a collection walks only
        # what the loop made; and young collections every 10,000 allocations, not 700.
        gc.freeze()
        gc.set_threshold(10_000, 20, 20)
        frozen_after_first = False
        timings: dict[str, float] = {}
        while not stop.is_set():
            try:
                if time.monotonic() - last_reap > 1.0:
                    reaped = schedule_index.reap()
                    if reaped:
                        logger.warning("returned %d unit(s) whose claimer died", reaped)
                    last_reap = time.monotonic()
                started = time.perf_counter()
                claim = schedule_index.claim(batch, lease)
                if claim.units:
                    claimed = time.perf_counter()
                    queued = dispatch(claim.units, timings)
                    dispatched = time.perf_counter()
                    schedule_index.ack(claim)
                    done = time.perf_counter()
                    # Where each dispatch's time went, so that a late one says why (bench/scheduler.py
                    # reads these lines): claim, UPDATE + outbox rows, COMMIT + publish, ack, and
                    # the garbage collector's pauses since the previous line.
                    logger.info(
                        "dispatched %d unit(s), %d message(s) in %.1f ms (claim %.1f, sql %.1f, "
                        "commit+publish %.1f, ack %.1f; gc %.1f)",
                        len(claim.units),
                        queued,
                        (done - started) * 1000,
                        (claimed - started) * 1000,
                        timings.get("sql", 0.0) * 1000,
                        timings.get("commit", 0.0) * 1000,
                        (done - dispatched) * 1000,
                        pauses.take() * 1000,
                    )
                    if not frozen_after_first:
                        gc.collect()
                        gc.freeze()
                        frozen_after_first = True
                    continue  # more may be due right now
                wait = max_sleep if claim.next_due is None else min(max_sleep, claim.next_due - claim.now)
            except Exception:  # noqa: BLE001 - Redis or PostgreSQL away: keep trying, never exit
                logger.exception("scheduler loop failed; retrying in 1 s")
                close_old_connections()
                redis_clients.reset()
                wait = 1.0
            stop.wait(max(wait, 0.001))
        gc.callbacks.remove(pauses)
        self.stdout.write("scheduler stopped")


class _GcPauses:
    """A gc callback that adds up the collector's pauses until take()."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._started

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total
