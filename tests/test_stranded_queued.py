"""Issue 8 item 1: a `queued` message whose send task no longer exists is found and republished
(the FIFO queue probes of delivery/services/probes.py), and a legitimate backlog never is."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from django.db import transaction
from django.utils import timezone

from core import schedule_index
from core.models import OutboxTask
from delivery.models import Message
from delivery.services import probes, send_tasks
from delivery.testing.smtp_server import SMTPTestServer
from scheduling import reconciler
from scripts.stack import Stack
from tests.broker import queued_tasks, rabbit_broker, rabbitmqctl
from tests.conftest import wait_for_status, wait_until

pytestmark = pytest.mark.processes


def _tick_until_sent(message_id: int, settings, timeout: float = 40.0) -> dict[str, int]:  # noqa: ANN001
    """Run the reconciler (what beat does every 30 s) until the message is sent; return what it
    republished as stranded."""
    republished: Counter[str] = Counter()

    def sent() -> bool:
        if Message.objects.filter(pk=message_id, status="sent").exists():
            return True
        republished.update(reconciler.reconcile().stranded_republished)
        time.sleep(0.2)
        return False

    wait_until(sent, timeout, f"message {message_id} to be sent")
    return dict(republished)


def test_a_send_task_deleted_from_the_redis_list_by_hand_is_still_sent(
    stack: Stack,
    smtp: SMTPTestServer,
    redis,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = 0.0
    reconciler.reconcile()  # Redis has its data (the marker): no flush will be detected
    with transaction.atomic():  # what accepting a message writes: the row and its outbox task
        message_id = Message.objects.create(
            to_email="lost@example.com", subject="s", text="t", priority="critical", queued_at=timezone.now()
        ).pk
        send_tasks.record_send([message_id], "critical")
    wait_until(lambda: queued_tasks(redis, "critical") != [], 5, "the send task to be published")
    for raw in redis.lrange("critical", 0, -1):  # an operator deletes the send task, not the probe
        if json.loads(raw)["headers"]["task"] == "delivery.send_messages":
            assert redis.lrem("critical", 1, raw) == 1
    assert queued_tasks(redis, "critical") == []
    stack.start("worker-transactional")

    assert _tick_until_sent(message_id, settings) == {"critical": 1}
    time.sleep(0.5)
    assert [m.rcpt_tos for m in smtp.messages] == [["lost@example.com"]]


def test_a_long_backlog_in_normal_is_never_republished(
    stack: Stack,
    smtp: SMTPTestServer,
    redis,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = 0.0
    settings.EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS = 1.0  # probes replaced often: still no republish
    stack.start("worker-transactional")  # critical/high probes are consumed; nobody takes `normal`
    reconciler.reconcile()
    now = timezone.now()
    with transaction.atomic():
        rows = Message.objects.bulk_create(
            Message(to_email=f"b{n}@example.com", subject="s", text="t", priority="normal", queued_at=now)
            for n in range(3000)
        )
        send_tasks.record_sends([m.pk for m in rows], "normal", 100)
    wait_until(lambda: OutboxTask.objects.count() == 0, 10, "the backlog's tasks to be published")
    assert len(queued_tasks(redis, "normal")) == 30

    replaced = 0
    for tick in range(1, 7):  # six ticks, the probe timing out between them (the probes' clock
        # moved on 1.1 s a tick instead of sleeping: probes.run(now=…))
        result = probes.run(now=time.time() + 1.1 * tick)
        assert "normal" not in result.republished
        replaced += "normal" in result.published
    assert replaced >= 5  # the probe was replaced each time, and never consumed
    assert len(queued_tasks(redis, "normal")) == 30  # the 30 send tasks, none added
    assert OutboxTask.objects.count() == 0
    assert Message.objects.filter(status="queued", priority="normal").count() == 3000
    assert len(queued_tasks(redis, "normal", probes=True)) == 30 + 1 + replaced


def test_a_consumed_probe_does_not_republish_rows_queued_after_it(
    stack: Stack,
    smtp: SMTPTestServer,
    redis,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = 0.0
    reconciler.reconcile()  # probes published before the message below exists
    message = Message.objects.create(
        to_email="later@example.com", subject="s", text="t", priority="high", queued_at=timezone.now()
    )
    stack.start("worker-transactional")  # consumes the probe; the message has no task at all
    wait_until(lambda: "consumed" in probes.state("high"), 20, "the high probe to be consumed")
    # Its probe was published before the row was queued: no evidence about it yet.
    assert reconciler.reconcile().stranded_republished == {}
    assert Message.objects.get(pk=message.pk).status == "queued"
    assert _tick_until_sent(message.pk, settings) == {"high": 1}  # the next probe's turn


# ---- RabbitMQ: the same rule, with no broker introspection at all ----------------------------


def test_a_dispatched_retry_whose_task_was_lost_on_rabbitmq_is_sent_automatically(
    stack: Stack,
    smtp: SMTPTestServer,
    redis,
    settings,  # noqa: ANN001
) -> None:
    """The issue's scenario on RabbitMQ: a retry dispatched by the scheduler is `queued`
    (attempts 1, the worker that would take it SIGKILLed), the broker's queue emptied, while the
    Redis marker is intact (nothing tells the reconciler that the broker lost data)."""
    settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = 0.0
    settings.EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS = 2.0  # the purge takes the probe too: replaced
    with rabbit_broker() as (url, vhost):
        stack.env["CELERY_BROKER_URL"] = url
        worker = stack.start("worker-transactional")
        stack.kill("worker-transactional")  # SIGKILL: nobody consumes `critical` now
        assert not worker.alive
        reconciler.reconcile()  # marker set, probes published (on RabbitMQ)
        message = Message.objects.create(
            to_email="retry@example.com", subject="s", text="t", priority="critical",
            status="retry_wait", attempts=1, due_at=timezone.now(),
        )  # fmt: skip
        schedule_index.add([(schedule_index.message_unit(message.pk), message.due_at)])
        stack.start("scheduler")
        wait_for_status(message.pk, "queued", timeout=20)  # dispatched: its task is on RabbitMQ
        wait_until(lambda: OutboxTask.objects.count() == 0, 10, "the retry's task to be published")
        stack.stop("scheduler")
        rabbitmqctl("purge_queue", "-p", vhost, "critical")  # the broker lost it
        stack.start("worker-transactional", key="worker-transactional-2")

        assert _tick_until_sent(message.pk, settings) == {"critical": 1}
        time.sleep(0.5)
        assert [m.rcpt_tos for m in smtp.messages] == [["retry@example.com"]]
        assert Message.objects.get(pk=message.pk).attempts == 2
        stack.stop_all()


# ---- The bound, with controlled time ----------------------------------------------------------

TICK = 30.0  # beat's reconcile interval (emailhub/periodic.py)


@pytest.mark.parametrize("phase", [0.0, 0.5, 10.0, 29.5, 45.0, 89.5])
def test_a_stranded_message_is_republished_between_margin_plus_one_and_two_probe_cycles_after_it_was_queued(
    db,
    redis,
    settings,
    phase: float,  # noqa: ANN001
) -> None:
    """The probes' own clocks (Redis TIME, PostgreSQL's clock_timestamp()) replaced by a virtual
    one: every reconcile tick 30 s apart, the probe consumed by a worker a moment after it was
    published, the message queued at `phase` seconds into a probe cycle and its task lost."""
    margin = settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS  # 60 s
    cycle = TICK * (margin // TICK + 1)  # 90 s: delivery/services/probes.py, "How long it takes"
    start = time.time() - 86_400  # a day ago: every real clock the cutoff is compared with is later
    queued_at = start + 300 + phase
    message = Message.objects.create(
        to_email="lost@example.com",
        subject="s",
        text="t",
        priority="critical",
        queued_at=datetime.fromtimestamp(queued_at, tz=UTC),
    )
    tick = start
    while tick < queued_at + margin + 3 * cycle:
        report = probes.run(now=tick)
        if report.republished:
            assert report.republished == {"critical": 1}
            break
        if "critical" in report.published:  # the worker consumes it (milliseconds, prefetch 1)
            assert probes.mark_consumed("critical", probes.state("critical")["token"], now=tick + 0.05)
        tick += TICK
    else:
        pytest.fail("the stranded message was never republished")
    # 150 < delay <= 240 s with the defaults: 240 for a row queued just as a probe went out,
    # 150.5 for one queued half a second before the next (docs/architecture.md, "Stranded").
    assert margin + cycle < tick - queued_at <= margin + 2 * cycle
    assert Message.objects.get(pk=message.pk).queued_at > message.queued_at  # moved: republished
