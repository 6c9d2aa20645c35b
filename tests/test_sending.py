from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from campaigns.models import Contact, Suppression, Template
from delivery.models import Message, MessageStatus
from delivery.providers import close_all
from delivery.providers.base import Provider
from delivery.services.sending import retry_delay, send_messages
from delivery.testing.smtp_server import SMTPTestServer, free_port
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queued_message_is_sent_and_recorded(smtp: SMTPTestServer) -> None:
    message = factories.message()
    report = send_messages([message.pk])
    assert (report.claimed, report.sent) == (1, 1)
    message.refresh_from_db()
    assert message.status == "sent" and message.provider == "smtp" and message.attempts == 1
    assert message.sent_at is not None and message.provider_message_id
    assert smtp.wait_for(1)[0].rcpt_tos == ["ann@example.com"]


def test_a_redelivered_task_sends_nothing_twice(smtp: SMTPTestServer) -> None:
    message = factories.message()
    send_messages([message.pk])
    report = send_messages([message.pk])
    assert report.claimed == 0
    assert smtp.count == 1


def test_two_workers_racing_for_one_batch_send_each_message_once(smtp: SMTPTestServer) -> None:
    ids = [factories.message(f"user{n}@example.com").pk for n in range(30)]

    def worker(_: int) -> int:
        try:
            return send_messages(ids).sent
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        sent = sum(pool.map(worker, range(4)))
    assert sent == 30
    assert sorted(m.rcpt_tos[0] for m in smtp.wait_for(30)) == sorted(
        f"user{n}@example.com" for n in range(30)
    )
    assert Message.objects.filter(status="sent").count() == 30


def test_only_queued_rows_are_claimed(smtp: SMTPTestServer) -> None:
    cancelled = factories.message(status=MessageStatus.CANCELLED)
    scheduled = factories.message(status=MessageStatus.SCHEDULED, due_at=timezone.now() + timedelta(hours=1))
    assert send_messages([cancelled.pk, scheduled.pk]).claimed == 0
    assert smtp.count == 0


def test_template_is_rendered_with_contact_and_request_context(smtp: SMTPTestServer) -> None:
    template = Template.objects.create(
        name="welcome", subject="Welcome {{ first_name }}", html="<p>{{ plan }}</p>", text="Plan {{ plan }}"
    )
    contact = Contact.objects.create(email="bob@example.com", attributes={"first_name": "Bob"})
    message = factories.message("bob@example.com", subject=None, text=None, template=template, contact=contact,
                     context={"plan": "<Pro>"})  # fmt: skip
    send_messages([message.pk])
    parsed = smtp.wait_for(1)[0].parsed()
    assert parsed["Subject"] == "Welcome Bob"
    text, html = parsed.get_payload()
    assert "Plan <Pro>" in text.get_content() and "&lt;Pro&gt;" in html.get_content()


def test_suppressed_address_is_not_sent(smtp: SMTPTestServer) -> None:
    Suppression.objects.create(
        email="gone@example.com", reason="manual"
    )  # an unsubscribe would stop campaign mail only
    message = factories.message("Gone@Example.com")
    report = send_messages([message.pk])
    assert report.suppressed == 1
    message.refresh_from_db()
    assert message.status == "suppressed"
    assert smtp.count == 0


def test_permanent_refusal_fails_the_message_and_suppresses_the_address(smtp: SMTPTestServer) -> None:
    smtp.reply_for("gone@example.com", "550 5.1.1 no such user")
    first = factories.message("gone@example.com")
    send_messages([first.pk])
    first.refresh_from_db()
    assert first.status == "failed" and "550" in first.last_error
    assert Suppression.objects.get(email="gone@example.com").reason == "bounced"
    second = factories.message("gone@example.com")
    send_messages([second.pk])
    second.refresh_from_db()
    assert second.status == "suppressed"
    assert smtp.count == 0


def test_transient_refusal_waits_for_a_retry_with_backoff(smtp: SMTPTestServer) -> None:
    smtp.reply_for("busy@example.com", "451 4.3.0 mailbox busy")
    message = factories.message("busy@example.com")
    before = timezone.now()
    report = send_messages([message.pk])
    assert report.retrying == 1
    message.refresh_from_db()
    assert message.status == "retry_wait" and "451" in message.last_error
    assert message.due_at > before


def test_the_last_attempt_fails_for_good(smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_MAX_ATTEMPTS = 2
    smtp.reply_to_everyone("451 4.3.0 busy")
    message = factories.message(attempts=1)
    send_messages([message.pk])
    message.refresh_from_db()
    assert message.status == "failed" and message.attempts == 2
    assert "gave up after 2 attempts" in message.last_error


def test_unreachable_provider_means_retry_not_loss(smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001

    settings.SMTP_PORT = free_port()
    close_all()
    message = factories.message()
    send_messages([message.pk])
    message.refresh_from_db()
    assert message.status == "retry_wait" and "cannot connect" in message.last_error


def test_backoff_grows_exponentially_with_jitter_and_a_cap(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_RETRY_BASE_SECONDS = 10
    settings.EMAILHUB_RETRY_MAX_SECONDS = 100
    for attempt, ceiling in [(1, 10), (2, 20), (3, 40), (4, 80), (5, 100), (9, 100)]:
        delays = [retry_delay(attempt).total_seconds() for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt


def test_a_message_that_cannot_be_built_fails_without_suppressing_the_address(smtp: SMTPTestServer) -> None:
    message = factories.message("zoë@example.com")
    send_messages([message.pk])
    message.refresh_from_db()
    assert message.status == "failed" and "SMTPUTF8" in message.last_error
    assert not Suppression.objects.exists()
    assert smtp.count == 0


def test_a_template_that_no_longer_compiles_fails_its_messages_without_stranding_the_batch(
    smtp: SMTPTestServer,
) -> None:
    broken = Template.objects.create(name="broken", subject="ok", text="fine")
    Template.objects.filter(pk=broken.pk).update(text="Hi {{ first name }}")  # saved around validation
    bad = factories.message("a@example.com", subject=None, text=None, template=broken)
    good = factories.message("b@example.com")
    report = send_messages([bad.pk, good.pk])
    assert (report.sent, report.failed) == (1, 1)
    bad.refresh_from_db()
    assert bad.status == "failed" and "does not compile" in bad.last_error
    assert not Suppression.objects.exists()


class BuggyProvider(Provider):
    name = "buggy"

    def send_batch(self, emails, guard):  # noqa: ANN001, ANN201
        raise KeyError("a bug")


def test_an_unexpected_provider_error_fails_over_and_records_instead_of_stranding(
    smtp: SMTPTestServer, settings
) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDER_CLASSES = [
        *settings.EMAILHUB_PROVIDER_CLASSES,
        "tests.test_sending.BuggyProvider",
    ]
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["buggy"]
    try:
        message = factories.message()
        send_messages([message.pk])
    finally:
        close_all()
    message.refresh_from_db()
    assert message.status == "retry_wait" and "unexpected error" in message.last_error


def test_a_rate_limit_without_redis_sends_unmetered(smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001
    from delivery import breakers

    settings.EMAILHUB_RATE_LIMITS = {"smtp": 10.0}
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    breakers.reset_process_state()
    message = factories.message()
    assert send_messages([message.pk]).sent == 1
    assert smtp.wait_for(1)
