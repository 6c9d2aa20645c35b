"""Publish send tasks again for every `queued` message.

The reconciler does this by itself when the Redis at REDIS_URL lost its data. Run this by hand
when the *broker* lost its queues and the reconciler cannot tell: a broker on another Redis, or
RabbitMQ. A message whose task survived is claimed by whichever task comes first; the other
finds nothing to do.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from delivery.services.transitions import republish_queued


class Command(BaseCommand):
    help = "Publish send tasks again for every queued message (after the broker lost its queues)."

    def handle(self, *args: Any, **options: Any) -> None:
        count = republish_queued()
        self.stdout.write(f"published send tasks for {count} queued message(s)")
