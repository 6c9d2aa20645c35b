from __future__ import annotations

import pytest

from delivery.exceptions import ProviderUnavailable
from delivery.providers.base import Outcome, OutgoingEmail
from delivery.providers.smtp import SMTPProvider
from delivery.testing.smtp_server import SMTPTestServer, free_port


def email(n: int, to: str | None = None) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=n,
        to=to or f"user{n}@example.com",
        from_email="Shop <shop@example.com>",
        subject=f"Receipt {n} — ünïcode",
        text=f"text body {n}",
        html=f"<p>html body {n}</p>",
        reply_to="help@example.com",
    )


def provider(server: SMTPTestServer) -> SMTPProvider:
    return SMTPProvider(host=server.host, port=server.port, timeout=5)


def test_message_is_well_formed_multipart_alternative_with_each_header_once(smtp: SMTPTestServer) -> None:
    results = provider(smtp).send_batch([email(1)])
    assert results[0].outcome is Outcome.ACCEPTED
    [received] = smtp.wait_for(1)
    assert received.rcpt_tos == ["user1@example.com"] and received.mail_from == "shop@example.com"
    parsed = received.parsed()
    assert parsed.defects == []
    for header in ("Message-ID", "Date", "From", "To", "Subject"):
        assert len(parsed.get_all(header) or []) == 1, header
    assert parsed["Subject"] == "Receipt 1 — ünïcode"
    assert parsed["Message-ID"].strip("<>") == results[0].provider_message_id
    assert parsed.get_content_type() == "multipart/alternative"
    text, html = parsed.get_payload()
    assert text.get_content_type() == "text/plain" and "text body 1" in text.get_content()
    assert html.get_content_type() == "text/html" and "html body 1" in html.get_content()
    assert all(part.defects == [] for part in (text, html))


def test_message_ids_are_unique_across_messages(smtp: SMTPTestServer) -> None:
    results = provider(smtp).send_batch([email(n) for n in range(20)])
    ids = {r.provider_message_id for r in results}
    assert len(ids) == 20


def test_one_connection_carries_many_messages(smtp: SMTPTestServer) -> None:
    smtp_provider = provider(smtp)
    smtp_provider.send_batch([email(n) for n in range(5)])
    smtp_provider.send_batch([email(n) for n in range(5, 10)])
    assert smtp.wait_for(10) and smtp.count == 10
    assert len({m.peer for m in smtp.messages}) == 1  # one client address and port: one connection


def test_dropped_connection_is_reopened_and_the_message_still_goes(smtp: SMTPTestServer) -> None:
    smtp_provider = provider(smtp)
    smtp_provider.send_batch([email(1)])
    smtp.drop_next_connections(1)  # the server closes on the next MAIL FROM
    results = smtp_provider.send_batch([email(2)])
    assert results[0].outcome is Outcome.ACCEPTED
    assert [m.rcpt_tos for m in smtp.wait_for(2)] == [["user1@example.com"], ["user2@example.com"]]


def test_5xx_recipient_is_permanent_and_4xx_is_transient(smtp: SMTPTestServer) -> None:
    smtp.reply_for("gone@example.com", "550 5.1.1 mailbox unavailable")
    smtp.reply_for("busy@example.com", "451 4.3.0 try again later")
    results = provider(smtp).send_batch(
        [email(1, "gone@example.com"), email(2, "busy@example.com"), email(3)]
    )
    assert [r.outcome for r in results] == [Outcome.PERMANENT, Outcome.TRANSIENT, Outcome.ACCEPTED]
    assert "550" in results[0].error and "451" in results[1].error
    assert smtp.count == 1


def test_unreachable_server_raises_provider_unavailable() -> None:
    dead = SMTPProvider(host="127.0.0.1", port=free_port(), timeout=1)
    with pytest.raises(ProviderUnavailable, match="cannot connect"):
        dead.send_batch([email(1)])


def test_421_to_every_recipient_means_the_server_is_unavailable(smtp: SMTPTestServer) -> None:
    smtp.reply_to_everyone("421 4.3.2 service shutting down")
    with pytest.raises(ProviderUnavailable, match="421"):
        provider(smtp).send_batch([email(1), email(2)])


def test_sender_refused_at_mail_from_is_the_provider_failing_not_the_recipient(smtp: SMTPTestServer) -> None:
    smtp.reply_to_mail_from("530 5.7.0 Authentication required")
    with pytest.raises(ProviderUnavailable, match="MAIL FROM.*SMTP_USERNAME"):
        provider(smtp).send_batch([email(1)])


def test_content_refused_after_data_fails_the_message_without_suppressing_the_address(
    smtp: SMTPTestServer,
) -> None:
    smtp.reply_to_data("554 5.6.0 message content rejected")
    [result] = provider(smtp).send_batch([email(1)])
    assert result.outcome is Outcome.PERMANENT and result.suppress is False and "554" in result.error
