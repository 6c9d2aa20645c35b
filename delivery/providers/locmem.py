"""An in-memory provider for tests and the demo: it accepts everything and keeps what it got."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

from delivery.providers.base import OutgoingEmail, Provider, SendResult

outbox: list[OutgoingEmail] = []
_lock = threading.Lock()


class LocmemProvider(Provider):
    name = "locmem"

    def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendResult]:
        with _lock:
            outbox.extend(emails)
        return [SendResult.accepted(f"locmem-{uuid.uuid4().hex}") for _ in emails]
