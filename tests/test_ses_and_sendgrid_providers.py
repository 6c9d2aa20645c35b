"""SES (boto3 sesv2 → moto server) and SendGrid (the sendgrid client → a local v3 server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delivery.exceptions import ProviderConfigurationError, ProviderUnavailable
from delivery.providers.base import Outcome, OutgoingEmail
from delivery.providers.sendgrid import SendGridProvider
from delivery.providers.ses import SESProvider
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import free_port
from tests.conftest import CountedGuard


def email(
    n: int, to: str | None = None, *, text: str | None = None, html: str | None = None
) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=n,
        to=to or f"user{n}@example.com",
        from_email="Shop <shop@example.com>",
        subject=f"Receipt {n}",
        text=text if text is not None else f"text {n}",
        html=html if html is not None else f"<p>html {n}</p>",
    )


@pytest.fixture
def ses(ses_server: SESTestServer) -> Iterator[SESTestServer]:
    ses_server.reset()
    yield ses_server
    ses_server.reset()


def ses_provider(server: SESTestServer) -> SESProvider:
    return SESProvider(
        region="us-east-1",
        endpoint_url=server.endpoint_url,
        access_key_id="test",
        secret_access_key="test",
        timeout=5,
    )


@pytest.fixture
def sendgrid_server() -> Iterator[SendGridTestServer]:
    with SendGridTestServer() as server:
        yield server


def sendgrid_provider(server: SendGridTestServer) -> SendGridProvider:
    return SendGridProvider(api_key=server.api_key, host=server.url, timeout=5)


def test_ses_delivers_the_same_well_formed_mime_as_smtp(ses: SESTestServer) -> None:
    results = ses_provider(ses).send_batch([email(1), email(2)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 2
    assert all(r.provider_message_id for r in results)
    sent = ses.sent()
    assert [to for to, _ in sent] == [["user1@example.com"], ["user2@example.com"]]
    parsed = sent[0][1]
    assert parsed.defects == [] and parsed.get_content_type() == "multipart/alternative"
    assert parsed["Subject"] == "Receipt 1" and len(parsed.get_all("Message-ID")) == 1


def test_ses_message_rejected_for_a_recipient_is_permanent(ses: SESTestServer) -> None:
    ses.reject("bad@example.com")
    results = ses_provider(ses).send_batch([email(1, "bad@example.com"), email(2)])
    assert [r.outcome for r in results] == [Outcome.PERMANENT, Outcome.ACCEPTED]
    assert "MessageRejected" in results[0].error


def test_ses_refusing_our_sender_is_a_provider_fault_not_a_bad_recipient(ses: SESTestServer) -> None:
    unverified = OutgoingEmail(
        message_id=1, to="a@example.com", from_email="x@unverified.test", subject="s", text="t", html=""
    )
    with pytest.raises(ProviderUnavailable, match="verify this sender"):
        ses_provider(ses).send_batch([unverified])


# Throttling (429) is not "unavailable": see tests/test_provider_throttling.py.
@pytest.mark.parametrize("status", [500, 503])
def test_ses_server_errors_make_it_unavailable(ses: SESTestServer, status: int) -> None:
    ses.fail_with(status)
    with pytest.raises(ProviderUnavailable, match=f"SES {status}"):
        ses_provider(ses).send_batch([email(1)])
    assert ses.refused_count == 1  # one attempt: boto3's own retries are off


def test_ses_unreachable_endpoint_is_unavailable() -> None:
    provider = SESProvider(
        region="us-east-1",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        access_key_id="t",
        secret_access_key="t",
        timeout=1,
    )
    with pytest.raises(ProviderUnavailable, match="unreachable"):
        provider.send_batch([email(1)])


def test_sendgrid_sends_a_batch_of_identical_content_in_one_request(
    sendgrid_server: SendGridTestServer,
) -> None:
    batch = [email(n, text="same", html="<p>same</p>") for n in range(1500)]
    results = sendgrid_provider(sendgrid_server).send_batch(batch)
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 1500
    assert [len(r["personalizations"]) for r in sendgrid_server.requests] == [1000, 500]
    delivered = sendgrid_server.delivered
    assert sorted(d.to for d in delivered) == sorted(e.to for e in batch)
    assert delivered[0].custom_args == {"emailhub_id": "0"} and delivered[0].text == "same"


def test_sendgrid_personalised_content_still_goes_in_one_request(sendgrid_server: SendGridTestServer) -> None:
    batch = [email(n) for n in range(50)]
    sendgrid_provider(sendgrid_server).send_batch(batch)
    assert len(sendgrid_server.requests) == 1
    by_to = {d.to: d for d in sendgrid_server.delivered}
    assert by_to["user7@example.com"].text == "text 7" and by_to["user7@example.com"].html == "<p>html 7</p>"
    assert by_to["user7@example.com"].subject == "Receipt 7"


def test_sendgrid_body_too_large_for_substitutions_gets_its_own_request(
    sendgrid_server: SendGridTestServer,
) -> None:
    big = "x" * 20_000
    batch = [email(1), email(2, text=big), email(3)]
    results = sendgrid_provider(sendgrid_server).send_batch(batch)
    assert all(r.outcome is Outcome.ACCEPTED for r in results)
    assert sorted(len(r["personalizations"]) for r in sendgrid_server.requests) == [1, 2]
    assert {d.to: d.text for d in sendgrid_server.delivered}["user2@example.com"] == big


def test_sendgrid_400_on_one_address_fails_it_and_sends_the_rest(sendgrid_server: SendGridTestServer) -> None:
    sendgrid_server.reject("bad@example.com")
    results = sendgrid_provider(sendgrid_server).send_batch([email(1), email(2, "bad@example.com"), email(3)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.PERMANENT, Outcome.ACCEPTED]
    assert "valid address" in results[1].error
    assert sorted(d.to for d in sendgrid_server.delivered) == ["user1@example.com", "user3@example.com"]


@pytest.mark.parametrize("status", [500, 503])
def test_sendgrid_server_errors_make_it_unavailable(sendgrid_server: SendGridTestServer, status: int) -> None:
    sendgrid_server.fail_with(status)
    with pytest.raises(ProviderUnavailable, match=f"SendGrid {status}"):
        sendgrid_provider(sendgrid_server).send_batch([email(1)])


def test_sendgrid_wrong_key_names_the_setting(sendgrid_server: SendGridTestServer) -> None:
    provider = SendGridProvider(api_key="SG.wrong", host=sendgrid_server.url)
    with pytest.raises(ProviderUnavailable, match="SENDGRID_API_KEY"):
        provider.send_batch([email(1)])


def test_sendgrid_without_a_key_is_a_configuration_error() -> None:
    with pytest.raises(ProviderConfigurationError, match="SENDGRID_API_KEY"):
        SendGridProvider(api_key="", host="http://127.0.0.1:1")


def test_ses_sends_no_email_whose_claim_was_lost(ses: SESTestServer) -> None:
    results = ses_provider(ses).send_batch([email(1), email(2), email(3)], CountedGuard({2: 0}))
    assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.ABANDONED, Outcome.ACCEPTED]
    assert sorted(to for tos, _ in ses.sent() for to in tos) == ["user1@example.com", "user3@example.com"]


def test_sendgrid_requests_carry_only_the_emails_still_held(sendgrid_server: SendGridTestServer) -> None:
    sendgrid_server.reject("bad@example.com")
    # 3 is lost before the first request; 4 after it, before the request resent without "bad".
    guard = CountedGuard({3: 0, 4: 1})
    batch = [email(1), email(2, "bad@example.com"), email(3), email(4), email(5)]
    results = sendgrid_provider(sendgrid_server).send_batch(batch, guard)
    assert [r.outcome for r in results] == [
        Outcome.ACCEPTED, Outcome.PERMANENT, Outcome.ABANDONED, Outcome.ABANDONED, Outcome.ACCEPTED,
    ]  # fmt: skip
    # The refused request (1, bad, 4, 5) is not kept by the server; the one it took:
    assert [len(r["personalizations"]) for r in sendgrid_server.requests] == [2]
    assert sorted(d.to for d in sendgrid_server.delivered) == ["user1@example.com", "user5@example.com"]
