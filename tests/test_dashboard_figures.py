"""Issue 8 items 14 and 15: the dashboard's figures count messages and audiences, show running
immediate campaigns, and a cancelled campaign leaves no unit in the schedule's sorted set."""

from __future__ import annotations

from datetime import date, time, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from campaigns import fanout, lifecycle
from campaigns.models import Contact, Suppression
from core import schedule_index
from delivery.models import Message
from delivery.services import send_tasks
from tests.broker import queued_tasks
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db(transaction=True)


def _dashboard(api) -> dict:  # noqa: ANN001
    response = api.get("/api/v1/schedules")
    assert response.status_code == 200
    return response.json()


def test_queue_snapshot_pending_counts_queued_messages_not_broker_tasks(api, redis) -> None:  # noqa: ANN001
    now = timezone.now()
    with transaction.atomic():
        rows = Message.objects.bulk_create(
            Message(to_email=f"n{n}@example.com", subject="s", text="t", priority="normal", queued_at=now)
            for n in range(250)
        )
        send_tasks.record_sends([m.pk for m in rows], "normal", 100)  # 3 broker tasks for 250 messages
    Message.objects.create(  # due, not yet dispatched: pending too
        to_email="due@example.com", subject="s", text="t", priority="normal", status="scheduled",
        due_at=now - timedelta(seconds=1),
    )  # fmt: skip
    Message.objects.create(  # not due: not pending
        to_email="later@example.com", subject="s", text="t", priority="normal", status="scheduled",
        due_at=now + timedelta(hours=1),
    )  # fmt: skip
    assert len(queued_tasks(redis, "normal")) == 3

    snapshot = _dashboard(api)["queue_snapshot"]
    assert snapshot["normal"] == {"pending": 251, "processing": 0}
    assert snapshot["critical"] == {"pending": 0, "processing": 0}


def test_a_scheduled_at_campaign_shows_its_audience_as_pending(api, redis) -> None:  # noqa: ANN001
    audience = make_audience(5)
    Contact.objects.filter(email="r1@example.com").update(status="unsubscribed")
    Suppression.objects.create(email="r2@example.com", reason="bounce")
    campaign = make_campaign(audience)
    lifecycle.schedule(campaign.pk, "at", timezone.now() + timedelta(hours=1))

    rows = {row["campaign_id"]: row for row in _dashboard(api)["schedules"]}
    assert rows[campaign.pk]["status"] == "scheduled"
    assert rows[campaign.pk]["pending_count"] == 3  # 5 members, one inactive, one suppressed


def test_an_immediate_campaign_is_on_the_dashboard_while_it_sends(api, redis) -> None:  # noqa: ANN001
    campaign = make_campaign(make_audience(4))
    lifecycle.schedule(campaign.pk, "immediate")
    fanout.fan_out(campaign.pk)

    rows = {row["campaign_id"]: row for row in _dashboard(api)["schedules"]}
    assert rows[campaign.pk]["status"] == "sending" and rows[campaign.pk]["pending_count"] == 4
    lifecycle.cancel(campaign.pk)
    assert campaign.pk not in {row["campaign_id"] for row in _dashboard(api)["schedules"]}


@pytest.mark.usefixtures("far_horizon")  # a fixed date years ahead
def test_cancelling_a_local_time_campaign_removes_its_units_from_the_sorted_set(redis) -> None:  # noqa: ANN001
    zones = ["America/New_York", "Europe/London", "Asia/Tokyo"]
    audience = make_audience(6)
    for n, contact in enumerate(Contact.objects.order_by("id")):
        contact.timezone = zones[n % 3]
        contact.save(update_fields=["timezone"])
    campaign = make_campaign(audience)
    lifecycle.schedule(campaign.pk, "local_time", local_date=date(2031, 1, 1), local_time=time(9))
    fanout.fan_out(campaign.pk)
    slots = [u.decode() for u in redis.zrange(schedule_index.DUE, 0, -1)]
    # One slot per distinct instant of every timezone (fan-out indexes them all), 3 with rows.
    assert len(slots) > 3 and all(u.startswith(f"c:{campaign.pk}:") for u in slots)
    retrying = Message.objects.filter(campaign=campaign).first()
    Message.objects.filter(pk=retrying.pk).update(status="retry_wait")
    schedule_index.add([(schedule_index.message_unit(retrying.pk), timezone.now() + timedelta(minutes=5))])

    lifecycle.cancel(campaign.pk)
    assert redis.zrange(schedule_index.DUE, 0, -1) == []
    assert Message.objects.filter(campaign=campaign, status="cancelled").count() == 6


def test_cancelling_a_scheduled_at_campaign_removes_its_start_unit(redis) -> None:  # noqa: ANN001
    campaign = make_campaign(make_audience(2))
    other = make_campaign(make_audience(2, name="other", prefix="o"), name="other")
    lifecycle.schedule(campaign.pk, "at", timezone.now() + timedelta(hours=1))
    lifecycle.schedule(other.pk, "at", timezone.now() + timedelta(hours=1))

    lifecycle.cancel(campaign.pk)
    assert [u.decode() for u in redis.zrange(schedule_index.DUE, 0, -1)] == [f"a:{other.pk}"]
