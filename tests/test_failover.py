"""Failover on real worker processes: SES (moto) → SendGrid (local v3 server) → SMTP (aiosmtpd)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import requests
from django.conf import settings

from campaigns.models import Suppression
from delivery.models import Message
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import PROCESSES, Stack, with_option
from tests.conftest import wait_until

pytestmark = pytest.mark.processes

FAIL_MAX = 5
RESET_TIMEOUT = 2.0


@pytest.fixture
def providers(
    ses_server: SESTestServer, sendgrid_server: SendGridTestServer, smtp: SMTPTestServer
) -> Iterator[dict[str, str]]:
    ses_server.reset()
    sendgrid_server.clear()
    yield {
        "EMAILHUB_PROVIDERS_TRANSACTIONAL": "ses,sendgrid,smtp",
        "EMAILHUB_PROVIDERS_BULK": "sendgrid,ses,smtp",
        "SES_ENDPOINT_URL": ses_server.endpoint_url,
        "SES_ACCESS_KEY_ID": "test",
        "SES_SECRET_ACCESS_KEY": "test",
        "SENDGRID_API_KEY": sendgrid_server.api_key,
        "SENDGRID_HOST": sendgrid_server.url,
        "EMAILHUB_BREAKER_FAIL_MAX": str(FAIL_MAX),
        "EMAILHUB_BREAKER_RESET_TIMEOUT": str(RESET_TIMEOUT),
        "EMAILHUB_RETRY_BASE_SECONDS": "0.5",
        "EMAILHUB_RETRY_MAX_SECONDS": "2",
        "EMAILHUB_MAX_ATTEMPTS": "1000",
    }
    ses_server.reset()
    sendgrid_server.clear()


def start_transactional_workers(stack: Stack, env: dict[str, str], count: int) -> None:
    for n in range(count):
        argv = with_option(PROCESSES["worker-transactional"], "-n", f"tx{n}@%h")
        argv = with_option(argv, "--concurrency", "1")
        stack.start("worker-transactional", argv, extra_env=env, key=f"tx{n}")


def send(api, count: int, priority: str = "critical", prefix: str = "user") -> list[int]:  # noqa: ANN001
    return [
        api.post(
            "/api/v1/messages",
            {"to": f"{prefix}{n}@example.com", "subject": f"s{n}", "text": "t", "priority": priority},
            format="json",
        ).json()["id"]
        for n in range(count)
    ]


def wait_all(ids: list[int], status: str = "sent", timeout: float = 60) -> None:
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status=status).count() == len(ids),
        timeout,
        f"{len(ids)} messages to be {status} ({Counter(Message.objects.filter(pk__in=ids).values_list('status', flat=True))})",
    )


def test_failing_primary_opens_its_breaker_across_two_workers_and_mail_moves_on(
    stack: Stack,
    api,
    api_key,
    providers: dict[str, str],
    ses_server: SESTestServer,  # noqa: ANN001
    sendgrid_server: SendGridTestServer,
    web_port: int,
) -> None:
    def health() -> dict:
        url = f"http://127.0.0.1:{web_port}/api/v1/providers"
        return requests.get(url, headers={"Authorization": f"Bearer {api_key[1]}"}, timeout=5).json()

    ses_server.fail_with(500)
    start_transactional_workers(stack, providers, count=2)
    stack.start_web(web_port, extra_env=providers)
    ids = send(api, 60)
    wait_all(ids)

    assert Counter(Message.objects.filter(pk__in=ids).values_list("provider", flat=True)) == {"sendgrid": 60}
    assert sorted(d.to for d in sendgrid_server.delivered) == sorted(
        f"user{n}@example.com" for n in range(60)
    )
    ses = next(p for p in health()["providers"] if p["name"] == "ses")["circuit"]
    assert ses["state"] == "open" and "SES 500" in ses["last_error"]
    # SES saw fail_max calls before the circuit opened, at most one more that the other worker
    # already had in flight, and then only the half-open probes (one per re-opening).
    failed_probes = ses["times_opened"] - 1
    assert FAIL_MAX <= ses_server.refused_count <= FAIL_MAX + 1 + failed_probes
    assert ses["failures_total"] == ses_server.refused_count

    # The primary recovers; after reset_timeout one probe closes the circuit and SES takes over.
    ses_server.fail_with(None)
    time.sleep(RESET_TIMEOUT + 0.2)
    probe = send(api, 1, prefix="probe")  # while it probes, the other worker fails over
    wait_all(probe)
    later = send(api, 10, prefix="later")
    wait_all(later)
    assert Counter(Message.objects.filter(pk__in=later).values_list("provider", flat=True)) == {"ses": 10}
    assert next(p for p in health()["providers"] if p["name"] == "ses")["circuit"]["state"] == "closed"


def test_permanent_recipient_errors_never_open_the_breaker_and_never_fail_over(
    stack: Stack,
    api,
    providers: dict[str, str],
    ses_server: SESTestServer,
    sendgrid_server: SendGridTestServer,  # noqa: ANN001
) -> None:
    bad = [f"bad{n}@example.com" for n in range(FAIL_MAX * 3)]
    ses_server.reject(*bad)
    start_transactional_workers(stack, providers, count=1)
    ids = send(api, len(bad), prefix="bad")
    wait_all(ids, status="failed")
    assert all("MessageRejected" in m.last_error for m in Message.objects.filter(pk__in=ids))
    assert set(Suppression.objects.values_list("email", flat=True)) == set(bad)
    assert sendgrid_server.delivered == []  # a permanent failure does not move to the next provider

    good = send(api, 3, prefix="good")
    wait_all(good)
    assert set(Message.objects.filter(pk__in=good).values_list("provider", flat=True)) == {"ses"}
    again = send(api, 1, prefix="bad")
    wait_all(again, status="suppressed")


def test_every_provider_down_then_back_sends_every_message_exactly_once(
    stack: Stack,
    api,
    providers: dict[str, str],
    ses_server: SESTestServer,  # noqa: ANN001
    sendgrid_server: SendGridTestServer,
    smtp: SMTPTestServer,
) -> None:
    ses_server.fail_with(500)
    sendgrid_server.fail_with(503)
    smtp.reply_to_everyone("421 4.3.2 service not available")
    start_transactional_workers(stack, providers, count=1)
    stack.start("worker-bulk", extra_env=providers)
    stack.start("scheduler", extra_env=providers)
    ids = send(api, 20, "critical", "crit") + send(api, 20, "normal", "bulk")

    outage = 8.0  # seconds; bench/delivery.py runs the same scenario with a 60 s outage
    deadline = time.monotonic() + outage
    while time.monotonic() < deadline:
        assert not Message.objects.filter(pk__in=ids, status__in=["sent", "failed"]).exists()
        time.sleep(0.5)
    assert Message.objects.filter(pk__in=ids, status="retry_wait").exists()

    ses_server.fail_with(None)
    sendgrid_server.fail_with(None)
    smtp.reply_to_everyone(None)
    wait_all(ids, timeout=90)

    received = (
        [to for tos, _ in ses_server.sent() for to in tos]
        + [d.to for d in sendgrid_server.delivered]
        + [m.rcpt_tos[0] for m in smtp.messages]
    )
    expected = [f"crit{n}@example.com" for n in range(20)] + [f"bulk{n}@example.com" for n in range(20)]
    assert sorted(received) == sorted(expected)  # each exactly once, none lost
    # Attempts made while every circuit was open are given back (issue 8, item 6): a message counts
    # only the attempts in which a provider was really called, so the outage spent few of them.
    attempts = [m.attempts for m in Message.objects.filter(pk__in=ids)]
    assert all(1 <= n < settings.EMAILHUB_MAX_ATTEMPTS for n in attempts), attempts
