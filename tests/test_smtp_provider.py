from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from aiosmtpd.controller import Controller

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers.base import Outcome, OutgoingEmail
from delivery.providers.smtp import SMTPProvider
from delivery.testing.smtp_server import SMTPTestServer, free_port
from tests.conftest import CountedGuard


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


# --- PIPELINING (RFC 2920) ------------------------------------------------------------------


def counting_writes(smtp_provider: SMTPProvider) -> list[bytes]:
    """Open the provider's connection and record every write it makes from now on (the real
    socket writes still happen: this only keeps a copy of what smtplib's send() was given)."""
    connection = smtp_provider._connect()
    connection.ehlo_or_helo_if_needed()
    writes: list[bytes] = []
    send = connection.send

    def recording_send(data: bytes | str) -> None:
        writes.append(data if isinstance(data, bytes) else data.encode())
        send(data)

    connection.send = recording_send  # type: ignore[method-assign]
    return writes


def test_pipelined_batch_makes_one_write_per_message(smtp: SMTPTestServer) -> None:
    smtp_provider = provider(smtp)
    writes = counting_writes(smtp_provider)
    results = smtp_provider.send_batch([email(n) for n in range(1, 6)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 5
    # Five groups of MAIL+RCPT+DATA (each after the previous content), then the last content.
    assert len(writes) == 6
    assert writes[0].startswith(b"MAIL FROM:<shop@example.com>\r\nRCPT TO:<user1@example.com>\r\nDATA\r\n")
    assert writes[1].endswith(
        b"\r\n.\r\nMAIL FROM:<shop@example.com>\r\nRCPT TO:<user2@example.com>\r\nDATA\r\n"
    )
    assert writes[-1].endswith(b"\r\n.\r\n") and b"MAIL FROM" not in writes[-1]
    received = smtp.wait_for(5)
    assert [m.rcpt_tos for m in received] == [[f"user{n}@example.com"] for n in range(1, 6)]
    assert all(m.parsed().defects == [] for m in received)
    assert [m.parsed()["Message-ID"].strip("<>") for m in received] == [
        r.provider_message_id for r in results
    ]


def test_server_without_pipelining_gets_one_command_per_write() -> None:
    with SMTPTestServer(pipelining=False) as server:
        smtp_provider = provider(server)
        writes = counting_writes(smtp_provider)
        results = smtp_provider.send_batch([email(n) for n in range(1, 4)])
        assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 3
        assert not any(w.startswith(b"MAIL") and b"RCPT" in w for w in writes)
        assert server.wait_for(3) and server.count == 3
        smtp_provider.close()


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-by-one"])
def test_each_recipient_gets_its_own_outcome_in_a_mixed_batch(pipelining: bool) -> None:
    with SMTPTestServer(pipelining=pipelining) as server:
        server.reply_for("gone@example.com", "550 5.1.1 mailbox unavailable")
        server.reply_for("busy@example.com", "451 4.3.0 try again later")
        batch = [
            email(1), email(2, "gone@example.com"), email(3), email(4, "busy@example.com"), email(5),
            email(6, "bad local ü@example.com"),  # cannot be sent without SMTPUTF8: only itself fails
            email(7),
        ]  # fmt: skip
        smtp_provider = provider(server)
        results = smtp_provider.send_batch(batch)
        outcomes = [r.outcome for r in results]
        assert outcomes == [
            Outcome.ACCEPTED, Outcome.PERMANENT, Outcome.ACCEPTED, Outcome.TRANSIENT, Outcome.ACCEPTED,
            Outcome.PERMANENT, Outcome.ACCEPTED,
        ]  # fmt: skip
        assert "550" in results[1].error and results[1].suppress is True
        assert "451" in results[3].error
        assert "cannot be built" in results[5].error and results[5].suppress is False
        received = server.wait_for(4)
        assert [m.rcpt_tos for m in received] == [[f"user{n}@example.com"] for n in (1, 3, 5, 7)]
        smtp_provider.close()


def test_pipelined_content_refused_is_permanent_unsuppressed_and_the_next_message_still_goes() -> None:
    with SMTPTestServer() as server:
        smtp_provider = provider(server)
        smtp_provider.send_batch([email(1)])
        server.reply_to_data("554 5.6.0 message content rejected")
        [refused] = smtp_provider.send_batch([email(2)])
        server.reply_to_data(None)
        [accepted] = smtp_provider.send_batch([email(3)])
        assert refused.outcome is Outcome.PERMANENT and refused.suppress is False and "554" in refused.error
        assert accepted.outcome is Outcome.ACCEPTED
        assert [m.rcpt_tos for m in server.wait_for(2)] == [["user1@example.com"], ["user3@example.com"]]
        smtp_provider.close()


def test_pipelined_batch_survives_a_dropped_connection_and_sends_each_message_once(
    smtp: SMTPTestServer,
) -> None:
    smtp_provider = provider(smtp)
    smtp_provider.send_batch([email(1)])
    smtp.drop_next_connections(1)  # the server closes on the next MAIL FROM
    results = smtp_provider.send_batch([email(n) for n in range(2, 8)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 6
    received = smtp.wait_for(7)
    assert sorted(m.rcpt_tos[0] for m in received) == sorted(f"user{n}@example.com" for n in range(1, 8))
    assert len({m.peer for m in received}) == 2  # the first connection, then one reconnect


def test_pipelined_slow_down_mid_batch_keeps_what_was_accepted(smtp: SMTPTestServer) -> None:
    smtp.reply_for("user3@example.com", "451 4.7.0 Too many messages, slow down")
    with pytest.raises(ProviderThrottled) as caught:
        provider(smtp).send_batch([email(n) for n in range(1, 6)])
    partial = caught.value.partial
    assert sorted(partial) == [1, 2] and all(r.outcome is Outcome.ACCEPTED for r in partial.values())
    assert [m.rcpt_tos for m in smtp.wait_for(2)] == [["user1@example.com"], ["user2@example.com"]]


def test_pipelined_batch_through_postfix_smtp_sink() -> None:
    """The sink the benchmarks measure with (Postfix's smtp-sink, which offers PIPELINING)."""
    from bench.lib.smtp_sink import PostfixSink, SinkUnavailable

    try:
        sink = PostfixSink()
        sink.start()
    except SinkUnavailable as exc:
        pytest.skip(f"Postfix smtp-sink not available: {exc}")
    try:
        smtp_provider = SMTPProvider(host=sink.host, port=sink.port, timeout=5)
        assert smtp_provider._connect().ehlo()[0] == 250 and smtp_provider._connect().has_extn("pipelining")
        results = smtp_provider.send_batch([email(n) for n in range(200)])
        assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 200
        smtp_provider.close()
        assert sink.count() == 200
    finally:
        sink.stop()


# --- several connections per provider (SMTP_CONNECTIONS) ---------------------------------------


def several(server: SMTPTestServer, connections: int) -> SMTPProvider:
    return SMTPProvider(host=server.host, port=server.port, timeout=5, connections=connections)


def test_a_batch_is_spread_over_several_pipelined_connections(smtp: SMTPTestServer) -> None:
    smtp_provider = several(smtp, 3)
    results = smtp_provider.send_batch([email(n) for n in range(1, 61)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 60
    received = smtp.wait_for(60)
    assert sorted(m.rcpt_tos[0] for m in received) == sorted(f"user{n}@example.com" for n in range(1, 61))
    assert len({m.peer for m in received}) == 3
    by_rcpt = {m.rcpt_tos[0]: m.parsed()["Message-ID"].strip("<>") for m in received}
    assert [by_rcpt[f"user{n}@example.com"] for n in range(1, 61)] == [r.provider_message_id for r in results]
    smtp_provider.send_batch([email(n) for n in range(61, 121)])  # the same three connections again
    assert len({m.peer for m in smtp.wait_for(120)}) == 3
    smtp_provider.close()


def test_a_small_batch_keeps_one_connection(smtp: SMTPTestServer) -> None:
    smtp_provider = several(smtp, 4)
    assert [r.outcome for r in smtp_provider.send_batch([email(n) for n in range(1, 11)])] == [
        Outcome.ACCEPTED
    ] * 10
    assert len({m.peer for m in smtp.wait_for(10)}) == 1
    smtp_provider.close()


def test_several_connections_keep_per_recipient_outcomes_and_reset_after_a_refusal(
    smtp: SMTPTestServer,
) -> None:
    smtp.reply_for("gone@example.com", "550 5.1.1 mailbox unavailable")
    smtp_provider = several(smtp, 2)
    # 40 messages over 2 connections (alternately): every fifth refused, and the last two, so
    # each connection's last transaction of the batch fails at RCPT.
    gone = {n for n in range(1, 41) if n % 5 == 0 or n > 38}
    first = smtp_provider.send_batch(
        [email(n, "gone@example.com" if n in gone else None) for n in range(1, 41)]
    )
    assert [r.outcome for r in first] == [
        Outcome.PERMANENT if n in gone else Outcome.ACCEPTED for n in range(1, 41)
    ]
    assert all("550" in r.error and r.suppress for n, r in zip(range(1, 41), first, strict=True) if n in gone)
    # ... so the next batch starts with RSET on both, and goes.
    second = smtp_provider.send_batch([email(n) for n in range(41, 81)])
    assert [r.outcome for r in second] == [Outcome.ACCEPTED] * 40
    expected = sorted(f"user{n}@example.com" for n in range(1, 81) if n not in gone)
    assert sorted(m.rcpt_tos[0] for m in smtp.wait_for(len(expected))) == expected
    assert len({m.peer for m in smtp.messages}) == 2
    smtp_provider.close()


def test_several_connections_survive_a_dropped_one_and_send_each_message_once(smtp: SMTPTestServer) -> None:
    smtp_provider = several(smtp, 3)
    smtp_provider.send_batch([email(n) for n in range(1, 61)])
    smtp.drop_next_connections(1)  # whichever connection sends the next MAIL FROM is closed
    results = smtp_provider.send_batch([email(n) for n in range(61, 121)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 60
    received = smtp.wait_for(120)
    assert sorted(m.rcpt_tos[0] for m in received) == sorted(f"user{n}@example.com" for n in range(1, 121))
    smtp_provider.close()


def test_slow_down_on_one_connection_reports_exactly_what_the_server_took(smtp: SMTPTestServer) -> None:
    smtp.reply_for("user20@example.com", "451 4.7.0 Too many messages, slow down")
    smtp_provider = several(smtp, 3)
    with pytest.raises(ProviderThrottled) as caught:
        smtp_provider.send_batch([email(n) for n in range(1, 61)])
    partial = caught.value.partial
    assert all(r.outcome is Outcome.ACCEPTED for r in partial.values()) and 20 not in partial
    # The other connections finished what was in flight and started nothing new: the accepted
    # results are exactly the messages the server received (none is sent twice on retry).
    time.sleep(0.2)
    assert sorted(int(m.rcpt_tos[0][4:].split("@")[0]) for m in smtp.messages) == sorted(partial)
    assert 10 < len(partial) < 30
    smtp_provider.close()


def test_a_lost_claim_stops_a_pipelined_lane_before_the_next_message(smtp: SMTPTestServer) -> None:
    guard = CountedGuard({n: 0 for n in range(4, 8)})  # the claim is lost after message 3
    smtp_provider = provider(smtp)
    results = smtp_provider.send_batch([email(n) for n in range(1, 8)], guard)
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 3 + [Outcome.ABANDONED] * 4
    assert sorted(m.rcpt_tos[0] for m in smtp.wait_for(3)) == [f"user{n}@example.com" for n in (1, 2, 3)]
    assert [r.outcome for r in smtp_provider.send_batch([email(8)])] == [Outcome.ACCEPTED]
    assert smtp.wait_for(4) and smtp.count == 4
    smtp_provider.close()


def test_a_claim_lost_between_data_and_the_content_leaves_that_message_unsent(smtp: SMTPTestServer) -> None:
    # Message 2 is allowed when the batch starts and when its MAIL FROM goes, no longer when its
    # content would: the worker stalled while it waited for the 354. Its content is never
    # written: the connection is closed mid-transaction, and message 3, still held, goes over a
    # new one.
    guard = CountedGuard({2: 2})
    smtp_provider = provider(smtp)
    results = smtp_provider.send_batch([email(1), email(2), email(3)], guard)
    assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.ABANDONED, Outcome.ACCEPTED]
    assert guard.asked.count(2) == 3
    received = smtp.wait_for(2)
    assert sorted(m.rcpt_tos[0] for m in received) == ["user1@example.com", "user3@example.com"]
    assert len({m.peer for m in received}) == 2
    smtp_provider.close()


def test_a_lost_claim_stops_one_by_one_sending_before_the_next_message() -> None:
    with SMTPTestServer(pipelining=False) as server:
        results = provider(server).send_batch([email(1), email(2), email(3)], CountedGuard({2: 0, 3: 0}))
        assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.ABANDONED, Outcome.ABANDONED]
        assert [m.rcpt_tos[0] for m in server.wait_for(1)] == ["user1@example.com"]


# --- one exchange, with or without PIPELINING -------------------------------------------------
# Each rule below was written twice before (smtplib's sendmail one command at a time, and the
# pipelined groups), and the two differed where these tests say. Now a server without
# PIPELINING gets the same exchange, one command per group: each rule must hold for both.


@pytest.fixture(params=[True, False], ids=["pipelined", "one-by-one"])
def pipelining(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def server(pipelining: bool) -> Iterator[SMTPTestServer]:
    """A server of the test's own, offering PIPELINING or not: each test runs against both."""
    with SMTPTestServer(pipelining=pipelining) as server:
        yield server


@pytest.fixture
def sender(server: SMTPTestServer) -> Iterator[SMTPProvider]:
    """An SMTP provider pointed at `server`, closed after the test."""
    smtp_provider = provider(server)
    yield smtp_provider
    smtp_provider.close()


class SizeLimitedServer(SMTPTestServer):
    """The test server with aiosmtpd's limit on a message's size (advertised as SIZE, RFC 1870)."""

    def __init__(self, limit: int, *, pipelining: bool) -> None:
        super().__init__(pipelining=pipelining)
        self._controller = Controller(self.handler, hostname=self.host, port=self.port, data_size_limit=limit)


def test_a_refusal_at_mail_from_is_the_provider_failing_and_a_4xx_there_is_transient(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    server.reply_to_mail_from("530 5.7.0 Authentication required")
    with pytest.raises(ProviderUnavailable, match="530 at MAIL FROM.*SMTP_USERNAME"):
        sender.send_batch([email(1), email(2)])
    server.reply_to_mail_from("451 4.3.0 try again later")
    results = sender.send_batch([email(3), email(4)])
    assert [r.outcome for r in results] == [Outcome.TRANSIENT] * 2
    assert all("451 refused at sender" in r.error for r in results)
    server.reply_to_mail_from(None)
    assert [r.outcome for r in sender.send_batch([email(5)])] == [Outcome.ACCEPTED]  # after RSET
    assert [m.rcpt_tos for m in server.wait_for(1)] == [["user5@example.com"]]


def test_content_refused_after_data_fails_that_message_unsuppressed_and_the_next_goes(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    server.reply_to_data("554 5.6.0 message content rejected")
    [refused] = sender.send_batch([email(1)])
    server.reply_to_data(None)
    [accepted] = sender.send_batch([email(2)])
    assert refused.outcome is Outcome.PERMANENT and refused.suppress is False
    assert "554 refused at data" in refused.error
    assert accepted.outcome is Outcome.ACCEPTED
    assert [m.rcpt_tos for m in server.wait_for(1)] == [["user2@example.com"]]


def test_a_message_over_the_servers_size_limit_fails_alone_and_unsuppressed(pipelining: bool) -> None:
    # smtplib's sendmail declared SIZE at MAIL FROM, so a server refused an oversize message
    # there (552), which read as the relay refusing our sender: the rest of the batch retried, or
    # with the message first, ProviderUnavailable counted by the breaker. The exchange declares no
    # SIZE (the pipelined path never did): the server refuses it after its content, as that
    # message's own fault.
    with SizeLimitedServer(4000, pipelining=pipelining) as server:
        smtp_provider = provider(server)
        large = replace(email(2), text="x" * 8000)
        results = smtp_provider.send_batch([email(1), large, email(3)])
        assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.PERMANENT, Outcome.ACCEPTED]
        assert "552" in results[1].error and results[1].suppress is False
        assert [m.rcpt_tos for m in server.wait_for(2)] == [["user1@example.com"], ["user3@example.com"]]
        smtp_provider.close()


def test_the_envelope_names_the_recipients_mailbox_without_its_display_name(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    # RFC 5321 §4.1.2: a forward-path is a mailbox. smtplib's sendmail stripped a display name
    # from `to`; the pipelined path wrote `RCPT TO:<Ann <ann@…>>`, which a server refuses (550s,
    # suppressing the address).
    [result] = sender.send_batch([email(1, "Ann Example <ann@example.com>")])
    assert result.outcome is Outcome.ACCEPTED
    [received] = server.wait_for(1)
    assert received.rcpt_tos == ["ann@example.com"]
    assert received.parsed()["To"] == "Ann Example <ann@example.com>"


def test_a_connection_lost_twice_for_one_message_makes_the_provider_unavailable(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    server.drop_next_connections(1)  # once: reopened, and the messages go
    assert [r.outcome for r in sender.send_batch([email(1), email(2)])] == [Outcome.ACCEPTED] * 2
    server.drop_next_connections(2)  # twice for the same message: nothing was sent
    with pytest.raises(ProviderUnavailable, match="SMTP (421|connection lost)"):
        sender.send_batch([email(3), email(4)])
    assert sorted(m.rcpt_tos[0] for m in server.wait_for(2)) == ["user1@example.com", "user2@example.com"]


def test_slow_down_part_way_keeps_what_was_accepted_and_sends_nothing_after(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    server.reply_for("user3@example.com", "451 4.7.0 Too many messages, slow down")
    with pytest.raises(ProviderThrottled) as caught:
        sender.send_batch([email(n) for n in range(1, 6)])
    partial = caught.value.partial
    assert sorted(partial) == [1, 2] and all(r.outcome is Outcome.ACCEPTED for r in partial.values())
    # 1 and 2 were taken before their 250s; nothing after 3 had its content written.
    assert [m.rcpt_tos for m in server.messages] == [["user1@example.com"], ["user2@example.com"]]


def test_a_message_that_cannot_be_built_fails_wherever_it_is_in_the_batch(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    # Every message is rendered before the first is sent. smtplib's path rendered each in turn,
    # so a provider-wide refusal before a message it could not build raised ProviderUnavailable
    # for the whole batch, and after it did not: the outcome depended on the order.
    unbuildable = email(2, "bad local ü@example.com")
    server.reply_to_mail_from("530 5.7.0 Authentication required")
    for batch in ([email(1), unbuildable], [unbuildable, email(1)]):
        results = {r.error.split(":")[0]: r for r in sender.send_batch(batch)}
        assert results["message cannot be built"].outcome is Outcome.PERMANENT
        assert results["smtp became unavailable"].outcome is Outcome.TRANSIENT


def test_the_guard_is_asked_before_each_message_and_again_before_its_content(
    server: SMTPTestServer, sender: SMTPProvider
) -> None:
    # Message 2 is allowed when the batch starts and when its MAIL FROM goes, not when its
    # content would: the connection is closed before its final dot (smtplib's path never asked
    # before the content), and message 3 goes over a new connection.
    guard = CountedGuard({2: 2})
    results = sender.send_batch([email(1), email(2), email(3)], guard)
    assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.ABANDONED, Outcome.ACCEPTED]
    # The batch (the base class), then each MAIL FROM and each content in the order they are
    # written; 3 again when it is moved to the new connection, and before its MAIL FROM there.
    assert guard.asked == [1, 2, 3, 1, 2, 1, 3, 2, 3, 3, 3]
    received = server.wait_for(2)
    assert sorted(m.rcpt_tos[0] for m in received) == ["user1@example.com", "user3@example.com"]
    assert len({m.peer for m in received}) == 2
