"""The fan-out task through the outbox: `fan_out` with a campaign id, on the `campaigns` queue.

Registered with core.outbox from CampaignsConfig.ready.
"""

from __future__ import annotations

from core import outbox

FAN_OUT = "fan_out"
FAN_OUT_TASK = "campaigns.fan_out"


def register() -> None:
    outbox.register_kind(
        FAN_OUT,
        FAN_OUT_TASK,
        args=lambda payload: [payload["campaign_id"]],
        kwargs=lambda payload: {"requeue": bool(payload.get("requeue"))},
        queue=lambda payload: "campaigns",
    )


def record_fan_out(campaign_id: int, *, requeue: bool = False) -> None:
    """Fan-out (or, with `requeue`, first publish the campaign's queued messages again, then fan out)."""
    outbox.record(FAN_OUT, {"campaign_id": campaign_id, "requeue": requeue})
