"""An in-memory provider for tests and the demo: it accepts everything and keeps what it got."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

from delivery.providers.base import UNGUARDED, Guard, OutgoingEmail, Provider, SendResult

outbox: list[OutgoingEmail] = []
_lock = threading.Lock()


class LocmemProvider(Provider):
    name = "locmem"

    def send_batch(self, emails: Sequence[OutgoingEmail], guard: Guard = UNGUARDED) -> list[SendResult]:
        allowed = [guard.allows(email.message_id) for email in emails]
        with _lock:
            outbox.extend(email for email, ok in zip(emails, allowed, strict=True) if ok)
        return [
            SendResult.accepted(f"locmem-{uuid.uuid4().hex}") if ok else SendResult.abandoned()
            for ok in allowed
        ]
