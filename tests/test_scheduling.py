"""The scheduling engine in-process: timezones, cron, the Redis index, dispatch, reconciler."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, time, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from campaigns import fanout, lifecycle
from campaigns.models import Campaign, Contact
from core import schedule_index
from core.localtime import local_due, localize, zone
from delivery.models import Message
from scheduling import reconciler, recurring
from scheduling.dispatch import dispatch
from scheduling.models import RecurringSchedule, ScheduleOccurrence
from tests.broker import queued_tasks
from tests.factories import make_audience, make_campaign


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("tz", "wall", "expected_utc"),
    [
        ("America/New_York", "2026-03-08 02:30", "2026-03-08 07:00"),  # gap → 03:00 EDT
        ("America/New_York", "2026-11-01 01:30", "2026-11-01 05:30"),  # fold → first (EDT)
        ("America/New_York", "2026-07-01 09:00", "2026-07-01 13:00"),
        ("Europe/London", "2026-03-29 01:30", "2026-03-29 01:00"),  # gap → 02:00 BST
        ("Europe/London", "2026-10-25 01:30", "2026-10-25 00:30"),  # fold → first (BST)
        ("Australia/Lord_Howe", "2026-10-04 02:15", "2026-10-03 15:30"),  # 30-min gap → 02:30
        ("Australia/Lord_Howe", "2026-04-05 01:45", "2026-04-04 14:45"),  # 30-min fold → first
        ("Asia/Kathmandu", "2026-06-01 09:00", "2026-06-01 03:15"),  # +05:45
        ("Asia/Kathmandu", "2026-12-24 00:10", "2026-12-23 18:25"),
    ],
)
def test_wall_times_resolve_to_instants_by_the_dst_rules(tz: str, wall: str, expected_utc: str) -> None:
    assert localize(datetime.fromisoformat(wall), zone(tz)) == utc(expected_utc)


def test_past_local_times_follow_the_campaign_policy() -> None:
    now = utc("2026-06-01 12:00")  # 08:00 in New York
    tz = zone("America/New_York")
    assert local_due(date(2026, 6, 1), time(7), tz, now=now, policy="next_day") == utc("2026-06-02 11:00")
    assert local_due(date(2026, 6, 1), time(7), tz, now=now, policy="send_now") == now
    assert local_due(date(2026, 6, 1), time(7), tz, now=now, policy="skip") is None
    assert local_due(date(2026, 6, 1), time(9), tz, now=now, policy="skip") == utc("2026-06-01 13:00")


def runs(expression: str, tz: str, start: str, count: int) -> list[str]:
    out, after = [], utc(start)
    for _ in range(count):
        after = recurring.next_run(expression, tz, after)
        out.append(after.astimezone(zone(tz)).strftime("%m-%d %H:%M %Z"))
    return out


def test_daily_job_fires_once_per_local_date_across_both_transitions() -> None:
    assert runs("30 1 * * *", "America/New_York", "2026-10-31 12:00", 3) == [
        "11-01 01:30 EDT",
        "11-02 01:30 EST",
        "11-03 01:30 EST",
    ]
    assert runs("30 2 * * *", "America/New_York", "2026-03-07 12:00", 2) == [
        "03-08 03:00 EDT",
        "03-09 02:30 EDT",
    ]
    assert runs("30 1 * * *", "Europe/London", "2026-10-24 12:00", 2) == [
        "10-25 01:30 BST",
        "10-26 01:30 GMT",
    ]


def test_hourly_job_across_transitions_fires_once_per_wall_hour() -> None:
    assert runs("0 * * * *", "America/New_York", "2026-11-01 03:00", 4) == [
        "11-01 00:00 EDT",
        "11-01 01:00 EDT",
        "11-01 02:00 EST",
        "11-01 03:00 EST",
    ]
    assert runs("0 * * * *", "America/New_York", "2026-03-08 05:00", 3) == [
        "03-08 01:00 EST",
        "03-08 03:00 EDT",
        "03-08 04:00 EDT",
    ]
    assert runs("0 * * * *", "Europe/London", "2026-03-29 00:00", 3) == [
        "03-29 02:00 BST",
        "03-29 03:00 BST",
        "03-29 04:00 BST",
    ]


def test_weekly_monday_nine_new_york_keeps_its_wall_time_across_dst() -> None:
    assert runs("0 9 * * 1", "America/New_York", "2026-10-25 12:00", 3) == [
        "10-26 09:00 EDT",
        "11-02 09:00 EST",
        "11-09 09:00 EST",
    ]
    assert recurring.next_run("0 9 * * 1", "America/New_York", utc("2026-10-27 00:00")) == utc(
        "2026-11-02 14:00"
    )


@pytest.mark.parametrize("expression", ["0 9 * *", "61 * * * *", "0 9 * * 1 2026", "hello", "0 0 30 2 *"])
def test_invalid_cron_is_refused_with_a_clear_message(expression: str) -> None:
    with pytest.raises(recurring.InvalidCron, match="field|valid|never"):
        recurring.validate_cron(expression)


def test_one_claim_takes_each_due_unit_once_even_with_concurrent_claimers(redis) -> None:  # noqa: ANN001
    past = timezone.now() - timedelta(seconds=1)
    schedule_index.add(
        [(f"m:{n}", past) for n in range(5000)] + [("m:future", timezone.now() + timedelta(hours=1))]
    )
    claimed: list[str] = []
    claims = 0
    lock = threading.Lock()

    def claimer(_: int) -> None:
        nonlocal claims
        while True:
            claim = schedule_index.claim(137, lease_seconds=30)
            if not claim.units:
                return
            with lock:
                claimed.extend(str(u) for u in claim.units)
                claims += 1

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(claimer, range(4)))
    assert sorted(claimed) == sorted(f"m:{n}" for n in range(5000))
    assert schedule_index.sizes() == {"due": 1, "leased": claims} and claims >= 5000 // 137


def test_expired_claims_are_reaped_back_and_acked_ones_are_not(redis) -> None:  # noqa: ANN001
    import time as clock

    schedule_index.add([("m:1", timezone.now())])
    acked = schedule_index.claim(10, lease_seconds=0.01)
    schedule_index.add([("m:2", timezone.now()), ("m:3", timezone.now())])
    schedule_index.claim(10, lease_seconds=0.01)  # its claimer dies: never acked
    schedule_index.ack(acked)
    clock.sleep(0.05)
    assert schedule_index.reap() == 2
    assert sorted(str(u) for u in schedule_index.claim(10, 30).units) == ["m:2", "m:3"]
    assert schedule_index.reap() == 0


@pytest.mark.django_db(transaction=True)
def test_dispatching_a_unit_twice_queues_its_message_once(redis) -> None:  # noqa: ANN001
    message = Message.objects.create(
        to_email="a@example.com",
        subject="s",
        text="t",
        priority="high",
        status="scheduled",
        due_at=timezone.now(),
    )
    unit = schedule_index.Unit("m", message.pk)
    assert dispatch([unit]) == 1
    assert dispatch([unit]) == 0
    assert queued_tasks(redis, "high") == [("delivery.send_messages", [[message.pk]])]


@pytest.mark.django_db(transaction=True)
def test_a_delayed_message_is_indexed_after_commit(api, redis) -> None:  # noqa: ANN001
    send_at = timezone.now() + timedelta(minutes=5)
    body = {"to": "a@example.com", "subject": "later", "text": "t", "send_at": send_at.isoformat()}
    message_id = api.post("/api/v1/messages", body, format="json").json()["id"]
    assert redis.zscore(schedule_index.DUE, f"m:{message_id}") == pytest.approx(send_at.timestamp(), abs=0.01)


@pytest.mark.django_db(transaction=True)
def test_flushall_loses_nothing_the_reconciler_rebuilds_the_index_and_the_queues(redis) -> None:  # noqa: ANN001
    reconciler.reconcile()  # the marker exists: Redis has its data
    due = timezone.now() + timedelta(minutes=1)
    scheduled = Message.objects.create(
        to_email="s@example.com", subject="s", text="t", priority="low", status="scheduled", due_at=due
    )
    retrying = Message.objects.create(
        to_email="r@example.com", subject="s", text="t", priority="high", status="retry_wait", due_at=due
    )
    queued = Message.objects.create(
        to_email="q@example.com", subject="s", text="t", priority="critical", status="queued"
    )
    campaign = make_campaign(make_audience(2))
    lifecycle.schedule(campaign.pk, "at", due)
    redis.flushdb()  # all of emailhub's Redis data (FLUSHDB spares other users' databases)

    result = reconciler.reconcile()
    assert result.redis_was_reset and result.units_added == 3 and result.republished == 1
    assert {m.decode() for m in redis.zrange(schedule_index.DUE, 0, -1)} == {
        f"m:{scheduled.pk}",
        f"m:{retrying.pk}",
        f"a:{campaign.pk}",
    }
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[queued.pk]])]
    assert reconciler.reconcile().units_added == 0  # nothing missing any more


@pytest.mark.django_db(transaction=True)
def test_a_unit_re_added_by_the_reconciler_while_in_flight_still_sends_once(redis) -> None:  # noqa: ANN001
    reconciler.reconcile()  # Redis has its data
    message = Message.objects.create(
        to_email="a@example.com", subject="s", text="t", status="scheduled", due_at=timezone.now()
    )
    schedule_index.add([(f"m:{message.pk}", message.due_at)])
    first = schedule_index.claim(10, 30)  # being dispatched…
    assert reconciler.reconcile().units_added == 1  # …when the reconciler sees the row still scheduled
    second = schedule_index.claim(10, 30)
    assert dispatch(first.units) == 1 and dispatch(second.units) == 0
    schedule_index.ack(first)
    schedule_index.ack(second)
    assert queued_tasks(redis, "normal") == [("delivery.send_messages", [[message.pk]])]
    assert schedule_index.sizes() == {"due": 0, "leased": 0}


@pytest.mark.usefixtures("far_horizon")
@pytest.mark.django_db(transaction=True)
def test_local_time_campaign_becomes_one_slot_per_distinct_instant(redis) -> None:  # noqa: ANN001
    zones = [
        "America/New_York",
        "Europe/London",
        "Australia/Lord_Howe",
        "Asia/Kathmandu",
        "Asia/Tokyo",
        "America/Los_Angeles",
    ]
    audience = make_audience(600)
    with connection.cursor() as cursor:
        for index, name in enumerate(zones):
            cursor.execute(
                "UPDATE campaigns_contact SET timezone = %s WHERE id IN (SELECT contact_id FROM campaigns_listmembership WHERE contact_list_id = %s) AND id %% 6 = %s",
                [name, audience.pk, index],
            )
    campaign = make_campaign(audience)
    lifecycle.schedule(campaign.pk, "local_time", local_date=date(2030, 3, 5), local_time=time(9, 0))
    fanout.fan_out(campaign.pk)
    expected = {name: localize(datetime(2030, 3, 5, 9), zone(name)) for name in zones}
    rows = Message.objects.filter(campaign=campaign).select_related("contact")
    assert rows.count() == 600 and {m.status for m in rows} == {"scheduled"}
    assert all(m.due_at == expected[m.contact.timezone] for m in rows)
    slots = {m.decode() for m in redis.zrange(schedule_index.DUE, 0, -1)}
    assert {f"c:{campaign.pk}:{int(d.timestamp())}" for d in expected.values()} <= slots
    assert len(slots) < 60  # one unit per distinct instant over ~600 zones, not one per message
    campaign.refresh_from_db()
    assert campaign.status == "sending" and campaign.total_count == 600


@pytest.mark.django_db(transaction=True)
def test_local_time_skip_policy_excludes_recipients_whose_time_has_passed(redis) -> None:  # noqa: ANN001
    audience = make_audience(10)
    Contact.objects.filter(email__in=["r1@example.com", "r2@example.com"]).update(
        timezone="Pacific/Kiritimati"
    )  # UTC+14
    campaign = make_campaign(audience)
    today = timezone.now().astimezone(zone("Pacific/Kiritimati")).date()
    lifecycle.schedule(
        campaign.pk, "local_time", local_date=today, local_time=time(0, 0), past_time_policy="skip"
    )
    fanout.fan_out(campaign.pk)
    # Midnight today has passed everywhere it is already `today`; UTC contacts are skipped too
    # unless today is still ahead of them, so only count what the rule says.
    created = set(Message.objects.filter(campaign=campaign).values_list("to_email", flat=True))
    assert not {"r1@example.com", "r2@example.com"} & created
    campaign.refresh_from_db()
    assert campaign.excluded_count == 10 - len(created)


@pytest.mark.django_db(transaction=True)
def test_two_beats_ticking_at_once_create_one_campaign_per_occurrence(redis) -> None:  # noqa: ANN001
    audience = make_audience(3)
    template = make_campaign(audience).template
    schedule_row = RecurringSchedule.objects.create(
        name="digest", cron="0 9 * * 1", timezone="America/New_York", template=template, contact_list=audience,
        next_run=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    barrier = threading.Barrier(2)

    def beat(_: int) -> int:
        barrier.wait()
        try:
            return recurring.run_due()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        created = sum(pool.map(beat, range(2)))
    assert created == 1
    assert ScheduleOccurrence.objects.filter(schedule=schedule_row).count() == 1
    assert Campaign.objects.filter(occurrence__schedule=schedule_row, status="sending").count() == 1
    schedule_row.refresh_from_db()
    assert (
        schedule_row.next_run > timezone.now()
        and schedule_row.next_run.astimezone(zone("America/New_York")).hour == 9
    )
    # The same occurrence once more (a beat that read the old next_run): nothing new.
    assert recurring.fire(schedule_row, schedule_row.last_run) is False


@pytest.mark.django_db(transaction=True)
def test_missed_occurrences_after_downtime_collapse_into_one_run(redis) -> None:  # noqa: ANN001
    audience = make_audience(1)
    template = make_campaign(audience).template
    row = RecurringSchedule.objects.create(
        name="hourly", cron="0 * * * *", timezone="UTC", template=template, contact_list=audience,
        next_run=timezone.now() - timedelta(hours=5),
    )  # fmt: skip
    assert recurring.run_due() == 1
    assert recurring.run_due() == 0
    row.refresh_from_db()
    assert row.next_run > timezone.now()


@pytest.mark.django_db
def test_recurring_schedule_api_validates_and_shows_next_run(api) -> None:  # noqa: ANN001
    audience = make_audience(1)
    make_campaign(audience)
    body = {
        "name": "weekly",
        "cron": "0 9 * * 1",
        "timezone": "America/New_York",
        "template": "newsletter",
        "contact_list": audience.pk,
    }
    created = api.post("/api/v1/recurring-schedules", body, format="json")
    assert created.status_code == 201, created.json()
    next_run = datetime.fromisoformat(created.json()["next_run"].replace("Z", "+00:00"))
    assert next_run.astimezone(zone("America/New_York")).strftime("%a %H:%M") == "Mon 09:00"
    bad = api.post(
        "/api/v1/recurring-schedules", {**body, "cron": "0 9 * *", "timezone": "Mars/Olympus"}, format="json"
    )
    assert bad.status_code == 400 and {"cron", "timezone"} <= set(bad.json()["error"]["fields"])
    assert RecurringSchedule.objects.count() == 1


def test_recurring_schedule_api_rename_keeps_the_beats_due_occurrence_and_a_new_cron_moves_it(
    api,  # noqa: ANN001
) -> None:
    audience = make_audience(1)
    campaign = make_campaign(audience)
    due = (timezone.now() - timedelta(minutes=1)).replace(microsecond=0)
    row = RecurringSchedule.objects.create(
        name="daily", cron="0 9 * * *", timezone="UTC", template=campaign.template,
        contact_list=audience, next_run=due, last_run=due - timedelta(days=1),
    )  # fmt: skip
    url = f"/api/v1/recurring-schedules/{row.pk}"
    renamed = api.patch(url, {"name": "daily digest", "cron": "0 9 * * *"}, format="json")
    assert renamed.status_code == 200, renamed.json()
    row.refresh_from_db()
    # The same rule as the admin's save (recurring.update_schedule): an unchanged rule keeps
    # the occurrence that is due, so the beat still fires it.
    assert (row.name, row.next_run, row.last_run) == ("daily digest", due, due - timedelta(days=1))
    moved = api.patch(url, {"cron": "0 10 * * *"}, format="json")
    assert moved.status_code == 200, moved.json()
    row.refresh_from_db()
    assert row.next_run is not None and row.next_run > timezone.now() and row.next_run.hour == 10
    assert moved.json()["next_run"] == row.next_run.isoformat().replace("+00:00", "Z")


@pytest.mark.usefixtures("far_horizon")
@pytest.mark.django_db(transaction=True)
def test_schedule_dashboard_has_the_source_design_shape_with_real_counts(api, redis) -> None:  # noqa: ANN001
    audience = make_audience(4)
    campaign = make_campaign(audience)
    RecurringSchedule.objects.create(
        name="r",
        cron="*/5 * * * *",
        timezone="UTC",
        template=campaign.template,
        contact_list=audience,
        next_run=timezone.now() + timedelta(minutes=5),
    )
    lifecycle.schedule(campaign.pk, "local_time", local_date=date(2031, 1, 1), local_time=time(9))
    fanout.fan_out(campaign.pk)
    Message.objects.create(
        to_email="x@example.com",
        subject="s",
        text="t",
        priority="critical",
        status="sending",
        claimed_at=timezone.now(),
    )
    Message.objects.create(
        to_email="y@example.com",
        subject="s",
        text="t",
        priority="low",
        status="retry_wait",
        due_at=timezone.now() - timedelta(seconds=1),
    )
    redis.lpush("normal", "fake-task-1", "fake-task-2")

    body = api.get("/api/v1/schedules").json()
    assert set(body) >= {"schedules", "queue_snapshot"}
    kinds = {row["type"]: row for row in body["schedules"]}
    assert set(kinds["recurring"]) >= {
        "id",
        "campaign_id",
        "type",
        "cron",
        "scheduled_at",
        "next_run",
        "last_run",
        "status",
        "pending_count",
    }
    assert kinds["recurring"]["cron"] == "*/5 * * * *" and kinds["recurring"]["status"] == "active"
    assert kinds["scheduled"]["campaign_id"] == campaign.pk and kinds["scheduled"]["pending_count"] == 4
    assert body["queue_snapshot"]["critical"] == {"pending": 0, "processing": 1}
    # Counted in messages: the two broker entries are not messages, the 4 local-time rows not due.
    assert body["queue_snapshot"]["normal"]["pending"] == 0
    assert body["queue_snapshot"]["low"] == {"pending": 1, "processing": 0}
    only = api.get("/api/v1/schedules", {"type": "recurring"}).json()["schedules"]
    assert [row["type"] for row in only] == ["recurring"]
    assert api.get("/api/v1/schedules", {"type": "weekly"}).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_a_unit_that_comes_early_is_re_indexed_at_its_real_due_time(redis) -> None:  # noqa: ANN001
    later = timezone.now() + timedelta(minutes=10)
    message = Message.objects.create(
        to_email="a@example.com", subject="s", text="t", status="retry_wait", due_at=later
    )
    assert dispatch([schedule_index.Unit("m", message.pk)]) == 0
    assert Message.objects.get(pk=message.pk).status == "retry_wait"
    assert redis.zscore(schedule_index.DUE, f"m:{message.pk}") == pytest.approx(later.timestamp(), abs=0.01)


@pytest.mark.django_db(transaction=True)
def test_republish_queued_command_publishes_every_queued_message(redis) -> None:  # noqa: ANN001
    from io import StringIO

    from django.core.management import call_command

    ids = [
        Message.objects.create(to_email=f"q{n}@example.com", subject="s", text="t", priority="high").pk
        for n in range(3)
    ]
    out = StringIO()
    call_command("republish_queued", stdout=out)
    assert "3 queued message(s)" in out.getvalue()
    assert sorted(i for _, args in queued_tasks(redis, "high") for i in args[0]) == sorted(ids)
