"""The fast publisher builds Celery's task messages itself (fastpaths/publish.py): they must be the
messages `Celery.send_task` makes, on Redis and on RabbitMQ, and a worker must run them. Each
test runs with both publishers (the plain one is send_task itself)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from django.db import transaction
from kombu import Connection

from core import outbox
from core.models import OutboxTask
from delivery.models import Message
from delivery.services import send_tasks
from delivery.testing.smtp_server import SMTPTestServer
from emailhub.celery import app
from fastpaths import publish
from scripts.stack import Stack
from tests.broker import rabbit_broker
from tests.conftest import wait_for_status

# Both publishers: Celery's send_task and fastpaths/publish.py's own messages.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_paths")]

KIND = "test_outbox_message"


@pytest.fixture
def kind() -> Any:
    outbox.register_kind(
        KIND,
        "delivery.send_messages",
        args=lambda payload: [payload["ids"]],
        kwargs=lambda payload: {"note": payload["note"]},
        queue=lambda payload: payload["priority"],
    )
    yield KIND
    outbox._kinds.pop(KIND)


def _publish_both(queue: str) -> None:
    """The same task twice: through the outbox, then through send_task."""
    args, kwargs = [[41, 42]], {"note": "é ünïcode"}
    with transaction.atomic():
        outbox.record_many([(KIND, {"ids": [41, 42], "priority": queue, "note": kwargs["note"]})])
    app.send_task("delivery.send_messages", args=args, kwargs=kwargs, queue=queue, retry=False)


def _comparable(headers: dict[str, Any], properties: dict[str, Any], body: Any) -> dict[str, Any]:
    task_id = headers["id"]
    assert headers["root_id"] == task_id and properties["correlation_id"] == task_id
    kept = {k: v for k, v in headers.items() if k not in {"id", "root_id"}}
    props = {k: properties.get(k) for k in ("reply_to", "delivery_mode", "priority")}
    return {"headers": kept, "properties": props, "body": body}


def test_outbox_messages_are_send_tasks_messages_on_redis(redis, kind) -> None:  # noqa: ANN001
    _publish_both("high")
    raw = [json.loads(item) for item in reversed(redis.lrange("high", 0, -1))]
    assert len(raw) == 2
    envelopes = []
    for envelope in raw:
        body = json.loads(base64.b64decode(envelope["body"]))
        assert (envelope["content-type"], envelope["content-encoding"]) == ("application/json", "utf-8")
        assert envelope["properties"]["delivery_info"] == {"exchange": "", "routing_key": "high"}
        envelopes.append(_comparable(envelope["headers"], envelope["properties"], body))
    ours, celerys = envelopes
    assert ours == celerys
    assert ours["body"] == [[[41, 42]], {"note": "é ünïcode"}, publish._EMBED]
    assert not OutboxTask.objects.exists()


def _get(queue: Any, timeout: float = 5.0) -> Any:
    """The next message on `queue`, waiting a little: without publisher confirms a publish
    returns before the broker has routed it."""
    deadline = time.monotonic() + timeout
    while (message := queue.get(no_ack=True)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return message


def test_outbox_messages_are_send_tasks_messages_on_rabbitmq(kind) -> None:  # noqa: ANN001
    with rabbit_broker() as (url, _):
        _publish_both("low")  # the outbox declares the queue as send_task does: nothing is dropped
        got: list[dict[str, Any]] = []
        with Connection(url) as conn:
            queue = app.amqp.queues["low"](conn.default_channel)
            for _ in range(2):
                message = _get(queue)
                assert message is not None, "a task was not routed to its queue"
                assert message.content_type == "application/json"
                assert message.delivery_info["routing_key"] == "low"
                got.append(_comparable(message.headers, message.properties, message.decode()))
            assert queue.get(no_ack=True) is None
    ours, celerys = got
    assert ours == celerys and ours["properties"]["delivery_mode"] == 2


@pytest.mark.processes
def test_a_worker_runs_the_outbox_message(stack: Stack, smtp: SMTPTestServer) -> None:
    message = Message.objects.create(
        to_email="built@example.com", subject="s", text="t", priority="critical", status="queued"
    )
    with transaction.atomic():
        send_tasks.record_send([message.pk], "critical")
    assert not OutboxTask.objects.exists()  # published, not left to a relay (none runs here)
    stack.start("worker-transactional")
    wait_for_status(message.pk, "sent")
    assert smtp.count == 1
