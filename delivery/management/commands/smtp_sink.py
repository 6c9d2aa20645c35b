"""A local SMTP server that accepts everything (for the demo and development)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from delivery.testing.smtp_server import SMTPTestServer


class Command(BaseCommand):
    help = "Run an aiosmtpd SMTP sink that accepts and counts every message."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=1025)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        # aiosmtpd logs every SMTP command at INFO; a sink taking thousands of messages a second
        # would spend its time logging.
        logging.getLogger("mail.log").setLevel(logging.WARNING)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        with SMTPTestServer(host=host, port=port) as server:
            self.stdout.write(f"SMTP sink listening on {host}:{server.port}", ending="\n")
            self.stdout.flush()
            stop.wait()
            self.stdout.write(f"SMTP sink stopping after {server.count} message(s)")
