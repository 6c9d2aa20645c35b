"""The scheduler process: moves due work (scheduled sends, retries) to the priority queues.

Any number may run: each claim is a FOR UPDATE SKIP LOCKED over PostgreSQL rows, so two
schedulers never dispatch one message twice.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from campaigns.lifecycle import start_due_campaigns
from delivery.services.sweeps import dispatch_due_messages

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Dispatch scheduled sends and retries when they fall due."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval", type=float, default=0.2, help="seconds between polls when nothing is due"
        )

    def handle(self, *args: Any, interval: float, **options: Any) -> None:
        if interval <= 0:
            from django.core.management.base import CommandError

            raise CommandError("--interval must be a positive number of seconds")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        self.stdout.write("scheduler running")
        while not stop.is_set():
            try:
                dispatched = dispatch_due_messages() + start_due_campaigns()
            except Exception:  # noqa: BLE001 - a lost database connection must not end the loop
                logger.exception("dispatch failed; retrying")
                close_old_connections()
                dispatched = 0
                time.sleep(1)
            if dispatched:
                logger.info("dispatched %d due message(s) and campaign(s)", dispatched)
                continue  # more may be due right now
            stop.wait(interval)
        self.stdout.write("scheduler stopped")
