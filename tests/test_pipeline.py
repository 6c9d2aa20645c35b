"""The whole transactional path on real processes: gunicorn, Celery workers, beat, SMTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from core.models import OutboxTask
from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import Stack
from tests.conftest import wait_for_status, wait_until

# Every process with the fast paths on, then with every one off.
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("fast_paths")]

BODY = {
    "to": "ann@example.com",
    "subject": "Your one-time code",
    "text": "Your code is 123456",
    "html": "<p>Your code is <b>123456</b></p>",
    "priority": "critical",
}


def post(port: int, key: str, body: dict, **headers: str) -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{port}/api/v1/messages",
        json=body,
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=10,
    )


def test_critical_message_arrives_well_formed_and_shows_sent(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,  # noqa: ANN001
) -> None:
    stack.start_web(web_port)
    stack.start("worker-transactional")
    response = post(web_port, api_key[1], BODY)
    assert response.status_code == 202
    message_id = response.json()["id"]

    [received] = smtp.wait_for(1)
    parsed = received.parsed()
    assert parsed.defects == [] and all(part.defects == [] for part in parsed.walk())
    assert parsed["Subject"] == "Your one-time code" and received.rcpt_tos == ["ann@example.com"]
    for header in ("Message-ID", "Date", "From", "Subject"):
        assert len(parsed.get_all(header)) == 1

    wait_for_status(message_id, "sent")
    detail = requests.get(
        f"http://127.0.0.1:{web_port}/api/v1/messages/{message_id}",
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=10,
    ).json()
    assert detail["status"] == "sent" and detail["sent_at"] and detail["provider"] == "smtp"
    assert detail["attempts"] == 1 and detail["provider_message_id"] == parsed["Message-ID"].strip("<>")


def test_message_accepted_while_no_worker_runs_is_sent_once_a_worker_starts(
    stack: Stack,
    smtp: SMTPTestServer,
    api,  # noqa: ANN001
) -> None:
    ids = [
        api.post("/api/v1/messages", {**BODY, "priority": p}, format="json").json()["id"]
        for p in ("critical", "high")
    ]
    assert Message.objects.filter(pk__in=ids, status="queued").count() == 2
    assert smtp.count == 0
    stack.start("worker-transactional")
    for message_id in ids:
        wait_for_status(message_id, "sent")
    assert smtp.count == 2


def test_web_killed_with_sigkill_right_after_the_202_still_gets_the_message_sent(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,  # noqa: ANN001
) -> None:
    stack.start_web(web_port)
    response = post(web_port, api_key[1], BODY)
    stack.kill("web")
    assert response.status_code == 202
    stack.start("worker-transactional")
    wait_for_status(response.json()["id"], "sent")
    assert smtp.count == 1


def test_message_accepted_while_the_broker_is_unreachable_is_relayed_by_beat(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,  # noqa: ANN001
) -> None:
    # The web process cannot publish (broker on a dead port), so only the outbox row remains.
    stack.start_web(web_port, extra_env={"CELERY_BROKER_URL": "redis://127.0.0.1:1/0"})
    response = post(web_port, api_key[1], BODY)
    assert response.status_code == 202
    message_id = response.json()["id"]
    assert OutboxTask.objects.filter(payload__ids=[message_id]).count() == 1

    stack.start("worker-transactional")
    stack.start("beat")
    wait_for_status(message_id, "sent")
    wait_until(lambda: not OutboxTask.objects.exists(), message="the relay to delete the outbox row")
    assert smtp.count == 1


def test_same_idempotency_key_posted_twenty_times_in_parallel_sends_one_email(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,  # noqa: ANN001
) -> None:
    stack.start_web(web_port, workers=4)
    stack.start("worker-transactional")

    def send(_: int) -> requests.Response:
        return post(web_port, api_key[1], BODY, **{"Idempotency-Key": "otp-ann-1"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(send, range(20)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["id"] for r in responses}) == 1
    wait_for_status(responses[0].json()["id"], "sent")
    # Give a wrongly published duplicate time to arrive before counting.
    stack.start("worker-bulk")
    import time

    time.sleep(1.0)
    assert smtp.count == 1
    assert Message.objects.count() == 1
