"""Campaign state changes: draft → scheduled → sending → completed, plus paused, cancelled.

Every change is a locked read or a conditional UPDATE, so two operators (or an operator and the
scheduler) cannot both act on one campaign. Work that follows a change (fan-out, requeueing) is
recorded in the outbox in the same transaction and published after commit.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from campaigns import fanout_tasks, segments
from campaigns.exceptions import CampaignStateError, InvalidFilter, InvalidSchedule
from campaigns.fanout import local_dues, wait_for_step
from campaigns.models import Campaign, Segment
from core.limits import SCHEDULE_HORIZON, beyond_horizon
from core.schedule_index import (
    campaign_unit,
    index_after_commit,
    message_unit,
    slot_unit,
    unindex_after_commit,
)
from core.sql import literals
from delivery.services import transitions

# Statuses as SQL literals from the model's enum (core.sql): `{CAMPAIGN.SENDING}` is `'sending'`.
CAMPAIGN = literals(Campaign.Status)

Status = Campaign.Status
SUPPORTED_SCHEDULES = {
    Campaign.ScheduleType.IMMEDIATE,
    Campaign.ScheduleType.AT,
    Campaign.ScheduleType.LOCAL_TIME,
    Campaign.ScheduleType.OPTIMIZED,
}
# `optimized`: a window of one hour to a week (longer and a contact's habit, and the population
# prior it was shrunk toward, are stale by the end), and a holdout of at most half the audience.
WINDOW_HOURS = (1, 168)
HOLDOUT_PERCENT = (0, 50)
DEFAULT_WINDOW_HOURS = 24
DEFAULT_HOLDOUT_PERCENT = 10


# An `at` instant this far in the past still means "now": a client's clock or a slow request,
# not a mistaken date. Further back it is refused, so a typo (2020 for 2030) cannot start a
# campaign to the whole list at once.
PAST_SCHEDULE_GRACE = timedelta(minutes=5)
# The latest local time on Earth is UTC-12 (Etc/GMT+12); when a wall time has passed there, it
# has passed in every timezone a contact can have.
_LATEST_UTC_OFFSET = timedelta(hours=-12)
_LAST_LOCAL_DATE = date.max - timedelta(days=2)


def check_schedule(
    schedule_type: str,
    scheduled_at: datetime | None,
    local_date: date | None,
    local_time: time | None,
    *,
    window_start: datetime | None = None,
    window_hours: int | None = None,
    holdout_percent: int | None = None,
    now: datetime | None = None,
) -> None:
    """The schedule rule (schedule() and the API's ScheduleSerializer both call it): refuse a
    type not built yet, a type without the inputs it needs, and a schedule whose moment is over:
    `at` before now minus PAST_SCHEDULE_GRACE, or a `local_time` whose wall time has passed in
    every timezone (past_time_policy is for the recipients for whom it has passed, not for a
    date that is over everywhere), an `optimized` window that starts before now minus
    PAST_SCHEDULE_GRACE or whose length or holdout is out of range; and one that starts beyond
    the scheduling horizon (EMAILHUB_SCHEDULE_HORIZON_DAYS)."""
    if schedule_type not in SUPPORTED_SCHEDULES:
        raise InvalidSchedule(
            {"type": f"{schedule_type!r} is not a schedule type; use immediate, at, local_time or optimized"}
        )
    if schedule_type == Campaign.ScheduleType.AT and scheduled_at is None:
        raise InvalidSchedule({"scheduled_at": "required for type 'at'"})
    if schedule_type == Campaign.ScheduleType.LOCAL_TIME:
        given = {"local_date": local_date, "local_time": local_time}
        missing = {field: "required for type 'local_time'" for field, value in given.items() if value is None}
        if missing:
            raise InvalidSchedule(missing)
    now = now or timezone.now()
    if schedule_type == Campaign.ScheduleType.OPTIMIZED:
        _check_window(window_start, window_hours, holdout_percent, now)
    if schedule_type == Campaign.ScheduleType.AT and scheduled_at is not None:
        if scheduled_at < now - PAST_SCHEDULE_GRACE:
            raise InvalidSchedule(
                {
                    "scheduled_at": f"{scheduled_at.isoformat()} is in the past; give a future instant, "
                    "or type 'immediate'"
                }
            )
    _check_horizon(schedule_type, scheduled_at, local_date, local_time, window_start, now)
    if schedule_type == Campaign.ScheduleType.LOCAL_TIME and local_date and local_time:
        if local_date >= _LAST_LOCAL_DATE:
            # Its instants in the western timezones (and `next_day`) are past datetime's range.
            raise InvalidSchedule(
                {"local_date": f"{local_date.isoformat()} is too far ahead; give an earlier date"}
            )
        latest = datetime.combine(local_date, local_time, tzinfo=UTC) - _LATEST_UTC_OFFSET
        if latest <= now:
            raise InvalidSchedule(
                {
                    "local_date": f"{local_date.isoformat()} {local_time.isoformat()} has passed in "
                    "every timezone (the latest, UTC-12, included); give a later date"
                }
            )


def _check_horizon(
    schedule_type: str,
    scheduled_at: datetime | None,
    local_date: date | None,
    local_time: time | None,
    window_start: datetime | None,
    now: datetime,
) -> None:
    """No schedule starts beyond EMAILHUB_SCHEDULE_HORIZON_DAYS (core.limits). A local date and
    time is compared as read in UTC: the horizon is in days, a zone moves it by hours."""
    given: dict[str, tuple[str, datetime | None]] = {
        Campaign.ScheduleType.AT: ("scheduled_at", scheduled_at),
        Campaign.ScheduleType.OPTIMIZED: ("window_start", window_start),
        Campaign.ScheduleType.LOCAL_TIME: (
            "local_date",
            datetime.combine(local_date, local_time, tzinfo=UTC)
            if local_date and local_time and local_date < _LAST_LOCAL_DATE
            else None,
        ),
    }
    field, instant = given.get(schedule_type, ("", None))
    refusal = beyond_horizon(instant, now=now) if instant is not None else None
    if refusal:
        raise InvalidSchedule({field: refusal}, codes={field: SCHEDULE_HORIZON.setting})


def _check_window(
    window_start: datetime | None, window_hours: int | None, holdout_percent: int | None, now: datetime
) -> None:
    errors = {}
    if window_start is not None and window_start < now - PAST_SCHEDULE_GRACE:
        errors["window_start"] = (
            f"{window_start.isoformat()} is in the past; give a future instant, or leave it out for now"
        )
    for name, value, (low, high) in (
        ("window_hours", window_hours, WINDOW_HOURS),
        ("holdout_percent", holdout_percent, HOLDOUT_PERCENT),
    ):
        if value is not None and not low <= value <= high:
            errors[name] = f"must be between {low} and {high}; got {value}"
    if errors:
        raise InvalidSchedule(errors)


def _locked(campaign_id: int, *, stop_fan_out: bool = False) -> Campaign:
    if stop_fan_out:
        wait_for_step(campaign_id)  # the step in flight commits first; no new one starts
    return Campaign.objects.select_for_update().get(pk=campaign_id)


def schedule(
    campaign_id: int,
    schedule_type: str,
    scheduled_at: datetime | None = None,
    *,
    local_date: date | None = None,
    local_time: time | None = None,
    past_time_policy: str | None = None,
    window_start: datetime | None = None,
    window_hours: int | None = None,
    holdout_percent: int | None = None,
    unchanged_since: datetime | None = None,
) -> Campaign:
    """Schedule a draft.

    `immediate` starts now; `at` starts at `scheduled_at` (up to PAST_SCHEDULE_GRACE in the
    past: now; earlier: InvalidSchedule, as for every check_schedule refusal); `local_time`
    fans out now into messages each due at `local_time` on `local_date` in its contact's
    timezone (core.localtime has the DST rules; `past_time_policy` says what happens to
    recipients for whom that moment has passed); `optimized` fans out now into messages each
    due at its contact's best hour inside [window_start (default now), + window_hours
    (default 24)), `holdout_percent` (default 10) of them at window_start (campaigns.optimized).
    With `unchanged_since` (the `updated_at` an operator's form was drawn from), a draft edited
    since is refused (CampaignStateError) under the row lock: what is scheduled is what was seen.
    """
    check_schedule(
        schedule_type,
        scheduled_at,
        local_date,
        local_time,
        window_start=window_start,
        window_hours=window_hours,
        holdout_percent=holdout_percent,
    )
    with transaction.atomic():
        campaign = _locked(campaign_id)
        if campaign.status != Status.DRAFT:
            raise CampaignStateError(f"only a draft campaign can be scheduled; this one is {campaign.status}")
        if unchanged_since is not None and campaign.updated_at != unchanged_since:
            raise CampaignStateError(
                f"the draft was edited at {campaign.updated_at:%Y-%m-%d %H:%M:%S} UTC, after this form was "
                "opened; check it and schedule again"
            )
        campaign.schedule_type = schedule_type
        campaign.scheduled_at = scheduled_at
        if campaign.segment_id is not None:
            # What the campaign will send to is the segment as it is now: a later edit of the
            # segment changes no campaign already on its way (campaigns.segments). Checked again
            # (a list it names may have gone since it was saved), its lists held until commit.
            audience_filter = Segment.objects.values_list("filter", flat=True).get(pk=campaign.segment_id)
            try:
                segments.validate(audience_filter, limits=False)
            except InvalidFilter as exc:
                raise CampaignStateError(
                    f"its segment no longer passes ({exc}); edit the segment first"
                ) from None
            campaign.audience_filter = audience_filter
        now = timezone.now()
        if schedule_type == Campaign.ScheduleType.LOCAL_TIME and local_time is not None:
            campaign.local_date = local_date
            campaign.local_time = local_time.replace(microsecond=0)
            campaign.past_time_policy = past_time_policy or Campaign.PastTimePolicy.NEXT_DAY
        if schedule_type == Campaign.ScheduleType.OPTIMIZED:
            # Up to the grace in the past still means "now" (as for `at`).
            campaign.window_start = max(window_start or now, now).replace(microsecond=0)
            campaign.window_hours = window_hours or DEFAULT_WINDOW_HOURS
            campaign.holdout_percent = DEFAULT_HOLDOUT_PERCENT if holdout_percent is None else holdout_percent
        if schedule_type in (
            Campaign.ScheduleType.IMMEDIATE,
            Campaign.ScheduleType.LOCAL_TIME,
            Campaign.ScheduleType.OPTIMIZED,
        ) or (scheduled_at and scheduled_at <= now):
            campaign.status = Status.SENDING
            campaign.started_at = now
            fanout_tasks.record_fan_out(campaign.pk)
        elif scheduled_at is not None:  # `at` in the future (checked above: `at` needs scheduled_at)
            campaign.status = Status.SCHEDULED
            index_after_commit([(campaign_unit(campaign.pk), scheduled_at)])
        campaign.save()
    return campaign


def update_draft(campaign_id: int, changes: dict[str, object]) -> Campaign:
    """Edit a draft's fields, locked against a concurrent schedule, writing only those fields."""
    with transaction.atomic():
        campaign = _locked(campaign_id)
        if campaign.status != Status.DRAFT:
            raise CampaignStateError(f"only a draft campaign can be edited; this one is {campaign.status}")
        for field, value in changes.items():
            setattr(campaign, field, value)
        if campaign.contact_list_id is None and campaign.segment_id is None:
            # Checked by the API against the draft it read; a concurrent edit may have taken the
            # other half of the audience since (the campaign_has_audience constraint's 500).
            raise CampaignStateError("a campaign needs an audience: give a contact_list, a segment, or both")
        campaign.save(update_fields=[*changes, "updated_at"])
    return campaign


def start_campaigns(campaign_ids: list[int]) -> list[int]:
    """Start these scheduled campaigns if they are still scheduled and due (the scheduler calls this)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE campaigns_campaign
               SET status = {CAMPAIGN.SENDING}, started_at = now(), updated_at = now()
             WHERE id = ANY(%s) AND status = {CAMPAIGN.SCHEDULED} AND scheduled_at <= now()
            RETURNING id
            """,
            [campaign_ids],
        )
        started = [row[0] for row in cursor.fetchall()]
        for campaign_id in started:
            fanout_tasks.record_fan_out(campaign_id)
    return started


def pause(campaign_id: int) -> Campaign:
    """Stop sending: workers claim none of its messages from the next batch on."""
    with transaction.atomic():
        campaign = _locked(campaign_id, stop_fan_out=True)
        if campaign.status not in (Status.SENDING, Status.SCHEDULED):
            raise CampaignStateError(
                f"only a sending or scheduled campaign can be paused; this one is {campaign.status}"
            )
        campaign.status = Status.PAUSED
        campaign.save(update_fields=["status", "updated_at"])
    return campaign


def resume(campaign_id: int) -> Campaign:
    """Continue a paused campaign. Its queued messages are published again (a task that was
    consumed while paused did nothing) and fan-out goes on; nothing is sent twice, since every
    send claims its rows first."""
    with transaction.atomic():
        campaign = _locked(campaign_id)
        if campaign.status != Status.PAUSED:
            raise CampaignStateError(f"only a paused campaign can be resumed; this one is {campaign.status}")
        if campaign.started_at is None and campaign.scheduled_at and campaign.scheduled_at > timezone.now():
            campaign.status = Status.SCHEDULED  # paused before it started: back to waiting
        else:
            campaign.status = Status.SENDING
            campaign.started_at = campaign.started_at or timezone.now()
            fanout_tasks.record_fan_out(campaign.pk, requeue=True)
        campaign.save(update_fields=["status", "started_at", "updated_at"])
    return campaign


def cancel(campaign_id: int) -> Campaign:
    """Stop for good: every message not yet handed to a provider becomes `cancelled`."""
    with transaction.atomic():
        campaign = _locked(campaign_id, stop_fan_out=True)
        if campaign.status in (Status.COMPLETED, Status.CANCELLED, Status.FAILED):
            raise CampaignStateError(f"a {campaign.status} campaign cannot be cancelled")
        moved = transitions.cancel_campaign(campaign.pk)
        # The units that index its pending work (its start, its local-time slots, its retries)
        # leave the schedule's sorted set with it, not when a scheduler trips on them.
        units = {campaign_unit(campaign.pk)}
        units.update(f"c:{campaign.pk}:{epoch}" for epoch in moved.slot_epochs)
        if campaign.schedule_type == Campaign.ScheduleType.LOCAL_TIME and campaign.local_date:
            # Fan-out indexes a slot for every timezone's instant, not only those with
            # recipients; the same function (decided at the campaign's start) names them.
            units.update(slot_unit(campaign.pk, due) for due in set(local_dues(campaign).values()))
        units.update(message_unit(message_id) for message_id in moved.retry_ids)
        unindex_after_commit(sorted(units))
        cancelled = moved.cancelled
        campaign.status = Status.CANCELLED
        campaign.cancelled_count += cancelled
        campaign.completed_at = timezone.now()
        campaign.save(update_fields=["status", "cancelled_count", "completed_at", "updated_at"])
    return campaign


# A finished campaign may be archived: hidden from the admin's default list, history kept.
ARCHIVABLE = (Status.COMPLETED, Status.CANCELLED, Status.FAILED)


def archive(campaign_id: int) -> Campaign:
    """Archive a finished campaign (one conditional UPDATE); a running one must be cancelled first."""
    with transaction.atomic():
        moved = Campaign.objects.filter(pk=campaign_id, status__in=ARCHIVABLE, archived_at=None).update(
            archived_at=timezone.now()
        )
        campaign = Campaign.objects.get(pk=campaign_id)
        if not moved:
            if campaign.archived_at is not None:
                raise CampaignStateError("this campaign is archived already")
            raise CampaignStateError(
                f"only a completed, cancelled or failed campaign can be archived; this one is "
                f"{campaign.status} (cancel it first)"
            )
    return campaign


def why_not_deletable(campaign: Campaign) -> str | None:
    """None if delete_draft would delete this campaign (a draft with no messages), else why not.
    One indexed lookup (UNIQUE(campaign, contact) leads with the campaign)."""
    if campaign.status != Status.DRAFT:
        return (
            f"only a draft campaign can be deleted; this one is {campaign.status} "
            "(cancel and archive it instead)"
        )
    if campaign.message_set.exists():
        return "this campaign has messages; archive it instead"
    return None


def delete_draft(campaign_id: int) -> None:
    """Delete a draft that has no messages. A campaign with messages is never deleted: its
    delivery history stays (cancel and archive it instead)."""
    with transaction.atomic():
        campaign = _locked(campaign_id)  # a concurrent schedule waits, then finds it gone
        refusal = why_not_deletable(campaign)
        if refusal:
            raise CampaignStateError(refusal)
        campaign.delete()


def resume_stalled_fanouts(stale_seconds: float | None = None) -> int:
    """Publish fan-out again for sending campaigns whose fan-out made no progress for a while.

    A running fan-out moves `updated_at` at every step (well under a second apart), so a campaign
    still unfinished and untouched this long has lost its fan-out worker (killed; Redis would
    only redeliver the task after the broker's visibility timeout). Publishing twice is harmless:
    the advisory lock lets one fan-out run, and each step resumes at the cursor.
    """
    stale = settings.EMAILHUB_FANOUT_STALL_SECONDS if stale_seconds is None else stale_seconds
    with transaction.atomic():
        stalled = list(
            Campaign.objects.select_for_update(skip_locked=True)
            .filter(
                status=Status.SENDING,
                fanout_done=False,
                updated_at__lt=timezone.now() - timedelta(seconds=stale),
            )
            .values_list("pk", flat=True)[:100]
        )
        for campaign_id in stalled:
            fanout_tasks.record_fan_out(campaign_id)
        Campaign.objects.filter(pk__in=stalled).update(updated_at=timezone.now())
    return len(stalled)
