from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from core import outbox
from core.models import OutboxTask
from delivery.models import Message, MessageStatus
from delivery.services import send_tasks
from delivery.services.sweeps import requeue_stale_sending
from tests.broker import broker_unreachable, queued_tasks

# Both publishers: Celery's send_task and fastpaths/publish.py's own messages.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_paths")]


def test_event_is_published_after_commit_and_then_deleted(redis) -> None:  # noqa: ANN001
    with transaction.atomic():
        send_tasks.record_send([1, 2], "high")
        assert queued_tasks(redis, "high") == []  # nothing leaves before the commit
    assert queued_tasks(redis, "high") == [("delivery.send_messages", [[1, 2]])]
    assert OutboxTask.objects.count() == 0


def test_rolled_back_transaction_publishes_nothing(redis) -> None:  # noqa: ANN001
    with pytest.raises(RuntimeError), transaction.atomic():
        send_tasks.record_send([1], "critical")
        raise RuntimeError("rollback")
    assert queued_tasks(redis, "critical") == []
    assert OutboxTask.objects.count() == 0


def test_unreachable_broker_leaves_the_row_for_the_relay(redis) -> None:  # noqa: ANN001
    with broker_unreachable():
        with transaction.atomic():
            send_tasks.record_send([7], "critical")
    assert OutboxTask.objects.count() == 1
    OutboxTask.objects.update(created_at=timezone.now() - timedelta(seconds=10))
    assert outbox.relay() == 1
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[7]])]
    assert OutboxTask.objects.count() == 0


def test_relay_leaves_fresh_rows_to_the_on_commit_publisher(redis) -> None:  # noqa: ANN001
    OutboxTask.objects.create(kind="send_messages", payload={"ids": [1], "priority": "low"})
    assert outbox.relay() == 0
    assert OutboxTask.objects.count() == 1


def test_messages_left_sending_by_a_dead_worker_are_requeued(redis, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_SENDING_LEASE_SECONDS = 60
    stale = Message.objects.create(
        to_email="a@example.com", priority="high", status=MessageStatus.SENDING,
        claimed_at=timezone.now() - timedelta(seconds=120), attempts=1,
    )  # fmt: skip
    fresh = Message.objects.create(
        to_email="b@example.com", priority="high", status=MessageStatus.SENDING, claimed_at=timezone.now()
    )
    assert requeue_stale_sending() == 1
    assert Message.objects.get(pk=stale.pk).status == "queued"
    assert Message.objects.get(pk=fresh.pk).status == "sending"
    assert queued_tasks(redis, "high") == [("delivery.send_messages", [[stale.pk]])]


def test_a_message_stuck_sending_at_its_last_attempt_fails_and_moves_its_campaign(redis, settings) -> None:  # noqa: ANN001
    from campaigns.models import Campaign
    from tests.factories import make_audience, make_campaign

    settings.EMAILHUB_SENDING_LEASE_SECONDS = 60
    settings.EMAILHUB_MAX_ATTEMPTS = 3
    campaign = make_campaign(make_audience(1))
    Campaign.objects.filter(pk=campaign.pk).update(status="sending", fanout_done=True, total_count=1)
    stuck = Message.objects.create(
        to_email="a@example.com", campaign=campaign, priority="normal", status=MessageStatus.SENDING,
        claimed_at=timezone.now() - timedelta(seconds=120), attempts=3,
    )  # fmt: skip
    assert requeue_stale_sending() == 0
    stuck.refresh_from_db()
    assert stuck.status == "failed" and "worker died" in stuck.last_error
    campaign.refresh_from_db()
    assert (campaign.failed_count, campaign.status) == (1, "completed")
    assert queued_tasks(redis, "normal") == []


def test_each_app_registers_its_event_kinds_and_the_outbox_names_no_task() -> None:
    kinds = outbox.registered_kinds()
    assert (kinds["send_messages"], kinds["fan_out"]) == ("delivery.send_messages", "campaigns.fan_out")
    source = Path(outbox.__file__).read_text()
    assert "delivery." not in source.replace("core_outboxtask", "") and "campaigns." not in source


def test_a_registered_kind_is_published_to_its_task_and_queue(redis) -> None:  # noqa: ANN001
    outbox.register_kind("test_ping", "tests.ping", args=lambda p: [p["n"]], queue=lambda p: "system")
    with transaction.atomic():
        outbox.record("test_ping", {"n": 3})
    assert queued_tasks(redis, "system") == [("tests.ping", [3])]
    assert OutboxTask.objects.count() == 0


def test_an_unregistered_kind_is_refused_before_a_row_exists() -> None:
    with pytest.raises(ValueError, match="unknown outbox task kind 'nobody'"), transaction.atomic():
        outbox.record("nobody", {})
    assert OutboxTask.objects.count() == 0


def test_a_kind_cannot_be_registered_for_a_second_task() -> None:
    with pytest.raises(ValueError, match="already registered for delivery.send_messages"):
        outbox.register_kind("send_messages", "elsewhere.task", args=list, queue=lambda p: "low")


def test_the_outbox_builds_no_task_message_itself() -> None:
    # Its publishers do: Celery's send_task, or fastpaths/publish.py behind the same interface.
    source = Path(outbox.__file__).read_text()
    assert "argsrepr" not in source and "producer.publish(" not in source and "from kombu" not in source
