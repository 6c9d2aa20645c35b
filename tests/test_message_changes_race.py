"""Cancel on real processes (issue 21, part 1): the scheduler and a transactional worker running,
cancels landing before, during and after the dispatch; and the source design's reminder.

A message is either sent once or cancelled, never both and never twice: the cancel's
conditional UPDATE and the worker's claim lock the same row, and dispatch moves only rows still
waiting (the in-process steps of the same race are in test_message_changes.py).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import Stack
from tests import factories
from tests.conftest import wait_until

pytestmark = pytest.mark.processes


def reminder(to: str, send_at: Any, tag: str) -> dict[str, Any]:
    return {
        "to": to,
        "subject": "Finish signing up",
        "text": "You have not completed your sign-up.",
        "priority": "high",
        "send_at": send_at.isoformat(),
        "tags": [tag],
    }


def test_the_reminder_is_not_sent_to_the_user_who_completed_the_action_and_is_to_the_other(
    stack: Stack,
    smtp: SMTPTestServer,
    api,  # noqa: ANN001
) -> None:
    stack.start("scheduler")
    stack.start("worker-transactional")
    # Far enough ahead that the cancel below lands before the scheduler's dispatch (which may
    # come up to a second early: transitions.queue_due), even on a slow CI machine.
    due = timezone.now() + timedelta(seconds=5)
    for user in ("user-1", "user-2"):
        response = api.post(
            "/api/v1/messages", reminder(f"{user}@example.com", due, f"reminder:{user}"), format="json"
        )
        assert response.status_code == 202 and response.json()["status"] == "scheduled"
    # user-1 completes the action: the application cancels by what it knows, the tag.
    report = api.post("/api/v1/messages/cancel", {"tag": "reminder:user-1"}, format="json").json()
    assert report == {"cancelled": 1, "already_cancelled": 0, "past_cancelling": 0}

    [received] = smtp.wait_for(1, timeout=20)
    assert received.rcpt_tos == ["user-2@example.com"]
    assert received.received_at >= due.timestamp()  # at its due time, not before
    wait_until(lambda: Message.objects.filter(status="sent").count() == 1, 20, "user-2's reminder recorded")
    statuses = dict(Message.objects.values_list("to_email", "status"))
    assert statuses == {"user-1@example.com": "cancelled", "user-2@example.com": "sent"}
    # user-1's message is final (cancelled): no claim can take it any more.
    assert [m.rcpt_tos for m in smtp.messages] == [["user-2@example.com"]]


COUNT = 60


def test_cancels_racing_the_scheduler_and_a_worker_leave_each_message_sent_once_or_cancelled(
    stack: Stack,
    smtp: SMTPTestServer,
) -> None:
    _, raw = factories.api_key("send", "read")  # a key sees and cancels only its own messages
    client = factories.authenticated(raw)
    stack.start("scheduler")
    stack.start("worker-transactional")
    due = timezone.now() + timedelta(seconds=6)  # time to accept 60 and cancel 15 first
    ids = [
        client.post("/api/v1/messages", reminder(f"r{n}@example.com", due, f"r-{n}"), format="json").json()[
            "id"
        ]
        for n in range(COUNT)
    ]
    answers: dict[int, tuple[int, str]] = {}

    def cancel(api: Any, n: int) -> None:
        response = api.post(f"/api/v1/messages/{ids[n]}/cancel")
        body = response.json()
        answers[n] = (
            response.status_code,
            body["status"] if response.status_code == 200 else body["error"]["message"],
        )

    def cancel_once(indexes: list[int], dispatched: list[str]) -> None:
        """Cancel `indexes` as soon as one message of the batch has reached a status of
        `dispatched`: the scheduler has begun (queued), or the worker has begun sending (sent)."""
        api = factories.authenticated(raw)
        moved = Message.objects.filter(pk__in=ids, status__in=dispatched)
        wait_until(moved.exists, 30, f"a message {' or '.join(dispatched)}")
        for n in indexes:
            cancel(api, n)
        connection.close()

    before = list(range(0, COUNT, 4))  # while scheduled: always cancelled
    during = [n for n in range(COUNT) if n % 4 in (1, 2)]  # as the scheduler dispatches, the worker sends
    after = list(range(3, COUNT, 4))  # once sent: always a 409
    for n in before:
        cancel(client, n)
    # Nothing of the batch was dispatched yet when the last of those cancels was answered.
    before_dispatch = not Message.objects.filter(
        pk__in=ids, status__in=["queued", "sending", "sent"]
    ).exists()
    # Triggered by what the processes did, not by the clock: as the dispatch lands, as sends do.
    threads = [
        threading.Thread(target=cancel_once, args=(during[0::2], ["queued", "sending", "sent"])),
        threading.Thread(target=cancel_once, args=(during[1::2], ["sent"])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status__in=["sent", "cancelled"]).count() == COUNT,
        30,
        "every message sent or cancelled",
    )
    for n in after:
        cancel(client, n)

    statuses = dict(Message.objects.filter(pk__in=ids).values_list("pk", "status"))
    received = Counter(rcpt for message in smtp.messages for rcpt in message.rcpt_tos)
    for n, message_id in enumerate(ids):
        code, said = answers[n]
        if statuses[message_id] == "cancelled":
            assert (code, said) == (200, "cancelled"), (n, code, said)
            assert received[f"r{n}@example.com"] == 0, (n, "cancelled, and sent")
        else:
            assert statuses[message_id] == "sent", (n, statuses[message_id])
            assert code == 409 and ("is sending" in said or "is sent" in said), (n, code, said)
            assert received[f"r{n}@example.com"] == 1, (n, received[f"r{n}@example.com"])
    # The cancels answered before the dispatch found their messages scheduled; those after
    # everything was final found them sent.
    assert before_dispatch, "the messages were accepted too slowly to cancel any before their dispatch"
    assert {statuses[ids[n]] for n in before} == {"cancelled"}
    assert {statuses[ids[n]] for n in after} == {"sent"}
    assert sum(received.values()) == list(statuses.values()).count("sent")
