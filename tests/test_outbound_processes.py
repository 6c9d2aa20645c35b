"""Outbound webhooks on real processes (issue 22): web, the transactional worker, the webhooks
worker and beat on the test database, a real receiver verifying every request with the
`standardwebhooks` library. What is killed with SIGKILL loses no event; a receiver that never
answers holds no process that sends mail."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import requests

from delivery.testing.smtp_server import SMTPTestServer
from outbound.testing.receiver import Receiver
from scripts.stack import Stack
from tests.conftest import wait_for_status, wait_until

WEBHOOK_ENV = {
    # The receiver is on 127.0.0.1 over http: allowed for this test only.
    "EMAILHUB_WEBHOOKS_ALLOW_HTTP": "1",
    "EMAILHUB_WEBHOOKS_ALLOW_PRIVATE": "1",
    # A dead task's claim is given back after 3 s (the sweep runs every 5 s from beat).
    "EMAILHUB_WEBHOOKS_LEASE_SECONDS": "3",
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


def _api(port: int, key: str, method: str, path: str, body: dict | None = None) -> requests.Response:
    return requests.request(
        method,
        f"http://127.0.0.1:{port}{path}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_killed_web_or_webhooks_worker_loses_no_event_and_a_hung_receiver_delays_no_mail(
    stack: Stack,
    smtp: SMTPTestServer,
    receiver: Receiver,
    api_key,  # noqa: ANN001
    web_port: int,
) -> None:
    key = api_key[1]
    stack.env.update(WEBHOOK_ENV)
    stack.start_web(web_port)
    stack.start("worker-transactional")
    stack.start("worker-webhooks")
    stack.start("beat")
    created = _api(web_port, key, "POST", "/api/v1/webhook-endpoints",
                   {"url": receiver.url, "event_types": ["message.queued", "message.sent"]}).json()  # fmt: skip
    receiver.secret = created["secret"]
    released = threading.Event()
    receiver.answer_next(hang=released)  # the first request is held: its worker is stuck in it

    ids = [
        _api(web_port, key, "POST", "/api/v1/messages",
             {"to": f"user{n}@example.com", "subject": "s", "text": "t", "priority": "critical",
              "tags": [f"n{n}"], "metadata": {"n": str(n)}}).json()["id"]
        for n in range(6)
    ]  # fmt: skip
    # A web process killed right after its answers: the events were written with the messages.
    stack.kill("web")
    for message_id in ids:  # the mail goes while the webhooks worker is stuck on the receiver
        wait_for_status(message_id, "sent", timeout=30)
    assert smtp.count == 6
    assert receiver.wait_for(1, timeout=30)
    held = receiver.received[0]

    # The webhooks worker dies in the middle of that request: its claim is given back after the
    # lease, and a new worker delivers everything, the held event again with its webhook-id.
    stack.kill("worker-webhooks")
    released.set()
    stack.start("worker-webhooks")

    def everything_arrived() -> bool:
        answered = receiver.events(answered_2xx=True)
        return {(e["type"], e["data"]["message_id"]) for e in answered} == {
            (kind, i) for i in ids for kind in ("message.queued", "message.sent")
        }

    wait_until(everything_arrived, timeout=60, message="every event delivered")
    assert all(r.verified for r in receiver.received), [
        (r.error, r.status, r.headers.get("webhook-id"), r.body[:80]) for r in receiver.received
    ]
    answered = [r for r in receiver.received if r.status is not None and 200 <= r.status < 300]
    assert held.headers["webhook-id"] in {r.headers["webhook-id"] for r in answered}
    sent = [e for e in receiver.events(answered_2xx=True) if e["type"] == "message.sent"]
    assert {e["data"]["message_id"]: e["data"]["tags"] for e in sent} == {
        i: [f"n{n}"] for n, i in enumerate(ids)
    }
