"""Publishing many outbox tasks: pipelined to the Redis broker in batches, each event once."""

from __future__ import annotations

import math

import pytest
from django.db import transaction
from redis.client import Pipeline

from core import outbox
from core.models import OutboxTask
from delivery.services import send_tasks
from tests.broker import queued_tasks

# Both publishers: Celery's send_task and fastpaths/publish.py's own messages.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_paths")]


def test_a_thousand_events_go_out_in_a_few_pipelines_each_once_in_order(redis, monkeypatch) -> None:  # noqa: ANN001
    executed: list[int] = []
    real_execute = Pipeline.execute

    def counting_execute(self: Pipeline, *args: object, **kwargs: object) -> object:
        pushes = sum(1 for args, _ in self.command_stack if args[0] == "LPUSH")
        if pushes:  # not kombu's queue declarations
            executed.append(pushes)
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", counting_execute)
    events = 1_200
    with transaction.atomic():
        send_tasks.record_sends(list(range(events)), "critical", 1)
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[n]]) for n in range(events)]
    assert OutboxTask.objects.count() == 0
    # One pipeline per PUBLISH_BATCH events, not a round trip per task.
    assert len(executed) == math.ceil(events / outbox.PUBLISH_BATCH)
    assert sum(executed) == events
