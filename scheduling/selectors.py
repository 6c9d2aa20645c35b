"""Reads for the schedule dashboard."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from campaigns.exceptions import SegmentQueryTimeout
from campaigns.models import Campaign, Priority
from campaigns.segments import campaign_audience_size
from delivery.models import Message
from delivery.selectors import pending_and_sending_by_priority
from scheduling.models import RecurringSchedule


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _recurring_rows(status: str | None) -> list[dict[str, Any]]:
    schedules = RecurringSchedule.objects.order_by("id")
    if status == "active":
        schedules = schedules.filter(active=True)
    elif status == "inactive":
        schedules = schedules.filter(active=False)
    elif status:
        return []
    rows = []
    for s in schedules:
        last = s.occurrences.order_by("-occurrence").select_related("campaign").first()
        pending = 0
        if last is not None:
            pending = Message.objects.filter(
                campaign=last.campaign, status__in=["scheduled", "queued", "retry_wait", "sending"]
            ).count()
        rows.append(
            {
                "id": f"recurring-{s.pk}",
                "campaign_id": last.campaign_id if last else None,
                "type": "recurring",
                "cron": s.cron,
                "timezone": s.timezone,
                "scheduled_at": None,
                "next_run": _iso(s.next_run),
                "last_run": _iso(s.last_run),
                "status": "active" if s.active else "inactive",
                "pending_count": pending,
            }
        )
    return rows


def _scheduled_rows(status: str | None) -> list[dict[str, Any]]:
    # Immediate campaigns are shown while they run (sending, or paused mid-send); once finished
    # they are history, not schedules.
    campaigns = Campaign.objects.exclude(
        Q(schedule_type=Campaign.ScheduleType.IMMEDIATE)
        & ~Q(status__in=[Campaign.Status.SENDING, Campaign.Status.PAUSED])
    ).order_by("-id")
    if status:
        campaigns = campaigns.filter(status=status)
    campaigns = campaigns.annotate(
        pending=Count(
            "message", filter=Q(message__status__in=["scheduled", "queued", "retry_wait", "sending"])
        ),
        next_due=Count("message", filter=Q(message__status="scheduled")),
    )
    rows = []
    for c in campaigns:
        next_due = (
            Message.objects.filter(campaign=c, status="scheduled")
            .order_by("due_at")
            .values_list("due_at", flat=True)
            .first()
            if c.next_due
            else None
        )
        rows.append(
            {
                "id": f"campaign-{c.pk}",
                "campaign_id": c.pk,
                "type": "scheduled",
                "cron": None,
                "timezone": None,
                "scheduled_at": _iso(c.scheduled_at),
                "next_run": _iso(next_due or (c.scheduled_at if c.status == "scheduled" else None)),
                "last_run": _iso(c.started_at),
                "status": c.status,
                # Before fan-out (a scheduled `at` campaign, or one paused before it started)
                # there are no messages yet: its audience is what is pending.
                "pending_count": _audience_size(c)
                if c.status in ("scheduled", "paused") and c.started_at is None and not c.pending
                else c.pending,
            }
        )
    return rows


def _audience_size(campaign: Campaign) -> int | None:
    """A campaign's audience before its fan-out, None when its segment's count ran past
    EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS (one slow segment must not fail the dashboard)."""
    try:
        return campaign_audience_size(campaign)
    except SegmentQueryTimeout:
        return None


def queue_snapshot() -> dict[str, dict[str, int]]:
    """Per priority, in messages (never broker tasks, which carry up to a batch each):
    pending = `queued` plus due but not yet dispatched (`scheduled`/`retry_wait` with
    `due_at <= now`); processing = `sending`.

    No index serves `status = 'queued'` (it would cost every fan-out insert), so this is one
    sequential scan of delivery_message (delivery.selectors); see docs/scheduling.md for the
    measured cost."""
    counts = pending_and_sending_by_priority()
    return {
        p: {"pending": int(counts.get(p, (0, 0))[0]), "processing": int(counts.get(p, (0, 0))[1])}
        for p in Priority.values
    }


def schedules_page(*, kind: str | None, status: str | None, page: int, page_size: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    if kind in (None, "recurring"):
        rows += _recurring_rows(status)
    if kind in (None, "scheduled"):
        rows += _scheduled_rows(status)
    start = (page - 1) * page_size
    return {
        "count": len(rows),
        "page": page,
        "page_size": page_size,
        "schedules": rows[start : start + page_size],
        "queue_snapshot": queue_snapshot(),
    }


def queue_depths() -> list[tuple[tuple[str, str], int]]:
    """((priority, pending|processing), messages): the scrape-time gauge emailhub_queue_depth."""
    return [
        ((priority, state), count)
        for priority, counts in queue_snapshot().items()
        for state, count in counts.items()
    ]
