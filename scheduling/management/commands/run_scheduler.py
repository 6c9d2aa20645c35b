"""The scheduler process: claims due units from the Redis sorted set and dispatches them.

Any number may run at once: claims are atomic (one Lua script), dispatch is conditional, and a
claimer that dies is reaped. It sleeps until the next due unit (at most --max-sleep), so
dispatch is not tied to a polling tick.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from core import schedule_index
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
        while not stop.is_set():
            try:
                if time.monotonic() - last_reap > 1.0:
                    reaped = schedule_index.reap()
                    if reaped:
                        logger.warning("returned %d unit(s) whose claimer died", reaped)
                    last_reap = time.monotonic()
                claim = schedule_index.claim(batch, lease)
                if claim.units:
                    queued = dispatch(claim.units)
                    schedule_index.ack(claim)
                    logger.info("dispatched %d unit(s), %d message(s)", len(claim.units), queued)
                    continue  # more may be due right now
                wait = max_sleep if claim.next_due is None else min(max_sleep, claim.next_due - claim.now)
            except Exception:  # noqa: BLE001 - Redis or PostgreSQL away: keep trying, never exit
                logger.exception("scheduler loop failed; retrying in 1 s")
                close_old_connections()
                schedule_index.reset_client()
                wait = 1.0
            stop.wait(max(wait, 0.001))
        self.stdout.write("scheduler stopped")
