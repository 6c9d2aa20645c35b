"""What this app registers with core's outbox when Django starts (OutboundConfig.ready): its
task kinds and their queue."""

from __future__ import annotations

from core import outbox
from core.outbound_events import DISPATCH_KIND

DELIVER_KIND = "outbound.deliver"
DISPATCH_TASK = "outbound.dispatch_events"
DELIVER_TASK = "outbound.deliver"
QUEUE = "webhooks"
# One dispatcher at a time is enough; while one is queued or running, a ring publishes nothing.
DISPATCH_BELL = outbox.Doorbell("emailhub:outbound:dispatch", 5.0)


def register() -> None:
    outbox.register_kind(
        DISPATCH_KIND,
        DISPATCH_TASK,
        args=lambda _: [],
        queue=lambda _: QUEUE,
        doorbell=lambda _: DISPATCH_BELL,
    )
    outbox.register_kind(
        DELIVER_KIND, DELIVER_TASK, args=lambda payload: [payload["endpoint"]], queue=lambda _: QUEUE
    )
