"""Issue 20: the transactional pool's adaptive claim and its doorbell.

A critical or high task claims the pool's oldest waiting API messages, every critical one before
any high one, up to EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT (transitions.claim_pool); one message per
SMTP transaction and one outcome per message; while a doorbell task waits unstarted, accepted
messages publish none of their own (send_tasks, core.outbox `_answered`).
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection, transaction

from core import outbox
from core.models import OutboxTask
from delivery.models import Message, MessageStatus
from delivery.services import send_tasks, transitions
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests import factories
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def claim_limit(settings) -> int:  # noqa: ANN001
    settings.EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT = 5
    return 5


def queued_tasks(client: Any, queue: str) -> list[dict[str, Any]]:
    """The send tasks waiting in `queue`, oldest first: their args and kwargs."""
    tasks = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # kombu LPUSHes and BRPOPs
        envelope = json.loads(raw)
        if envelope["headers"]["task"] == send_tasks.SEND_MESSAGES_TASK:
            args, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
            tasks.append({"args": args, "kwargs": kwargs})
    return tasks


def waiting(count: int, priority: str, prefix: str) -> list[int]:
    return [m.pk for m in factories.messages(count, prefix=prefix, priority=priority)]


def test_a_message_alone_is_claimed_alone() -> None:
    [own] = waiting(1, "critical", "alone")
    assert [m.id for m in transitions.claim_pool([own], "critical", 5)] == [own]


def test_the_oldest_critical_messages_go_first_then_the_high_ones() -> None:
    high = waiting(3, "high", "h")  # older than every critical message
    critical = waiting(3, "critical", "c")
    # The task is the newest high message's; the claim takes what waits longest, by class.
    claimed = transitions.claim_pool([high[-1]], "high", 5)
    assert [m.id for m in claimed] == critical + high[:2]
    assert Message.objects.get(pk=high[-1]).status == MessageStatus.QUEUED  # past the limit


def test_a_high_task_never_takes_its_own_message_before_an_older_critical_one(settings) -> None:  # noqa: ANN001
    critical = waiting(7, "critical", "c")
    [own] = waiting(1, "high", "h")
    first = transitions.claim_pool([own], "high", 5)
    assert [m.id for m in first] == critical[:5]
    second = transitions.claim_pool([own], "high", 5)
    assert [m.id for m in second] == [*critical[5:], own]


def test_bulk_messages_and_scheduled_ones_are_never_in_the_pool() -> None:
    normal = waiting(2, "normal", "n")
    scheduled = factories.message("later@example.com", status=MessageStatus.SCHEDULED).pk
    [own] = waiting(1, "critical", "c")
    assert [m.id for m in transitions.claim_pool([own], "critical", 5)] == [own]
    assert set(Message.objects.filter(pk__in=[*normal, scheduled]).values_list("status", flat=True)) == {
        MessageStatus.QUEUED,
        MessageStatus.SCHEDULED,
    }


def test_a_campaigns_own_ids_follow_the_api_messages_of_its_priority() -> None:
    campaign = factories.sending_campaign(factories.make_audience(2, name="pool"), name="pool")
    own = [m.pk for m in factories.campaign_messages(campaign, status=MessageStatus.QUEUED)]
    Message.objects.filter(pk__in=own).update(priority="high")
    api_high = waiting(1, "high", "h")
    api_critical = waiting(1, "critical", "c")
    claimed = transitions.claim_pool(own, "high", 5)
    assert [m.id for m in claimed] == [*api_critical, *api_high, *own]


def test_two_claims_at_once_take_disjoint_batches_oldest_first() -> None:
    ids = waiting(10, "critical", "race")
    holding, done = threading.Event(), threading.Event()
    first: list[int] = []

    def hold_a_claim() -> None:
        try:
            with transaction.atomic():  # its rows stay locked until done is set
                first.extend(m.id for m in transitions.claim_pool([], "critical", 5))
                holding.set()
                done.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=hold_a_claim)
    thread.start()
    assert holding.wait(10)
    # Not blocked by the uncommitted claim: SKIP LOCKED passes over its rows.
    second = [m.id for m in transitions.claim_pool([], "critical", 5)]
    done.set()
    thread.join()
    assert first == ids[:5] and second == ids[5:]


def test_each_message_of_a_pool_claim_gets_its_own_transaction_and_outcome(smtp: SMTPTestServer) -> None:
    ids = waiting(5, "critical", "batch")
    smtp.reply_for("batch1@example.com", "550 5.1.1 no such user")
    smtp.reply_for("batch3@example.com", "451 4.3.0 mailbox busy")
    report = send_messages(ids[:1], priority="critical")
    assert (report.claimed, report.sent, report.failed, report.retrying) == (5, 3, 1, 1)
    by_recipient = {m.to_email: m for m in Message.objects.filter(pk__in=ids)}
    assert {to: m.status for to, m in by_recipient.items()} == {
        "batch0@example.com": MessageStatus.SENT,
        "batch1@example.com": MessageStatus.FAILED,
        "batch2@example.com": MessageStatus.SENT,
        "batch3@example.com": MessageStatus.RETRY_WAIT,
        "batch4@example.com": MessageStatus.SENT,
    }
    received = smtp.wait_for(3)
    # One SMTP transaction per message, in the claim's order, each with its own Message-ID.
    assert [m.rcpt_tos for m in received] == [
        ["batch0@example.com"],
        ["batch2@example.com"],
        ["batch4@example.com"],
    ]
    assert [m.parsed()["Message-ID"].strip("<>") for m in received] == [
        by_recipient[f"batch{n}@example.com"].provider_message_id for n in (0, 2, 4)
    ]


def test_a_task_claims_until_none_waits_and_each_full_claim_calls_for_help(
    smtp: SMTPTestServer,
    redis,  # noqa: ANN001
) -> None:
    ids = waiting(12, "critical", "chain")
    report = send_messages(ids[:1], priority="critical", wake=True)
    assert (report.claimed, report.sent) == (12, 12)  # claims of 5, 5, 2, then none (twice)
    assert Message.objects.filter(pk__in=ids, status=MessageStatus.SENT).count() == 12
    # The two full claims each published a task for another process to help; they find nothing.
    tasks = queued_tasks(redis, "critical")
    assert tasks == [{"args": [[]], "kwargs": {"priority": "critical", "wake": True}}] * 2
    assert send_messages([], priority="critical", wake=True).claimed == 0
    assert not OutboxTask.objects.exists()


def test_a_task_whose_time_is_up_hands_the_rest_to_a_new_one(smtp: SMTPTestServer, redis, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_TRANSACTIONAL_TASK_SECONDS = 0.0
    ids = waiting(7, "critical", "later")
    assert send_messages(ids[:1], priority="critical", wake=True).claimed == 5  # one claim, then time
    [task] = queued_tasks(redis, "critical")
    assert task["kwargs"]["wake"] is True
    assert Message.objects.filter(pk__in=ids, status=MessageStatus.QUEUED).count() == 2


def test_the_last_claim_comes_after_the_doorbell_is_unset(smtp: SMTPTestServer, redis, monkeypatch) -> None:  # noqa: ANN001
    """A message committed while the task ran, whose publisher found the doorbell set and so
    published nothing, is claimed by the claim after `answer`."""
    [first] = waiting(1, "critical", "first")
    answer = send_tasks.answer

    def a_message_arrives_then_answer(token: str) -> None:
        waiting(1, "critical", "meanwhile")
        assert not redis.set(send_tasks.DOORBELL_KEY, 1, nx=True)  # its publisher finds it ringing
        answer(token)

    redis.set(send_tasks.DOORBELL_KEY, 1)
    monkeypatch.setattr(send_tasks, "answer", a_message_arrives_then_answer)
    report = send_messages([first], priority="critical", wake=True)
    assert report.sent == 2 and not redis.exists(send_tasks.DOORBELL_KEY)


def test_accepted_messages_publish_one_task_while_the_doorbell_rings(api, redis) -> None:  # noqa: ANN001
    body = {"to": "ann@example.com", "subject": "Code", "text": "123456", "priority": "critical"}
    for _ in range(3):
        assert api.post("/api/v1/messages", body, format="json").status_code == 202
    assert len(queued_tasks(redis, "critical")) == 1  # the first rang; no worker has answered
    assert send_tasks.linger(0.01, "task-1")  # a task runs: the other two pushed a wake-up
    assert not send_tasks.linger(0.01, "task-1")  # and only one is kept
    send_tasks.answer("task-1")  # it found nothing more
    assert api.post("/api/v1/messages", body, format="json").status_code == 202
    tasks = queued_tasks(redis, "critical")
    assert len(tasks) == 2 and all(t["kwargs"]["wake"] for t in tasks)
    assert not OutboxTask.objects.exists()  # the answered rows are deleted with the published


def test_a_message_accepted_while_a_task_lingers_wakes_it(api, redis) -> None:  # noqa: ANN001
    body = {"to": "ann@example.com", "subject": "Code", "text": "123456", "priority": "critical"}
    woken: list[bool] = []
    thread = threading.Thread(target=lambda: woken.append(send_tasks.linger(10.0, "lingering")))
    thread.start()
    # Once the lingering task's SET is in, the accepted message finds the doorbell set: it pushes a
    # wake-up and publishes no task.
    wait_until(lambda: redis.get(send_tasks.DOORBELL_KEY) == b"lingering", 5, "the task to linger")
    assert api.post("/api/v1/messages", body, format="json").status_code == 202
    thread.join(5)
    assert woken == [True] and queued_tasks(redis, "critical") == []


def test_only_the_task_that_set_the_doorbell_last_unsets_it(redis) -> None:  # noqa: ANN001
    assert not send_tasks.linger(0.01, "first")
    assert not send_tasks.linger(0.01, "second")  # another task lingers on it since
    send_tasks.answer("first")
    assert redis.get(send_tasks.DOORBELL_KEY) == b"second"
    send_tasks.answer("second")
    assert not redis.exists(send_tasks.DOORBELL_KEY)


def test_a_batch_of_critical_messages_rings_once(api, redis) -> None:  # noqa: ANN001
    items = [
        {"to": f"b{n}@example.com", "subject": "s", "text": "t", "priority": "critical"} for n in range(30)
    ]
    assert api.post("/api/v1/messages/batch", {"messages": items}, format="json").status_code == 202
    assert len(queued_tasks(redis, "critical")) == 1


def test_without_redis_every_accepted_message_publishes_its_task(api, redis, settings) -> None:  # noqa: ANN001
    from core import redis_clients

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # the doorbell cannot be read
    redis_clients.reset()
    body = {"to": "ann@example.com", "subject": "Code", "text": "123456", "priority": "high"}
    for _ in range(3):
        assert api.post("/api/v1/messages", body, format="json").status_code == 202
    assert len(queued_tasks(redis, "high")) == 3


def test_at_limit_one_each_message_has_a_task_of_its_own(api, redis, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT = 1
    body = {"to": "ann@example.com", "subject": "Code", "text": "123456", "priority": "critical"}
    for _ in range(3):
        assert api.post("/api/v1/messages", body, format="json").status_code == 202
    tasks = queued_tasks(redis, "critical")
    assert len(tasks) == 3 and not any(t["kwargs"]["wake"] for t in tasks)


def test_a_task_published_before_the_adaptive_claim_is_sent_as_before(smtp: SMTPTestServer) -> None:
    ids = waiting(3, "critical", "old")
    assert send_messages(ids[:1]).claimed == 1  # no priority: the task's own ids only
    assert Counter(Message.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        MessageStatus.SENT: 1,
        MessageStatus.QUEUED: 2,
    }


def test_the_doorbell_kind_is_registered_with_the_send_task() -> None:
    assert outbox.registered_kinds()[send_tasks.SEND_MESSAGES] == send_tasks.SEND_MESSAGES_TASK


def test_under_load_a_woken_task_gathers_before_claiming_and_a_message_alone_never_waits(
    smtp: SMTPTestServer,
    settings,  # noqa: ANN001
    monkeypatch,  # noqa: ANN001
) -> None:
    from delivery.services import sending

    settings.EMAILHUB_TRANSACTIONAL_GATHER_SECONDS = 0.005
    slept: list[float] = []
    monkeypatch.setattr(sending.time, "sleep", slept.append)
    arrivals = [2, 1]  # what each wake-up announces; then none comes

    def linger(seconds: float, token: str) -> bool:
        if not arrivals:
            return False
        waiting(arrivals.pop(0), "critical", f"wave{len(arrivals)}-")
        return True

    monkeypatch.setattr(send_tasks, "linger", linger)
    waiting(1, "critical", "first")
    report = send_messages([], priority="critical", wake=True)
    # Claims of 1 (no wait), then 2 (a wait before the next claim), then 1 (no wait), then none.
    assert report.sent == 4 and slept == [0.005]
