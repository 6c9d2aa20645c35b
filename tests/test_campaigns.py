"""Campaign fan-out, state changes and batch sending, in-process on the real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import redis as redis_lib
from django.conf import settings
from django.db import connection, transaction

from campaigns import fanout, lifecycle
from campaigns.exceptions import CampaignStateError
from campaigns.models import Campaign, Contact, Suppression
from core.models import OutboxTask
from delivery.models import Message
from delivery.services import transitions
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests.broker import queued_tasks
from tests.factories import make_audience, make_campaign, sending

pytestmark = pytest.mark.django_db(transaction=True)


def published_batches(queue: str = "normal") -> list[list[int]]:
    """Take every send task waiting in the broker queue; return their id batches."""
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    batches = [args[0] for name, args in queued_tasks(client, queue) if name == "delivery.send_messages"]
    client.delete(queue)
    return batches


def send_batches(queue: str = "normal") -> None:
    """Run the send tasks waiting in the broker, as a worker would."""
    for batch in published_batches(queue):
        send_messages(batch)


def test_fan_out_makes_one_message_per_active_unsuppressed_member_in_task_sized_batches(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_BATCH_SIZES = {**settings.EMAILHUB_BATCH_SIZES, "normal": 7}
    audience = make_audience(100)
    Suppression.objects.create(email="r3@example.com", reason="unsubscribed")
    Contact.objects.filter(email="r5@example.com").update(status="bounced")
    campaign = sending(make_campaign(audience))
    report = fanout.fan_out(campaign.pk, step_size=30)
    assert report.finished and report.members == 100 and report.created == 98
    emails = set(Message.objects.filter(campaign=campaign).values_list("to_email", flat=True))
    assert len(emails) == 98 and not {"r3@example.com", "r5@example.com"} & emails
    assert (
        Message.objects.filter(campaign=campaign, status="queued", template=campaign.template).count() == 98
    )
    batches = published_batches()
    assert not OutboxTask.objects.exists()  # published after each step's commit
    assert all(len(batch) <= 7 for batch in batches) and sum(len(b) for b in batches) == 98
    campaign.refresh_from_db()
    assert (campaign.total_count, campaign.excluded_count, campaign.fanout_done) == (98, 2, True)


def test_an_interrupted_fan_out_resumes_at_its_cursor_without_duplicates() -> None:
    campaign = sending(make_campaign(make_audience(1000)))
    assert fanout.fan_out(campaign.pk, step_size=300, max_steps=2).created == 600
    Campaign.objects.filter(pk=campaign.pk).update(fanout_cursor=0)  # even a replay from the start…
    assert fanout.fan_out(campaign.pk, step_size=300).finished
    assert Message.objects.filter(campaign=campaign).count() == 1000  # …creates nothing twice
    campaign.refresh_from_db()
    assert campaign.total_count == 1000


def test_a_second_fan_out_of_the_same_campaign_backs_off() -> None:
    campaign = sending(make_campaign(make_audience(50)))
    holding, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [fanout.LOCK_CLASS, campaign.pk])
            holding.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    holding.wait(10)
    try:
        assert fanout.fan_out(campaign.pk).steps == 0
    finally:
        release.set()
        thread.join()
    assert Message.objects.count() == 0


def test_a_message_inserted_outside_fan_out_while_a_step_runs_is_skipped_not_a_failure(caplog) -> None:  # noqa: ANN001
    """The anti-join cannot see another transaction's uncommitted row; the step's INSERT then
    waits for it and meets UNIQUE(campaign, contact), and the step runs again with ON CONFLICT."""
    audience = make_audience(10)
    campaign = sending(make_campaign(audience))
    member = Contact.objects.get(email="r3@example.com")
    inserted, release = threading.Event(), threading.Event()

    def insert_and_hold() -> None:
        try:
            with transaction.atomic():
                Message.objects.create(
                    campaign=campaign,
                    contact=member,
                    to_email=member.email,
                    priority="normal",
                    status="queued",
                )
                inserted.set()
                release.wait(10)  # committed while the step's INSERT waits on the unique index
        finally:
            connection.close()

    thread = threading.Thread(target=insert_and_hold)
    thread.start()
    assert inserted.wait(10)
    timer = threading.Timer(1.0, release.set)
    timer.start()
    try:
        report = fanout.fan_out(campaign.pk)
    finally:
        release.set()
        thread.join()
    assert report.finished and report.created == 9
    assert Message.objects.filter(campaign=campaign).count() == 10
    assert Message.objects.filter(campaign=campaign, contact=member).count() == 1
    assert "inserted outside fan-out" in caplog.text
    campaign.refresh_from_db()
    assert (campaign.total_count, campaign.excluded_count) == (9, 1)


def test_fan_out_stops_at_the_next_step_once_paused() -> None:
    campaign = sending(make_campaign(make_audience(100)))
    fanout.fan_out(campaign.pk, step_size=10, max_steps=1)
    lifecycle.pause(campaign.pk)
    assert fanout.fan_out(campaign.pk, step_size=10).steps == 0
    assert Message.objects.count() == 10


def test_campaign_messages_render_per_contact_and_the_campaign_completes(smtp: SMTPTestServer) -> None:
    campaign = sending(make_campaign(make_audience(25)))
    fanout.fan_out(campaign.pk)
    send_batches()
    messages = smtp.wait_for(25)
    by_to = {m.rcpt_tos[0]: m.parsed() for m in messages}
    assert by_to["r7@example.com"]["Subject"] == "Hello Name7"
    campaign.refresh_from_db()
    assert (campaign.status, campaign.sent_count, campaign.percent_done) == ("completed", 25, 100.0)
    assert campaign.completed_at is not None


def test_paused_campaign_messages_are_not_claimed_and_resume_publishes_them_again(
    smtp: SMTPTestServer,
) -> None:
    campaign = sending(make_campaign(make_audience(20)))
    fanout.fan_out(campaign.pk)
    lifecycle.pause(campaign.pk)
    send_batches()  # the tasks run while paused: they claim nothing
    assert smtp.count == 0 and Message.objects.filter(status="queued").count() == 20
    lifecycle.resume(campaign.pk)
    assert transitions.republish_queued(campaign.pk) == 20
    send_batches()
    assert sorted(m.rcpt_tos[0] for m in smtp.wait_for(20)) == sorted(
        f"r{n}@example.com" for n in range(1, 21)
    )
    campaign.refresh_from_db()
    assert campaign.status == "completed" and campaign.sent_count == 20


def test_cancel_marks_what_is_left_cancelled_and_it_is_never_sent(smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_BATCH_SIZES = {**settings.EMAILHUB_BATCH_SIZES, "normal": 10}
    campaign = sending(make_campaign(make_audience(30)))
    fanout.fan_out(campaign.pk)
    first, *rest = published_batches()
    send_messages(first)
    lifecycle.cancel(campaign.pk)
    for batch in rest:
        send_messages(batch)
    campaign.refresh_from_db()
    assert campaign.status == "cancelled"
    assert campaign.sent_count == len(first) == smtp.count
    assert campaign.cancelled_count == 30 - smtp.count == Message.objects.filter(status="cancelled").count()


@pytest.mark.parametrize(
    ("action", "from_status"),
    [("pause", "draft"), ("resume", "sending"), ("cancel", "completed"), ("schedule", "sending")],
)
def test_a_change_from_the_wrong_state_is_refused(action: str, from_status: str) -> None:
    campaign = make_campaign(make_audience(1))
    Campaign.objects.filter(pk=campaign.pk).update(status=from_status)
    call = (
        (lambda: lifecycle.schedule(campaign.pk, "immediate"))
        if action == "schedule"
        else (lambda: getattr(lifecycle, action)(campaign.pk))
    )
    with pytest.raises(CampaignStateError, match=from_status):
        call()


def test_a_stalled_fan_out_is_published_again() -> None:
    campaign = sending(make_campaign(make_audience(5)))
    assert lifecycle.resume_stalled_fanouts(stale_seconds=3600) == 0
    assert lifecycle.resume_stalled_fanouts(stale_seconds=0) == 1
    assert queued_tasks(redis_lib.Redis.from_url(settings.REDIS_URL), "campaigns") == [
        ("campaigns.fan_out", [campaign.pk])
    ]


def test_scheduled_campaign_starts_only_when_due() -> None:
    from datetime import timedelta

    from django.utils import timezone

    campaign = make_campaign(make_audience(3))
    lifecycle.schedule(campaign.pk, "at", timezone.now() + timedelta(hours=1))
    assert lifecycle.start_campaigns([campaign.pk]) == []
    Campaign.objects.filter(pk=campaign.pk).update(scheduled_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.start_campaigns([campaign.pk]) == [campaign.pk]
    assert lifecycle.start_campaigns([campaign.pk]) == []  # twice: started once
    assert Campaign.objects.get(pk=campaign.pk).status == "sending"


def test_a_campaign_paused_as_its_last_messages_finish_completes_when_resumed(smtp: SMTPTestServer) -> None:
    campaign = sending(make_campaign(make_audience(5)))
    fanout.fan_out(campaign.pk)
    [batch] = published_batches()
    from delivery.services import sending as sending_service

    original_claim = sending_service.claim

    def claim_then_pause(ids):  # noqa: ANN001, ANN202
        claimed = original_claim(ids)  # a worker has the last batch in hand…
        lifecycle.pause(campaign.pk)  # …when the campaign is paused; the batch still finishes
        return claimed

    sending_service.claim = claim_then_pause
    try:
        send_messages(batch)
    finally:
        sending_service.claim = original_claim
    campaign.refresh_from_db()
    assert (campaign.status, campaign.sent_count) == ("paused", 5)  # done, but not `sending`
    lifecycle.resume(campaign.pk)
    from campaigns.tasks import fan_out as fan_out_task

    fan_out_task(campaign.pk, requeue=True)  # what resume published
    campaign.refresh_from_db()
    assert campaign.status == "completed" and campaign.completed_at is not None


def test_a_retry_recorded_after_its_campaign_was_cancelled_is_cancelled_and_counted(
    smtp: SMTPTestServer,
) -> None:
    smtp.reply_to_everyone("451 4.3.0 try later")
    campaign = sending(make_campaign(make_audience(3)))
    fanout.fan_out(campaign.pk)
    [batch] = published_batches()
    from delivery.services import sending as sending_service

    original_claim = sending_service.claim

    def claim_then_cancel(ids):  # noqa: ANN001, ANN202
        claimed = original_claim(ids)
        lifecycle.cancel(campaign.pk)  # the operator cancels while the batch is at the provider
        return claimed

    sending_service.claim = claim_then_cancel
    try:
        send_messages(batch)
    finally:
        sending_service.claim = original_claim
    statuses = set(Message.objects.filter(campaign=campaign).values_list("status", flat=True))
    assert statuses == {"cancelled"}
    campaign.refresh_from_db()
    assert campaign.cancelled_count == 3
