"""SMTP bounces: DSNs (RFC 3464) built here around mail really sent by our SMTP provider to the
test SMTP server, read from an mbox and a Maildir by `manage.py ingest_bounces`."""

from __future__ import annotations

import base64
import mailbox
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from campaigns.models import Campaign, Contact, Suppression
from delivery import dsn
from delivery.models import EmailEvent, Message
from delivery.providers import get_provider
from delivery.providers.base import OutgoingEmail
from delivery.testing.smtp_server import SMTPTestServer
from tests.factories import make_audience, make_campaign

ROOT = Path(__file__).resolve().parent.parent


def send_for_real(smtp: SMTPTestServer, count: int) -> list[tuple[Message, bytes]]:
    """`count` campaign messages sent through the SMTP provider; (row, the bytes the server got)."""
    campaign = make_campaign(make_audience(count))
    sent: list[tuple[Message, bytes]] = []
    for contact in Contact.objects.order_by("id"):
        message = Message.objects.create(
            campaign=campaign, contact=contact, to_email=contact.email, priority="normal", status="sending"
        )
        email = OutgoingEmail(
            message_id=message.pk,
            to=contact.email,
            from_email="news@example.com",
            subject="Hi",
            text="Hello",
            html="",
        )
        (result,) = get_provider("smtp").send_batch([email])
        # What recording.py stores for an accepted SMTP send: the Message-ID without brackets.
        Message.objects.filter(pk=message.pk).update(
            status="sent", provider="smtp", provider_message_id=result.provider_message_id
        )
        sent.append((Message.objects.get(pk=message.pk), smtp.wait_for(len(sent) + 1)[-1].data))
    return sent


def make_dsn(
    original: bytes,
    *,
    recipient: str,
    action: str,
    status: str,
    diagnostic: str,
    dsn_id: str | None,
    returned: str = "text/rfc822-headers",
) -> bytes:
    """A DSN as Postfix writes one: human part, delivery-status, the returned headers or message."""
    headers, _, _ = original.partition(b"\r\n\r\n")
    returned_body = headers + b"\r\n" if returned == "text/rfc822-headers" else original
    lines = [
        b"From: MAILER-DAEMON@mx.example.net (Mail Delivery System)",
        b"To: bounces@example.com",
        b"Subject: Undelivered Mail Returned to Sender",
        b"Date: Tue, 02 Jun 2026 10:00:00 +0000",
        *([f"Message-ID: <{dsn_id}>".encode()] if dsn_id else []),
        b"MIME-Version: 1.0",
        b'Content-Type: multipart/report; report-type=delivery-status; boundary="BOUNDARY"',
        b"",
        b"--BOUNDARY",
        b"Content-Type: text/plain; charset=us-ascii",
        b"",
        b"I'm sorry to have to inform you that your message could not be delivered.",
        b"",
        b"--BOUNDARY",
        b"Content-Type: message/delivery-status",
        b"",
        b"Reporting-MTA: dns; mx.example.net",
        b"Arrival-Date: Tue, 02 Jun 2026 09:58:00 +0000",
        b"",
        f"Final-Recipient: rfc822; {recipient.upper()}".encode(),
        f"Original-Recipient: rfc822;{recipient}".encode(),
        f"Action: {action}".encode(),
        f"Status: {status}".encode(),
        b"Remote-MTA: dns; mail.example.org",
        f"Diagnostic-Code: smtp; {diagnostic}".encode(),
        b"Last-Attempt-Date: Tue, 02 Jun 2026 09:59:30 +0000",
        b"",
        b"--BOUNDARY",
        f"Content-Type: {returned}".encode(),
        b"",
        returned_body,
        b"--BOUNDARY--",
        b"",
    ]
    return b"\r\n".join(lines)


def auto_reply() -> bytes:
    return b"From: someone@example.org\r\nTo: bounces@example.com\r\nSubject: Out of office\r\n\r\nBack Monday.\r\n"


def write_mbox(path: Path, messages: list[bytes]) -> Path:
    box = mailbox.mbox(path)
    for raw in messages:
        box.add(raw)
    box.close()
    return path


def write_maildir(path: Path, messages: list[bytes]) -> Path:
    box = mailbox.Maildir(path, create=True)
    for raw in messages:
        box.add(raw)
    box.close()
    return path


def ingest(path: Path) -> str:
    out = StringIO()
    call_command("ingest_bounces", str(path), stdout=out)
    return out.getvalue()


def state() -> tuple[int, list[tuple[str, str]], list[tuple[int, int, int]]]:
    return (
        EmailEvent.objects.count(),
        sorted(Suppression.objects.values_list("email", "reason")),
        list(Campaign.objects.values_list("bounced_count", "complained_count", "unsubscribed_count")),
    )


def test_a_permanent_dsn_parses_into_one_report_per_recipient(smtp: SMTPTestServer, db: None) -> None:
    ((message, original),) = send_for_real(smtp, 1)
    raw = make_dsn(
        original,
        recipient=message.to_email,
        action="failed",
        status="5.1.1",
        diagnostic="550 5.1.1 <r1@example.com>: Recipient address rejected: User unknown",
        dsn_id="20260602100000.ABC@mx.example.net",
    )

    (report,) = dsn.parse(raw)

    assert report.recipient == message.to_email  # lower-cased from the upper-case Final-Recipient
    assert (report.kind, report.action, report.status, report.bounce) == (
        "bounced",
        "failed",
        "5.1.1",
        "permanent",
    )
    assert report.diagnostic == "550 5.1.1 <r1@example.com>: Recipient address rejected: User unknown"
    assert report.message_id == message.pk
    assert report.original_message_id == message.provider_message_id
    assert report.event_id == f"20260602100000.ABC@mx.example.net/{message.to_email}"
    assert report.occurred_at is not None and report.occurred_at.isoformat() == "2026-06-02T09:59:30+00:00"
    assert dsn.parse(auto_reply()) == []


def test_a_base64_encoded_delivery_status_part_is_decoded() -> None:
    status = b"Reporting-MTA: dns; mx\r\n\r\nFinal-Recipient: rfc822; A@B.org\r\nAction: failed\r\nStatus: 5.1.1\r\n"
    raw = (
        b"MIME-Version: 1.0\r\nMessage-ID: <q@x>\r\n"
        b'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n\r\n'
        b"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n"
        b"--B\r\nContent-Type: message/delivery-status\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        + base64.encodebytes(status)
        + b"--B--\r\n"
    )
    assert [(r.recipient, r.bounce, r.event_id) for r in dsn.parse(raw)] == [
        ("a@b.org", "permanent", "q@x/a@b.org")
    ]


def test_an_mbox_of_dsns_suppresses_permanent_failures_only(
    smtp: SMTPTestServer, db: None, tmp_path: Path
) -> None:
    (hard, hard_raw), (soft, soft_raw), (late, late_raw) = send_for_real(smtp, 3)
    path = write_mbox(
        tmp_path / "bounces.mbox",
        [
            make_dsn(hard_raw, recipient=hard.to_email, action="failed", status="5.1.1",
                     diagnostic="550 5.1.1 user unknown", dsn_id="dsn-1@mx.example.net"),
            make_dsn(soft_raw, recipient=soft.to_email, action="failed", status="4.2.2",
                     diagnostic="452 4.2.2 mailbox full", dsn_id="dsn-2@mx.example.net", returned="message/rfc822"),
            make_dsn(late_raw, recipient=late.to_email, action="delayed", status="4.4.1",
                     diagnostic="connect timed out", dsn_id="dsn-3@mx.example.net"),
            auto_reply(),
        ],
    )  # fmt: skip

    output = ingest(path)

    assert "4 message(s) read" in output and "3 DSN(s), 1 not a DSN" in output
    assert (
        "recorded 3 new event(s), 0 already recorded; 1 address(es) suppressed; 0 new event(s) matched"
        in output
    )
    assert state() == (3, [(hard.to_email, "bounced")], [(1, 0, 0)])
    events = {e.message_id: e for e in EmailEvent.objects.all()}
    assert (events[hard.pk].kind, events[hard.pk].bounce, events[hard.pk].provider) == (
        "bounced",
        "permanent",
        "smtp",
    )
    assert events[hard.pk].detail == "5.1.1; 550 5.1.1 user unknown"
    assert (events[soft.pk].kind, events[soft.pk].bounce) == ("bounced", "transient")
    assert (events[late.pk].kind, events[late.pk].bounce) == ("delayed", "")
    assert events[hard.pk].provider_event_id == f"dsn-1@mx.example.net/{hard.to_email}"


def test_reading_a_maildir_twice_records_each_bounce_once(
    smtp: SMTPTestServer, db: None, tmp_path: Path
) -> None:
    (first, first_raw), (second, second_raw) = send_for_real(smtp, 2)
    path = write_maildir(
        tmp_path / "Maildir",
        [
            make_dsn(first_raw, recipient=first.to_email, action="failed", status="5.7.1",
                     diagnostic="550 5.7.1 rejected by policy", dsn_id="m-1@mx.example.net"),
            # No Message-ID on the DSN: its id is a digest of what it reports, still stable.
            make_dsn(second_raw, recipient=second.to_email, action="failed", status="5.2.1",
                     diagnostic="550 5.2.1 mailbox disabled", dsn_id=None),
        ],
    )  # fmt: skip

    ingest(path)
    after_first = state()
    output = ingest(path)

    assert after_first == (2, [(first.to_email, "bounced"), (second.to_email, "bounced")], [(2, 0, 0)])
    assert state() == after_first
    assert "recorded 0 new event(s), 2 already recorded; 0 address(es) suppressed" in output


def test_a_dsn_is_matched_by_message_id_when_the_header_was_not_returned(
    smtp: SMTPTestServer, db: None, tmp_path: Path
) -> None:
    ((message, original),) = send_for_real(smtp, 1)
    stripped = b"\r\n".join(
        line for line in original.split(b"\r\n") if not line.startswith(b"X-Emailhub-Message")
    )
    path = write_mbox(
        tmp_path / "mbox",
        [
            make_dsn(
                stripped,
                recipient=message.to_email,
                action="failed",
                status="5.1.1",
                diagnostic="550",
                dsn_id="x@y",
            )
        ],
    )

    ingest(path)

    assert EmailEvent.objects.get().message_id == message.pk  # through Message.provider_message_id


def test_an_x_emailhub_message_header_contradicted_by_the_message_id_is_not_believed(
    smtp: SMTPTestServer, db: None, tmp_path: Path
) -> None:
    (victim, _), (sender, sender_raw) = send_for_real(smtp, 2)
    # A forged DSN: another message's id in the header anyone can write, our real Message-ID of
    # `sender` beside it. Only the HMAC'd Message-ID is believed.
    forged = sender_raw.replace(
        f"X-Emailhub-Message: {sender.pk}".encode(), f"X-Emailhub-Message: {victim.pk}".encode()
    )
    path = write_mbox(
        tmp_path / "mbox",
        [
            make_dsn(
                forged,
                recipient=sender.to_email,
                action="failed",
                status="5.1.1",
                diagnostic="550",
                dsn_id="f@y",
            )
        ],
    )

    ingest(path)

    assert EmailEvent.objects.get().message_id == sender.pk


@pytest.mark.django_db
def test_a_bad_path_or_format_is_a_clear_error(tmp_path: Path) -> None:
    not_mbox = tmp_path / "notes.txt"
    not_mbox.write_text("hello\n")
    (tmp_path / "plain_dir").mkdir()
    for path, message in (
        (tmp_path / "missing", "does not exist"),
        (not_mbox, "is not an mbox file"),
        (tmp_path / "plain_dir", "is a directory but not a Maildir"),
    ):
        with pytest.raises(CommandError, match=message):
            ingest(path)
    assert EmailEvent.objects.count() == 0


def test_the_command_exits_non_zero_on_a_bad_path(tmp_path: Path) -> None:
    db = settings.DATABASES["default"]
    result = subprocess.run(
        [sys.executable, "manage.py", "ingest_bounces", str(tmp_path / "missing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "emailhub.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "REDIS_URL": settings.REDIS_URL,
        },
    )
    assert result.returncode == 1
    assert "does not exist" in result.stderr
