"""A transactional worker SIGKILLed in the middle of a storm of critical messages (issue 20's
adaptive claim and doorbell, delivery/services/send_tasks.py): every accepted message is sent,
the only ones sent twice are those the dead worker held in `sending`, and every copy of one
message carries its one Message-ID."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from delivery.models import Message
from delivery.services.sweeps import requeue_stale_sending
from delivery.testing.smtp_server import ReceivedMessage, SMTPTestServer
from scheduling import reconciler
from scripts.stack import Stack
from tests.conftest import wait_until

pytestmark = pytest.mark.processes

STORM = 480  # critical messages posted, each to a recipient of its own
AFTER_KILL = 120  # the last of them are posted only once the worker is dead
CLIENTS = 4
KILL_AT = 60  # emails the SMTP server has received when the worker is killed: some, far from all


def test_worker_killed_in_a_storm_sends_every_message_and_duplicates_only_those_in_flight(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = 0.0
    # Redis has its marker: what recovers below is the sweep, the doorbell and the queue probes,
    # not the republish of every queued row that follows a Redis reset.
    reconciler.reconcile()
    stack.start_web(web_port)
    stack.start("worker-transactional")

    killed = threading.Event()
    numbers = iter(range(STORM))
    lock = threading.Lock()
    accepted: dict[str, int] = {}  # recipient → message id
    while_dead: set[int] = set()  # posted after the kill, before a worker ran again

    def client() -> None:
        with requests.Session() as session:  # keep-alive, as a real client's pool
            session.headers["Authorization"] = f"Bearer {api_key[1]}"
            while True:
                with lock:
                    n = next(numbers, None)
                if n is None:
                    return
                if n >= STORM - AFTER_KILL:
                    assert killed.wait(30), "the worker was never killed"
                dead = killed.is_set()
                to = f"storm{n}@example.com"
                response = session.post(
                    f"http://127.0.0.1:{web_port}/api/v1/messages",
                    json={
                        "to": to,
                        "subject": f"Code {n}",
                        "text": f"Your code is {n}",
                        "priority": "critical",
                    },
                    timeout=10,
                )
                assert response.status_code == 202, response.text
                with lock:
                    accepted[to] = response.json()["id"]
                    if dead:
                        while_dead.add(accepted[to])

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        clients = [pool.submit(client) for _ in range(CLIENTS)]
        wait_until(lambda: smtp.count >= KILL_AT, 30, f"{KILL_AT} emails before the kill")
        # A slow provider: the worker stops at an email's end of DATA, holding its claim in
        # `sending`, while the clients go on posting (one pooled task sends the storm; a second
        # process joins only when a claim is full). Killed there, the worker leaves rows in
        # flight whatever the timing (a held email may or may not count as received: aiosmtpd
        # finishes or drops a DATA whose client is gone).
        smtp.hold_data_replies()
        wait_until(lambda: smtp.held >= 1, 10, "the worker to wait on the provider")
        stack.kill("worker-transactional")
        killed.set()
        smtp.hold_data_replies(False)
        # No worker runs now: these rows stay `sending` until the sweep gives them back.
        in_flight = set(Message.objects.filter(status="sending").values_list("pk", flat=True))
        received_before_the_kill = smtp.count
        for done in clients:
            done.result()
    assert len(accepted) == STORM and received_before_the_kill < STORM
    assert len(in_flight) >= 1  # the held claim
    assert len(while_dead) >= AFTER_KILL  # recovery really ran: work was waiting with no worker
    assert set(Message.objects.filter(status="sending").values_list("pk", flat=True)) == in_flight

    settings.EMAILHUB_SENDING_LEASE_SECONDS = 0  # the lease has run out: no wall-clock wait
    assert requeue_stale_sending() == len(in_flight)
    stack.start("worker-transactional", key="worker-transactional-2")
    ids = set(accepted.values())

    def all_sent() -> bool:
        if not Message.objects.filter(pk__in=ids).exclude(status="sent").exists():
            return True
        reconciler.reconcile()  # what beat does every 30 s: the probes republish what lost its task
        time.sleep(0.2)
        return False

    wait_until(all_sent, 60, "every accepted message to be sent")
    stack.stop("worker-transactional-2")  # nothing it was doing arrives after the count below

    copies: dict[str, list[ReceivedMessage]] = defaultdict(list)
    for received in smtp.messages:
        [to] = received.rcpt_tos
        copies[to].append(received)
    assert set(copies) == set(accepted)
    twice = {accepted[to] for to, sent in copies.items() if len(sent) > 1}
    assert twice <= in_flight
    rows = dict(Message.objects.filter(pk__in=ids).values_list("pk", "provider_message_id"))
    for to, sent in copies.items():
        assert {copy.parsed()["Message-ID"].strip("<>") for copy in sent} == {rows[accepted[to]]}
    # Claimed once, except the rows the dead worker held: claimed again after the sweep.
    attempts = dict(Message.objects.filter(pk__in=ids).values_list("pk", "attempts"))
    assert {i for i, n in attempts.items() if n != 1} == in_flight
    assert all(attempts[i] == 2 for i in in_flight)
