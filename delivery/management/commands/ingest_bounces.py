from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from delivery.exceptions import NotAMailbox
from delivery.services.bounces import ingest_mailbox


class Command(BaseCommand):
    help = (
        "Record the bounces (RFC 3464 delivery status notifications) in an mbox file or a Maildir: "
        "a permanent failure suppresses the address. Reading the same mailbox again records nothing twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path, help="an mbox file or a Maildir directory (cur/, new/, tmp/)")

    def handle(self, *args: Any, path: Path, **options: Any) -> None:
        try:
            summary = ingest_mailbox(path)
        except NotAMailbox as exc:
            raise CommandError(str(exc)) from None
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(summary.kinds.items())) or "none"
        self.stdout.write(
            f"{summary.messages} message(s) read from {path}: {summary.messages - summary.not_dsn} DSN(s), "
            f"{summary.not_dsn} not a DSN (left alone)\n"
            f"{summary.reports} recipient report(s): {kinds}; {summary.skipped} relayed/expanded (not recorded)\n"
            f"recorded {summary.new} new event(s), {summary.duplicates} already recorded; "
            f"{summary.suppressed} address(es) suppressed; {summary.unmatched} new event(s) matched no message"
        )
