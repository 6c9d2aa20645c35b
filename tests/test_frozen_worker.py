"""A worker child frozen (SIGSTOP) while it holds a claimed batch, past its lease, on real
processes: the batch goes to another worker, and the frozen one sends none of it when it wakes."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import pytest
from rest_framework.test import APIClient

from delivery.models import Message
from delivery.services.sweeps import requeue_stale_sending
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import PROCESSES, Process, Stack, with_option
from tests.conftest import children, wait_until

pytestmark = pytest.mark.processes

LEASE_SECONDS = 10  # the smallest EMAILHUB_SENDING_LEASE_SECONDS allowed
BATCH = 100  # EMAILHUB_BATCH_SIZE_NORMAL: the batch is one task


def start_bulk_worker(stack: Stack, key: str, env: dict[str, str]) -> Process:
    argv = with_option(PROCESSES["worker-bulk"], "-n", f"{key}@%h")
    argv = with_option(argv, "--concurrency", "1")  # one child: the one holding the batch
    return stack.start("worker-bulk", argv, extra_env=env, key=key)


def test_a_worker_frozen_past_its_lease_sends_nothing_of_the_batch_another_worker_took(
    stack: Stack, api: APIClient, smtp: SMTPTestServer, settings
) -> None:  # noqa: ANN001
    settings.EMAILHUB_SENDING_LEASE_SECONDS = LEASE_SECONDS  # the sweep this test runs
    env = {
        "EMAILHUB_SENDING_LEASE_SECONDS": str(LEASE_SECONDS),
        # A send quota keeps the claimed batch in the worker for ~9 s (100 messages at 10/s, the
        # bulk share of a 10-token bucket first) before its first byte reaches the relay: the
        # freeze lands while the batch is claimed and nothing of it was handed over.
        "SMTP_MAX_SEND_RATE": "10",
        "EMAILHUB_RATE_MAX_WAIT_SECONDS": "120",
        "SMTP_CONNECTIONS": "1",
    }
    frozen = start_bulk_worker(stack, "frozen", env)
    messages = [{"to": f"user{n}@example.com", "subject": f"s{n}", "text": "t"} for n in range(BATCH)]
    response = api.post(
        "/api/v1/messages/batch", {"messages": [{**m, "priority": "normal"} for m in messages]}, format="json"
    )
    assert response.status_code == 202, response.json()
    ids = [r["id"] for r in response.json()["results"]]
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status="sending").count() == BATCH, 30, "the batch claimed"
    )
    [child] = children(frozen.popen.pid)
    os.kill(child, signal.SIGSTOP)  # a long GC pause, a VM freeze, a stalled disk
    try:
        assert smtp.count == 0, "the batch had started reaching the relay before the freeze"
        # The other worker has no quota of its own to wait for: it sends the batch at once.
        start_bulk_worker(stack, "other", {**env, "SMTP_MAX_SEND_RATE": "0"})
        # The lease runs out on PostgreSQL's clock; the stale-send sweep (a beat tick) gives the
        # batch back and publishes it again, and the other worker sends it.
        requeued: list[int] = []

        def swept() -> bool:
            requeued.append(requeue_stale_sending())
            return sum(requeued) == BATCH

        wait_until(swept, 4 * LEASE_SECONDS, "the lease to run out")
        wait_until(
            lambda: Message.objects.filter(pk__in=ids, status="sent").count() == BATCH,
            90,
            "the other worker to send the batch",
        )
        smtp.wait_for(BATCH, timeout=30)
    finally:
        os.kill(child, signal.SIGCONT)
    # The frozen child wakes where it stopped (waiting for send tokens) and finishes its task.
    wait_until(
        lambda: "succeeded in" in frozen.log() or "raised" in frozen.log(), 120, "the frozen task to end"
    )
    report = re.search(r"send_messages\[[^\]]+\] succeeded in [\d.]+s: (\{.*\})", frozen.log())
    assert report is not None, frozen.log()[-3000:]

    delivered = Counter(m.rcpt_tos[0] for m in smtp.messages)
    assert delivered == Counter(m["to"] for m in messages)  # every message exactly once
    assert "'sent': 0" in report.group(1) and f"'abandoned': {BATCH}" in report.group(1), report.group(1)
    # The other worker's outcomes stand: the woken worker wrote nothing over them.
    rows = Message.objects.filter(pk__in=ids)
    assert Counter(rows.values_list("status", flat=True)) == {"sent": BATCH}
    assert all(m.attempts == 2 and m.last_error is None for m in rows)
