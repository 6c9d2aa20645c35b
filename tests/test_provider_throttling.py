"""A provider that rate-limits us is paused, not counted as down; an outage spends no attempts.

Items 5 and 6 of issue 8: SendGrid's 429 + `Retry-After`, SES throttling and SMTP "slow down"
replies pause the provider for every worker (a Redis key with a TTL) without touching its
circuit breaker; a batch that no provider could even try (every circuit open, or paused) waits
for the earliest moment one could be tried and keeps its attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from delivery import breakers
from delivery.models import Message
from delivery.providers import close_all
from delivery.providers.base import parse_retry_after
from delivery.ratelimit import pause_remaining
from delivery.services.gateway import circuit_of
from delivery.services.sending import send_messages
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer, free_port
from scripts.stack import PROCESSES, Stack, with_option
from tests import factories
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def providers(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
    ses_server: SESTestServer,
    sendgrid_server: SendGridTestServer,
) -> Iterator[None]:
    ses_server.reset()
    sendgrid_server.clear()
    settings.SES_ENDPOINT_URL = ses_server.endpoint_url
    settings.SES_ACCESS_KEY_ID = "test"
    settings.SES_SECRET_ACCESS_KEY = "test"
    settings.SENDGRID_API_KEY = sendgrid_server.api_key
    settings.SENDGRID_HOST = sendgrid_server.url
    close_all()
    yield
    close_all()
    ses_server.reset()
    sendgrid_server.clear()


def chain(settings, *names: str) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = list(names)
    close_all()


def requeue(*messages: Message) -> None:
    """What the scheduler does with a due retry: retry_wait → queued."""
    Message.objects.filter(pk__in=[m.pk for m in messages], status="retry_wait").update(status="queued")


def test_sendgrid_429_pauses_it_for_retry_after_for_every_worker_without_touching_its_breaker(
    settings,  # noqa: ANN001
    providers: None,
    smtp: SMTPTestServer,
    sendgrid_server: SendGridTestServer,
) -> None:
    chain(settings, "sendgrid", "smtp")
    # Two real failures first: the breaker's count must stay exactly where they left it.
    sendgrid_server.fail_with(503)
    for n in range(2):
        assert send_messages([factories.message(f"down{n}@example.com").pk]).sent == 1  # via smtp
    assert breakers.snapshot(circuit_of("sendgrid"))["fail_counter"] == 2

    sendgrid_server.fail_with(429, retry_after="45")
    first = factories.message("first@example.com")
    assert send_messages([first.pk]).sent == 1
    first.refresh_from_db()
    assert first.provider == "smtp"
    assert sendgrid_server.refused_count == 3  # 2 × 503, 1 × 429
    assert 40 < pause_remaining(circuit_of("sendgrid")) <= 45
    circuit = breakers.snapshot(circuit_of("sendgrid"))
    assert (circuit["state"], circuit["fail_counter"], circuit["failures_total"]) == ("closed", 2, 2)

    # Another worker process (no in-process state) sees the pause in Redis and skips SendGrid.
    breakers.reset_process_state()
    close_all()
    later = [factories.message(f"later{n}@example.com") for n in range(3)]
    assert send_messages([m.pk for m in later]).sent == 3
    assert sendgrid_server.refused_count == 3  # no request reached SendGrid during the pause
    assert sendgrid_server.delivered == []
    assert set(Message.objects.filter(pk__in=[m.pk for m in later]).values_list("provider", flat=True)) == {
        "smtp"
    }
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == sorted(
        ["down0@example.com", "down1@example.com", "first@example.com"] + [m.to_email for m in later]
    )


def test_every_provider_rate_limited_waits_for_the_pause_and_keeps_its_attempt(
    settings,  # noqa: ANN001
    providers: None,
    sendgrid_server: SendGridTestServer,
) -> None:
    chain(settings, "sendgrid")
    sendgrid_server.fail_with(429, retry_after="45")
    message = factories.message(attempts=2)
    before = timezone.now()
    assert send_messages([message.pk]).retrying == 1
    message.refresh_from_db()
    assert message.status == "retry_wait" and message.attempts == 2  # the claim's +1 given back
    assert before + timedelta(seconds=44) <= message.due_at <= before + timedelta(seconds=45 + 5)
    assert message.last_error.startswith("sendgrid: rate limited (SendGrid 429")
    assert "paused for 45 s" in message.last_error

    # Due again while still paused: skipped without a request, still no attempt spent.
    requeue(message)
    send_messages([message.pk])
    message.refresh_from_db()
    assert message.status == "retry_wait" and message.attempts == 2
    assert message.last_error.startswith("sendgrid: paused for ")
    assert sendgrid_server.refused_count == 1


def test_ses_throttling_pauses_it_for_the_default_time(
    settings,  # noqa: ANN001
    providers: None,
    smtp: SMTPTestServer,
    ses_server: SESTestServer,
) -> None:
    settings.EMAILHUB_THROTTLE_DEFAULT_SECONDS = 20
    chain(settings, "ses", "smtp")
    ses_server.fail_with(429)  # TooManyRequestsException, no Retry-After
    ids = [factories.message(f"u{n}@example.com").pk for n in range(3)]
    assert send_messages(ids[:1]).sent == 1
    assert send_messages(ids[1:]).sent == 2
    assert ses_server.refused_count == 1
    assert 15 < pause_remaining(circuit_of("ses")) <= 20
    assert breakers.snapshot(circuit_of("ses"))["failures_total"] == 0
    assert smtp.count == 3


@pytest.mark.parametrize(
    "reply", ["451 4.7.0 Too many messages, slow down", "421 4.7.0 Try again later, closing connection"]
)
def test_smtp_rate_limit_reply_pauses_smtp_and_the_batch_fails_over(
    settings,  # noqa: ANN001
    providers: None,
    smtp: SMTPTestServer,
    sendgrid_server: SendGridTestServer,
    reply: str,
) -> None:
    chain(settings, "smtp", "sendgrid")
    smtp.reply_for("second@example.com", reply)
    batch = [
        factories.message("first@example.com"),
        factories.message("second@example.com"),
        factories.message("third@example.com"),
    ]
    assert send_messages([m.pk for m in batch]).sent == 3
    # SMTP took the first before it started refusing; that one is not sent again elsewhere.
    providers_used = dict(
        Message.objects.filter(pk__in=[m.pk for m in batch]).values_list("to_email", "provider")
    )
    assert providers_used == {
        "first@example.com": "smtp",
        "second@example.com": "sendgrid",
        "third@example.com": "sendgrid",
    }
    assert [m.rcpt_tos for m in smtp.messages] == [["first@example.com"]]
    assert pause_remaining(circuit_of("smtp")) > 0
    assert breakers.snapshot(circuit_of("smtp"))["failures_total"] == 0


def test_a_busy_mailbox_is_not_a_rate_limit(settings, providers: None, smtp: SMTPTestServer) -> None:  # noqa: ANN001
    chain(settings, "smtp")
    smtp.reply_for("busy@example.com", "451 4.3.0 mailbox busy, try again later")
    busy, fine = factories.message("busy@example.com"), factories.message("fine@example.com")
    send_messages([busy.pk, fine.pk])
    busy.refresh_from_db()
    assert busy.status == "retry_wait" and busy.attempts == 1  # a real attempt, spent
    assert pause_remaining(circuit_of("smtp")) == 0
    assert [m.rcpt_tos for m in smtp.messages] == [["fine@example.com"]]


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after("45") == 45
    in_two_minutes = format_datetime(timezone.now() + timedelta(seconds=120), usegmt=True)
    assert 110 <= parse_retry_after(in_two_minutes) <= 120
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_an_absurd_retry_after_is_capped(
    settings, providers: None, sendgrid_server: SendGridTestServer
) -> None:  # noqa: ANN001
    settings.EMAILHUB_THROTTLE_MAX_SECONDS = 120
    chain(settings, "sendgrid")
    sendgrid_server.fail_with(429, retry_after="86400")
    send_messages([factories.message().pk])
    assert 110 < pause_remaining(circuit_of("sendgrid")) <= 120


# --- item 6: an outage spends no attempts -------------------------------------------------------


def test_a_message_finding_every_circuit_open_keeps_its_attempt_and_waits_for_the_probe(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
) -> None:
    settings.EMAILHUB_BREAKER_FAIL_MAX = 1
    settings.EMAILHUB_BREAKER_RESET_TIMEOUT = 300.0
    chain(settings, "smtp")
    settings.SMTP_PORT = free_port()  # SMTP down
    close_all()
    first = factories.message("first@example.com")
    send_messages([first.pk])  # tried: fails and opens the circuit
    first.refresh_from_db()
    assert first.attempts == 1 and breakers.snapshot(circuit_of("smtp"))["state"] == "open", first.status

    second = factories.message("second@example.com")
    before = timezone.now()
    for _ in range(5):  # five retry cycles against the open circuit
        send_messages([second.pk])
        second.refresh_from_db()
        assert second.status == "retry_wait" and second.attempts == 0
        requeue(second)
    # It waits for the moment the circuit lets a probe through (300 s after it opened), not for
    # an exponential backoff, and says so once, without "smtp: smtp:".
    assert before + timedelta(seconds=295) <= second.due_at <= before + timedelta(seconds=300 + 31)
    assert second.last_error.startswith("smtp: circuit open, next probe in ")
    assert "smtp: smtp" not in second.last_error


def test_after_the_circuit_lets_a_probe_through_the_deferred_message_is_sent(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
) -> None:
    settings.EMAILHUB_BREAKER_FAIL_MAX = 1
    settings.EMAILHUB_BREAKER_RESET_TIMEOUT = 1.0
    real_port = settings.SMTP_PORT
    chain(settings, "smtp")
    settings.SMTP_PORT = free_port()
    close_all()
    message = factories.message()
    send_messages([message.pk])
    for _ in range(3):
        requeue(message)
        send_messages([message.pk])
    message.refresh_from_db()
    assert message.attempts == 1

    settings.SMTP_PORT = real_port  # SMTP is back
    close_all()
    wait_until(lambda: breakers.seconds_until_probe(circuit_of("smtp")) == 0, 5, "the probe to be due")
    requeue(message)
    assert send_messages([message.pk]).sent == 1
    message.refresh_from_db()
    assert message.status == "sent" and message.attempts == 2
    assert breakers.snapshot(circuit_of("smtp"))["state"] == "closed"
    assert [m.rcpt_tos for m in smtp.messages] == [["ann@example.com"]]


def test_a_probe_risks_one_message_of_its_batch_whether_it_fails_or_succeeds(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
) -> None:
    """A pooled task claims several messages; when its call is the circuit's probe, only the
    first is handed to the provider that may still be down. Failed: that one spent an attempt,
    the others none. Succeeded: that one is sent, the others wait for the closed circuit."""
    settings.EMAILHUB_BREAKER_FAIL_MAX = 1
    settings.EMAILHUB_BREAKER_RESET_TIMEOUT = 1.0
    chain(settings, "smtp")
    first = factories.message(to="first@example.com")
    smtp.reply_to_everyone("421 4.3.2 service not available")
    send_messages([first.pk])  # opens the circuit
    first.refresh_from_db()
    assert first.attempts == 1 and breakers.snapshot(circuit_of("smtp"))["state"] == "open", first.status

    batch = [factories.message(to=f"user{n}@example.com") for n in range(3)]
    ids = [first.pk] + [m.pk for m in batch]
    requeue(first)
    assert Message.objects.filter(pk__in=ids, status="queued").count() == 4
    wait_until(lambda: breakers.seconds_until_probe(circuit_of("smtp")) == 0, 5, "the probe to be due")
    send_messages(ids)  # the probe: fails

    def spent() -> int:
        return sum(Message.objects.filter(pk__in=ids).values_list("attempts", flat=True))

    assert spent() == 2  # the first's opening call, and the probe's one message
    assert breakers.snapshot(circuit_of("smtp"))["state"] == "open"
    assert smtp.messages == []

    smtp.reply_to_everyone(None)
    Message.objects.filter(pk__in=ids).update(status="queued")
    wait_until(lambda: breakers.seconds_until_probe(circuit_of("smtp")) == 0, 5, "the probe to be due")
    report = send_messages(ids)  # the probe: succeeds with one message; the rest wait, attempt kept
    assert report.sent == 1 and len(smtp.messages) == 1 and spent() == 3
    assert breakers.snapshot(circuit_of("smtp"))["state"] == "closed"
    Message.objects.filter(pk__in=ids, status="retry_wait").update(status="queued")
    assert send_messages(ids).sent == 3  # the circuit is closed: the rest go in one call
    assert set(Message.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"sent"}
    assert spent() == 6
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == sorted(
        ["first@example.com"] + [f"user{n}@example.com" for n in range(3)]
    )


FAIL_MAX = 1
RESET_TIMEOUT = 1.5


@pytest.mark.processes
def test_an_outage_on_real_processes_spends_one_attempt_per_probe_and_then_sends_everything_once(
    stack: Stack,
    api,  # noqa: ANN001
    smtp: SMTPTestServer,
) -> None:
    env = {
        "EMAILHUB_PROVIDERS_TRANSACTIONAL": "smtp",
        "EMAILHUB_BREAKER_FAIL_MAX": str(FAIL_MAX),
        "EMAILHUB_BREAKER_RESET_TIMEOUT": str(RESET_TIMEOUT),
        "EMAILHUB_RETRY_BASE_SECONDS": "0.2",
        "EMAILHUB_RETRY_MAX_SECONDS": "0.5",
        "EMAILHUB_MAX_ATTEMPTS": "1000",
    }
    smtp.reply_to_everyone("421 4.3.2 service not available")  # down, not rate limiting
    stack.start("worker-transactional", with_option(PROCESSES["worker-transactional"], "--concurrency", "1"),
                extra_env=env)  # fmt: skip
    stack.start("scheduler", extra_env=env)
    ids = [
        api.post(
            "/api/v1/messages",
            {"to": f"user{n}@example.com", "subject": "s", "text": "t", "priority": "critical"},
            format="json",
        ).json()["id"]
        for n in range(5)
    ]

    def opened() -> int:
        return int(breakers.snapshot(circuit_of("smtp"))["times_opened"])

    def spent() -> int:
        return sum(Message.objects.filter(pk__in=ids).values_list("attempts", flat=True))

    wait_until(lambda: opened() >= 1, 60, "the circuit to open")
    # The call that opened it spent an attempt for each message it was given (one task's claim:
    # one to five of them). Then let the outage last through several probe windows (each failed
    # probe re-opens the circuit).
    opened_first, spent_first = opened(), spent()
    wait_until(lambda: opened() >= opened_first + 3, 60, "three more openings")
    assert not Message.objects.filter(pk__in=ids, status__in=["sent", "failed"]).exists()
    # Every attempt spent since was a real call to SMTP, one message each: a probe, which
    # re-opened the circuit. With the old code every retry cycle (every 0.5 s here) spent one per
    # message; a probe risks one message of its batch (the rest wait, attempt kept).
    assert spent_first <= len(ids)
    assert spent() - spent_first <= opened() - opened_first + 1  # +1: a probe in flight while we read
    assert all("smtp: smtp" not in (m.last_error or "") for m in Message.objects.filter(pk__in=ids))

    smtp.reply_to_everyone(None)
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status="sent").count() == len(ids),
        60,
        f"every message sent ({Counter(Message.objects.filter(pk__in=ids).values_list('status', flat=True))})",
    )
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == sorted(f"user{n}@example.com" for n in range(5))
