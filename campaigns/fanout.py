"""Campaign fan-out: the audience becomes message rows, PostgreSQL doing the work.

Each step is one transaction that takes the next `batch` list members in contact-id order
(keyset pagination over the (list, contact) unique index; for a segment's campaign without a
list, the next contacts by id), keeps those matching the campaign's segment if it has one (the
filter it was scheduled with, compiled once per run by campaigns.segments: membership is decided
by the step that reaches a contact), inserts one queued message per active, non-suppressed
member that has none yet with one INSERT … SELECT (no Python object per recipient), records one send task per `EMAILHUB_BATCH_SIZE_<PRIORITY>` new ids in the
outbox, and moves the campaign's cursor and counters. A fan-out killed mid-way leaves every
committed step whole; run again it resumes at the cursor, and the step's anti-join on the
campaign's messages (UNIQUE(campaign, contact) behind it) makes a replayed step insert nothing
twice. The INSERT itself is the delivery app's, whose
state machine owns every write to messages (`delivery.services.transitions.materialise_step`);
this module walks the list and owns the campaign's cursor and counters.

Each step takes a transaction-level advisory lock on the campaign, so a redelivered fan-out task
that finds another already running simply returns. (Not SKIP LOCKED on the campaign row: send
workers briefly lock that row to move its counters, and fan-out must wait for them, not quit.)
A pause or cancel takes the same advisory lock, so it waits for the step in flight and the
very next step sees it.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from campaigns.models import Campaign
from campaigns.optimized import window_plan
from campaigns.progress import complete_if_finished
from campaigns.segment_sql import Compiled
from campaigns.segments import audience_condition
from campaigns.selectors import AUDIENCE_TABLES, WindowPlan
from core import statistics
from core.localtime import due_by_timezone
from core.schedule_index import index_after_commit, slot_unit
from delivery.services import send_tasks, transitions

logger = logging.getLogger(__name__)


@dataclass
class FanoutReport:
    steps: int = 0
    members: int = 0
    created: int = 0
    finished: bool = False


def fan_out(campaign_id: int, *, step_size: int | None = None, max_steps: int | None = None) -> FanoutReport:
    """Create the campaign's messages step by step until the list is done, or it stops sending.

    A step's send tasks are published by a background thread while the next step's INSERT runs
    in PostgreSQL (publishing them one Redis round trip each took 30% of fan-out's time).
    """
    publish_on = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fan-out-publish")
    try:
        return _fan_out(campaign_id, step_size=step_size, max_steps=max_steps, publish_on=publish_on)
    finally:
        # The thread's own database connection (outbox deletes): looked up on that thread (the
        # proxy's attribute read here would close, or fail to close, this thread's instead).
        publish_on.submit(lambda: connection.close())
        publish_on.shutdown(wait=True)


def _fan_out(
    campaign_id: int, *, step_size: int | None, max_steps: int | None, publish_on: ThreadPoolExecutor
) -> FanoutReport:
    step_size = step_size or settings.EMAILHUB_FANOUT_STEP
    report = FanoutReport()
    # The steps join the list's members to the contacts: after a bulk load that autovacuum has
    # not analyzed yet, the planner picks a plan for empty tables (41 s instead of 0.25 s for a
    # step). One catalog query when the statistics are current (core/statistics.py).
    statistics.analyze_stale(AUDIENCE_TABLES)
    zones: dict[str, datetime] | None = None
    plan: WindowPlan | None = None
    audience: Compiled | None = None
    audience_known = False
    while max_steps is None or report.steps < max_steps:
        with transaction.atomic():
            if not _try_lock(campaign_id):
                return report  # another fan-out of this campaign is running
            # No row lock: senders move this row's counters all the time and must not wait for
            # a step (bench/campaign.py saw them blocked a third of the time when it did).
            # Pause and cancel take the advisory lock instead (lifecycle.wait_for_fan_out_step).
            campaign = Campaign.objects.filter(
                pk=campaign_id, status=Campaign.Status.SENDING, fanout_done=False
            ).first()
            if campaign is None:
                return report  # paused, cancelled or finished
            local = campaign.schedule_type == Campaign.ScheduleType.LOCAL_TIME
            if local and zones is None:
                zones = local_dues(campaign)
            optimized = campaign.schedule_type == Campaign.ScheduleType.OPTIMIZED
            if optimized and plan is None:
                plan = window_plan(campaign)
            if not audience_known:  # a segment's filter, compiled once per run
                audience, audience_known = audience_condition(campaign), True
            last_member, members, matched, ids = _step(
                campaign, step_size, zones if local else None, plan if optimized else None, audience
            )
            report.steps += 1
            if members == 0:
                _finish(campaign)
                report.finished = True
                return report
            if local and ids and zones:
                # Index the slots (a few dozen at most); re-adding an indexed one changes nothing.
                index_after_commit([(slot_unit(campaign.pk, due), due) for due in set(zones.values())])
            elif optimized and ids and plan:
                # The same slot units: at most (24 hours × distinct UTC offsets) + 1 instants.
                index_after_commit([(slot_unit(campaign.pk, due), due) for due in plan.dues()])
            elif ids:
                send_tasks.record_sends(
                    ids,
                    campaign.priority,
                    settings.EMAILHUB_BATCH_SIZES[campaign.priority],
                    publish_on=publish_on,
                )
            Campaign.objects.filter(pk=campaign.pk).update(
                fanout_cursor=last_member,
                total_count=campaign.total_count + len(ids),
                excluded_count=campaign.excluded_count + matched - len(ids),
                updated_at=timezone.now(),
            )
            report.members += members
            report.created += len(ids)
    return report


# The first key of the two-key advisory lock space that fan-out uses ("FAN").
LOCK_CLASS = 0x46414E


def wait_for_step(campaign_id: int) -> None:
    """Block until the campaign's fan-out step in flight (if any) has committed; hold the lock
    for the rest of the caller's transaction, so no new step starts before it commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, campaign_id])


def _try_lock(campaign_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_CLASS, campaign_id])
        return bool(cursor.fetchone()[0])


def local_dues(campaign: Campaign) -> dict[str, datetime]:
    """Timezone → due instant, decided against the campaign's start so a resumed fan-out
    decides exactly as the first run did."""
    if campaign.local_date is None or campaign.local_time is None:
        raise ValueError(f"local-time campaign {campaign.pk} has no local_date/local_time")
    return {
        name: due.replace(microsecond=0)
        for name, due in due_by_timezone(
            campaign.local_date,
            campaign.local_time,
            now=campaign.started_at or timezone.now(),
            policy=campaign.past_time_policy,
        ).items()
    }


def _step(
    campaign: Campaign,
    step_size: int,
    zones: dict[str, datetime] | None,
    plan: WindowPlan | None,
    audience: Compiled | None,
) -> tuple[int, int, int, list[int]]:
    last_member, members, matched, ids = transitions.materialise_step(
        campaign_id=campaign.pk,
        list_id=campaign.contact_list_id,
        cursor=campaign.fanout_cursor,
        limit=step_size,
        template_id=campaign.template_id,
        priority=campaign.priority,
        zones=zones,
        plan=plan,
        condition=audience.sql if audience else None,
        condition_params=audience.params if audience else None,
    )
    return last_member or campaign.fanout_cursor, members, matched, ids


def _finish(campaign: Campaign) -> None:
    """The list is exhausted: mark fan-out done, and the campaign completed if nothing is left."""
    Campaign.objects.filter(pk=campaign.pk).update(fanout_done=True, updated_at=timezone.now())
    complete_if_finished([campaign.pk])
    logger.info("fan-out of campaign %s finished: %s messages", campaign.pk, campaign.total_count)
