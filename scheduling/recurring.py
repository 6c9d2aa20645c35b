"""Recurring schedules: a 5-field cron expression in an IANA timezone that creates campaigns.

Next runs are found by iterating the cron expression over *naive local wall times* and resolving
each one with core.localtime's rules. So a daily 01:30 job fires once per local date even
on a fall-back day (croniter ≥ 6.1, iterating aware datetimes, yields that 01:30 twice), and a
job whose wall time falls in a spring-forward gap fires at the first valid instant after it. Two
wall times that resolve to one instant (02:00 and 03:00 on spring-forward day) fire once: the
occurrence is the instant, and it is unique per schedule.

The beat task claims due schedules with SELECT … FOR UPDATE SKIP LOCKED; each occurrence
creates at most one campaign (UNIQUE(schedule, occurrence)), so two beats ticking at once create
one campaign. After downtime, missed occurrences collapse into one run: the next run is computed
from now, not from the missed occurrence (documented in docs/scheduling.md).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadCronError, CroniterBadDateError, croniter  # type: ignore[import-untyped]
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from campaigns import lifecycle
from campaigns.models import Campaign
from core.localtime import localize, zone
from scheduling.exceptions import InvalidCron, NoAudience
from scheduling.models import RecurringSchedule, ScheduleOccurrence

logger = logging.getLogger(__name__)

# How many wall times to look at before concluding a cron expression never fires (`0 0 30 2 *`).
_MAX_CANDIDATES = 5000
# The fields that say when a schedule fires: changing one of them computes next_run again.
RULE_FIELDS = frozenset({"cron", "timezone", "active"})


def validate_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 5:
        raise InvalidCron(
            f"{expression!r} has {len(fields)} field(s); write 5: minute hour day-of-month month day-of-week, e.g. '0 9 * * 1'"
        )
    try:
        croniter(" ".join(fields))
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        raise InvalidCron(f"{expression!r} is not a valid cron expression: {exc}") from None
    if next_run(" ".join(fields), "UTC", datetime(2000, 1, 1, tzinfo=UTC)) is None:
        raise InvalidCron(f"{expression!r} never fires")
    return " ".join(fields)


def clean_cron(expression: str) -> str:
    """validate_cron for a form or serializer field (the admin and the API call this): the
    normalised expression, or a ValidationError with InvalidCron's message."""
    try:
        return validate_cron(expression)
    except InvalidCron as exc:
        raise ValidationError(str(exc), code="invalid_cron") from None


def next_run(expression: str, timezone_name: str, after: datetime) -> datetime | None:
    """The first occurrence strictly after `after` (aware), as a UTC instant."""
    tz = zone(timezone_name)
    # Start a little before `after`'s wall time: around a fall-back, the same wall time maps to
    # two instants and the candidate we want may read as "earlier" in wall time.
    start = after.astimezone(tz).replace(tzinfo=None) - timedelta(hours=3)
    walls = croniter(expression, start)
    for _ in range(_MAX_CANDIDATES):
        try:
            wall = walls.get_next(datetime)
        except CroniterBadDateError:
            return None  # e.g. `0 0 30 2 *`: 30 February never comes
        instant = localize(wall, tz)
        if instant > after:
            return instant
    return None


def refresh_next_run(schedule: RecurringSchedule, *, now: datetime | None = None) -> None:
    schedule.next_run = (
        next_run(schedule.cron, schedule.timezone, now or timezone.now()) if schedule.active else None
    )


def create_schedule(schedule: RecurringSchedule) -> RecurringSchedule:
    """Save a new schedule with its first next_run (the API and the admin create through this)."""
    refresh_next_run(schedule)
    schedule.save()
    return schedule


def update_schedule(schedule_id: int, changes: dict[str, object]) -> RecurringSchedule:
    """Write what an operator changed (the API and the admin update through this).

    last_run and next_run belong to the beat (run_due). Only the fields whose value differs are
    written, with the row locked so a tick firing it right now finishes first (its SKIP LOCKED
    then passes over us); next_run is computed again only when a RULE_FIELDS field changed, so a
    rename never skips an occurrence that is due.
    """
    with transaction.atomic():
        schedule = RecurringSchedule.objects.select_for_update().get(pk=schedule_id)
        fields = [field for field, value in changes.items() if getattr(schedule, field) != value]
        if not fields:
            return schedule
        for field in fields:
            setattr(schedule, field, changes[field])
        if schedule.contact_list_id is None and schedule.segment_id is None:
            raise NoAudience(
                "a recurring schedule needs an audience: give a contact_list, a segment, or both"
            )
        if RULE_FIELDS & set(fields):
            refresh_next_run(schedule)
            fields.append("next_run")
        schedule.save(update_fields=[*fields, "updated_at"])
    return schedule


def run_due(limit: int = 50) -> int:
    """Fire every due schedule once (beat calls this); return how many campaigns were created."""
    created = 0
    now = timezone.now()
    with transaction.atomic():
        due = list(
            RecurringSchedule.objects.select_for_update(skip_locked=True)
            .filter(active=True, next_run__lte=now)
            .order_by("next_run")[:limit]
        )
        for schedule in due:
            occurrence = schedule.next_run
            if occurrence is None:  # filtered on next_run <= now, so never; keeps the types honest
                continue
            if fire(schedule, occurrence):
                created += 1
            schedule.last_run = occurrence
            refresh_next_run(schedule, now=now)  # from now: missed occurrences collapse into one
            schedule.save(update_fields=["last_run", "next_run", "updated_at"])
    return created


def fire(schedule: RecurringSchedule, occurrence: datetime) -> bool:
    """Create the campaign of one occurrence and start it, unless this occurrence already fired
    (UNIQUE(schedule, occurrence)); True when it created one."""
    local = occurrence.astimezone(zone(schedule.timezone))
    try:
        with transaction.atomic():
            campaign = Campaign.objects.create(
                name=f"{schedule.name} — {local:%Y-%m-%d %H:%M %Z}",
                template=schedule.template,
                contact_list=schedule.contact_list,
                segment=schedule.segment,
                priority=schedule.priority,
                from_email=schedule.from_email,
            )
            ScheduleOccurrence.objects.create(schedule=schedule, occurrence=occurrence, campaign=campaign)
    except IntegrityError:
        logger.info("schedule %s already fired for %s", schedule.pk, occurrence)
        return False
    lifecycle.schedule(campaign.pk, Campaign.ScheduleType.IMMEDIATE)
    logger.info("schedule %s fired for %s: campaign %s", schedule.pk, occurrence, campaign.pk)
    return True
