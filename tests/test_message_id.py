"""Every attempt of one message carries one Message-ID, through SMTP, SES and SendGrid alike.

A receiver can only drop the duplicate that a crash causes (the documented one: a worker killed
after the provider accepted but before `sent` was recorded) if both copies carry the same
Message-ID (RFC 5322 §3.6.4).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from delivery.models import Message, MessageStatus
from delivery.providers import close_all
from delivery.providers.mime import message_id_for
from delivery.services.sending import send_messages
from delivery.services.sweeps import requeue_stale_sending
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)

# RFC 5322 §3.6.4 msg-id with a dot-atom left side: what every receiver can parse.
MSG_ID = re.compile(r"^<[a-z2-7]{26}@[A-Za-z0-9.-]+>$")


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
    settings.EMAILHUB_MESSAGE_ID_DOMAIN = "mail.example.com"
    close_all()
    yield
    close_all()
    ses_server.reset()
    sendgrid_server.clear()


def use_chain(settings, *names: str) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = list(names)
    close_all()


def crash_after_the_provider_accepted(message: Message) -> None:
    """Put the row back where a worker killed before recording `sent` leaves it, then let the
    stale-claim sweep requeue it, as beat does after the lease."""
    Message.objects.filter(pk=message.pk).update(
        status=MessageStatus.SENDING, claimed_at=timezone.now() - timedelta(hours=1)
    )
    assert requeue_stale_sending() == 1


def test_a_message_resent_after_a_crash_through_each_provider_carries_one_message_id(
    settings,  # noqa: ANN001
    providers: None,
    smtp: SMTPTestServer,
    ses_server: SESTestServer,
    sendgrid_server: SendGridTestServer,
) -> None:
    message = Message.objects.create(
        to_email="ann@example.com", subject="Receipt", text="t", html="<p>h</p>", priority="critical"
    )
    use_chain(settings, "smtp")
    assert send_messages([message.pk]).sent == 1
    crash_after_the_provider_accepted(message)
    use_chain(settings, "ses")
    assert send_messages([message.pk]).sent == 1
    crash_after_the_provider_accepted(message)
    use_chain(settings, "sendgrid")
    assert send_messages([message.pk]).sent == 1

    via_smtp = smtp.wait_for(1)[0].parsed()["Message-ID"]
    [(_, via_ses)] = ses_server.sent()
    [via_sendgrid] = sendgrid_server.delivered
    assert via_smtp == via_ses["Message-ID"] == via_sendgrid.headers["Message-ID"]
    assert MSG_ID.match(via_smtp) and via_smtp.endswith("@mail.example.com>")
    message.refresh_from_db()
    assert message.attempts == 3 and message.status == "sent"


def test_a_failover_after_a_refused_attempt_keeps_the_message_id(
    settings,  # noqa: ANN001
    providers: None,
    smtp: SMTPTestServer,
    sendgrid_server: SendGridTestServer,
) -> None:
    smtp.reply_for("bob@example.com", "451 4.3.0 mailbox busy")
    message = Message.objects.create(to_email="bob@example.com", subject="s", text="t", priority="critical")
    use_chain(settings, "smtp")
    send_messages([message.pk])
    message.refresh_from_db()
    assert message.status == "retry_wait"
    # The retry goes out through another provider (SMTP now unreachable, then SendGrid).
    Message.objects.filter(pk=message.pk).update(status=MessageStatus.QUEUED)
    settings.SMTP_PORT = free_port()
    use_chain(settings, "smtp", "sendgrid")
    assert send_messages([message.pk]).sent == 1
    [delivered] = sendgrid_server.delivered
    assert delivered.headers["Message-ID"] == message_id_for(message.pk, "mail.example.com")


def test_message_ids_are_distinct_per_message_and_reveal_nothing(settings) -> None:  # noqa: ANN001
    ids = [message_id_for(n, "d.example") for n in range(1, 2001)]
    assert len(set(ids)) == 2000
    assert all(MSG_ID.match(i) for i in ids)
    assert ids[0] == message_id_for(1, "d.example")  # stable
    assert not any(i.startswith(f"<{n}.") for n, i in enumerate(ids, 1))  # no visible id
    # Keyed by SECRET_KEY: without it, no one can compute another message's id.
    settings.SECRET_KEY = "another-secret-key-of-enough-length-for-the-check-0123456789"
    assert message_id_for(1, "d.example") != ids[0]
