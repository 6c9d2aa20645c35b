"""Campaigns on real processes: bulk workers, a fan-out worker that gets killed, aiosmtpd."""

from __future__ import annotations

from collections import Counter

import pytest
import redis as redis_lib

from campaigns import lifecycle
from campaigns.models import Campaign, Suppression
from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import PROCESSES, Stack, with_option
from tests.conftest import wait_until
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.processes


def start_bulk(stack: Stack, queues: str = "normal,low,campaigns", key: str = "bulk", **env: str) -> None:
    argv = with_option(PROCESSES["worker-bulk"], "-Q", queues)
    argv = with_option(argv, "-n", f"{key}@%h")
    stack.start("worker-bulk", argv, key=key, extra_env=env)


def campaign_state(campaign: Campaign) -> Campaign:
    campaign.refresh_from_db()
    return campaign


def recipients(smtp: SMTPTestServer) -> Counter[str]:
    return Counter(m.rcpt_tos[0] for m in smtp.messages)


def settled(campaign: Campaign, redis: redis_lib.Redis) -> bool:
    """No batch of the campaign in flight and no task left in the bulk queues: every task the
    worker had (sent before the pause or cancel, or republished) has run. What it has not sent by
    then it never will: a claim after the change claims nothing of this campaign."""
    return not Message.objects.filter(campaign=campaign, status="sending").exists() and not any(
        redis.llen(queue) for queue in ("normal", "low", "campaigns")
    )


def test_pause_stops_deliveries_and_resume_completes_without_duplicates(
    stack: Stack, smtp: SMTPTestServer, redis: redis_lib.Redis
) -> None:
    size = 3000
    campaign = make_campaign(make_audience(size))
    # A send-rate quota slows the campaign down (~240/s for bulk) so there is time to pause it.
    start_bulk(stack, SMTP_MAX_SEND_RATE="300")
    lifecycle.schedule(campaign.pk, "immediate")
    wait_until(lambda: smtp.count >= 300, 30, "the campaign to get going")

    lifecycle.pause(campaign.pk)
    wait_until(lambda: settled(campaign, redis), 30, "the batches in flight and the queued tasks")
    # Everything delivered is what was recorded sent; the rest waits, unclaimed.
    sent = Message.objects.filter(campaign=campaign, status="sent").count()
    assert smtp.count == sent < size
    assert campaign_state(campaign).status == "paused"

    lifecycle.resume(campaign.pk)
    wait_until(lambda: campaign_state(campaign).status == "completed", 60, "the campaign to complete")
    delivered = recipients(smtp)
    assert len(delivered) == size and set(delivered.values()) == {1}  # everyone, once
    campaign = campaign_state(campaign)
    assert (campaign.sent_count, campaign.total_count, campaign.percent_done) == (size, size, 100.0)


def test_cancel_stops_the_campaign_and_the_rest_is_never_sent(
    stack: Stack, smtp: SMTPTestServer, redis: redis_lib.Redis
) -> None:
    size = 3000
    campaign = make_campaign(make_audience(size))
    start_bulk(stack, SMTP_MAX_SEND_RATE="300")
    lifecycle.schedule(campaign.pk, "immediate")
    wait_until(lambda: smtp.count >= 300, 30, "the campaign to get going")

    lifecycle.cancel(campaign.pk)
    wait_until(lambda: settled(campaign, redis), 30, "the batches in flight and the queued tasks")
    campaign = campaign_state(campaign)
    statuses = Counter(Message.objects.filter(campaign=campaign).values_list("status", flat=True))
    assert campaign.status == "cancelled" and set(statuses) <= {"sent", "cancelled"}
    assert statuses["sent"] == campaign.sent_count == smtp.count < size
    assert statuses["cancelled"] == campaign.cancelled_count == campaign.total_count - campaign.sent_count


def test_fan_out_killed_half_way_resumes_with_exactly_one_message_per_recipient(
    stack: Stack, smtp: SMTPTestServer
) -> None:
    size = 10_000
    campaign = make_campaign(make_audience(size))
    Suppression.objects.bulk_create(
        [Suppression(email=f"r{n}@example.com", reason="unsubscribed") for n in range(1, size + 1, 50)]
    )
    expected = size - len(range(1, size + 1, 50))
    start_bulk(stack, "normal", key="sender")
    # Beat's outbox relay publishes the send tasks of a step that committed just before the kill
    # (fan-out publishes a step's tasks in the background while the next step runs).
    stack.start("worker-transactional")  # consumes the `system` queue the relay runs on
    stack.start("beat")
    start_bulk(stack, "campaigns", key="fanout", EMAILHUB_FANOUT_STEP="100")
    lifecycle.schedule(campaign.pk, "immediate")

    wait_until(lambda: campaign_state(campaign).total_count >= 1000, 30, "fan-out to be under way")
    stack.kill("fanout")  # SIGKILL, as a crash would
    campaign = campaign_state(campaign)
    assert not campaign.fanout_done and campaign.total_count < expected

    start_bulk(stack, "campaigns", key="fanout-again", EMAILHUB_FANOUT_STEP="2000")
    assert lifecycle.resume_stalled_fanouts(stale_seconds=0) == 1  # what beat's sweep does
    wait_until(lambda: campaign_state(campaign).status == "completed", 90, "the campaign to complete")

    assert Message.objects.filter(campaign=campaign).count() == expected
    delivered = recipients(smtp)
    assert len(delivered) == expected and set(delivered.values()) == {1}
    assert not {f"r{n}@example.com" for n in range(1, size + 1, 50)} & set(delivered)
    campaign = campaign_state(campaign)
    assert (campaign.total_count, campaign.sent_count, campaign.excluded_count) == (
        expected,
        expected,
        size - expected,
    )
