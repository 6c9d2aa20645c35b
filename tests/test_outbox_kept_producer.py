"""The web's fast publisher: one producer kept per thread (fastpaths.publish.keep_producer_per_thread), the same
messages as through Celery's pool, and a failed publish leaves its row to the relay."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import redis as redis_lib
from django.db import connection, transaction
from django.utils import timezone

from core import outbox
from core.models import OutboxTask
from delivery.services import send_tasks
from fastpaths import publish
from tests.broker import broker_unreachable, queued_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch, settings) -> Any:  # noqa: ANN001
    settings.EMAILHUB_OUTBOX_PUBLISHER = settings.OUTBOX_PUBLISHERS["fast"]
    monkeypatch.setattr(publish, "_keep_per_thread", True)
    monkeypatch.setattr(publish, "_kept", publish._KeptProducer())
    yield publish._kept
    if publish._kept.producer is not None:
        publish._kept.producer.connection.close()


def test_a_thread_keeps_one_producer_and_one_redis_client_for_its_publishes(redis, kept, monkeypatch) -> None:  # noqa: ANN001
    clients: list[int] = []
    real_init = redis_lib.Redis.__init__

    def counting_init(self: redis_lib.Redis, *args: Any, **kwargs: Any) -> None:
        clients.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(redis_lib.Redis, "__init__", counting_init)
    producers = []
    for message_id in (1, 2, 3):
        with transaction.atomic():
            send_tasks.record_send([message_id], "critical")
        producers.append(kept.producer)
    assert producers[0] is not None and producers.count(producers[0]) == 3
    made_for_first = len(clients)
    assert made_for_first <= 2  # the channel's own (kombu pings with it) and the one kept for LPUSH
    with transaction.atomic():
        send_tasks.record_send([4], "critical")
    assert len(clients) == made_for_first  # no client per publish any more
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[n]]) for n in (1, 2, 3, 4)]
    assert OutboxTask.objects.count() == 0

    other: list[Any] = []

    def publish_from_another_thread() -> None:
        try:
            with transaction.atomic():
                send_tasks.record_send([5], "critical")
            other.append(publish._kept.producer)
        finally:
            connection.close()  # this thread's own database connection

    thread = threading.Thread(target=publish_from_another_thread)
    thread.start()
    thread.join()
    assert other[0] is not None and other[0] is not producers[0]
    other[0].connection.close()
    assert queued_tasks(redis, "critical")[-1] == ("delivery.send_messages", [[5]])


def test_a_failed_publish_keeps_no_producer_and_leaves_the_row_for_the_relay(redis, kept) -> None:  # noqa: ANN001
    with broker_unreachable():
        with transaction.atomic():
            send_tasks.record_send([7], "critical")
        assert kept.producer is None
    assert OutboxTask.objects.count() == 1
    # The thread's next publish connects afresh (to the broker that is back) and keeps that one.
    with transaction.atomic():
        send_tasks.record_send([8], "critical")
    assert kept.producer is not None
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[8]])]
    OutboxTask.objects.update(created_at=timezone.now() - timedelta(seconds=10))
    assert outbox.relay() == 1
    assert queued_tasks(redis, "critical") == [
        ("delivery.send_messages", [[8]]),
        ("delivery.send_messages", [[7]]),
    ]
    assert OutboxTask.objects.count() == 0
