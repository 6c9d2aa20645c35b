"""RFC 8058 one-click unsubscribe: the headers on real SMTP-received mail, the /u/<token> page,
tokens, the footer, and which mail an unsubscribe stops."""

from __future__ import annotations

import os
import re
import time

import pytest
from django.core import checks
from django.test import Client

from campaigns.checks import public_url_https, public_url_wellformed
from campaigns.exceptions import ExpiredToken, InvalidToken
from campaigns.models import Campaign, Suppression, Template
from campaigns.unsubscribe import make_token, read_token
from delivery.models import EmailEvent, Message, MessageStatus
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests import factories
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "https://mail.example.com"
LINK = re.compile(r"https://mail\.example\.com/u/([A-Za-z0-9_-]{38})")


@pytest.fixture(autouse=True)
def public_url(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PUBLIC_URL = PUBLIC
    settings.EMAILHUB_UNSUBSCRIBE_MAILTO = ""


def running_campaign(size: int = 1, template: Template | None = None) -> tuple[Campaign, list[Message]]:
    """A `sending` campaign with one queued message per contact (what fan-out makes)."""
    campaign = make_campaign(make_audience(size))
    if template is not None:
        campaign.template = template
        campaign.save(update_fields=["template"])
    Campaign.objects.filter(pk=campaign.pk).update(status="sending", fanout_done=True, total_count=size)
    return campaign, factories.campaign_messages(
        campaign, template=campaign.template, status=MessageStatus.QUEUED
    )


def sent_link(message: Message, smtp: SMTPTestServer) -> str:
    """Send one campaign message over real SMTP; the one-click URL its List-Unsubscribe names."""
    assert send_messages([message.pk]).sent == 1
    parsed = smtp.wait_for(1)[0].parsed()
    match = re.fullmatch(r"<(https://[^>]+)>", parsed["List-Unsubscribe"])
    assert match, parsed["List-Unsubscribe"]
    return match.group(1)


def path_of(url: str) -> str:
    return url.removeprefix(PUBLIC)


def counts(campaign: Campaign) -> tuple[int, int, int]:
    campaign.refresh_from_db()
    return EmailEvent.objects.count(), Suppression.objects.count(), campaign.unsubscribed_count


def browser() -> Client:
    # As a mail client posts: no cookie, no session, and Django's CSRF check enforced.
    return Client(enforce_csrf_checks=True)


# --- headers and body on real mail ------------------------------------------------------------


def test_campaign_message_over_smtp_carries_one_click_headers_and_one_footer(
    smtp: SMTPTestServer,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_UNSUBSCRIBE_MAILTO = "unsubscribe@mail.example.com"
    _, (message,) = running_campaign()
    send_messages([message.pk])
    received = smtp.wait_for(1)[0]
    parsed = received.parsed()
    assert parsed.defects == [] and all(not part.defects for part in parsed.walk())
    uris = [uri.strip() for uri in parsed["List-Unsubscribe"].split(",")]
    assert len(uris) == 2
    https = re.fullmatch(r"<https://mail\.example\.com/u/([A-Za-z0-9_-]{38})>", uris[0])
    assert https, uris
    token = https.group(1)
    assert read_token(token) == message.pk
    assert uris[1] == f"<mailto:unsubscribe@mail.example.com?subject=unsubscribe%20{token}>"
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # The raw header is folded between URIs, never RFC 2047-encoded (clients could not read it).
    assert b"=?utf-8?" not in received.data.split(b"\r\n\r\n", 1)[0]
    html = parsed.get_body(("html",)).get_content()
    text = parsed.get_body(("plain",)).get_content()
    # The template has no {{ unsubscribe_url }}: one footer in each part, with the header's link.
    assert LINK.findall(html) == [token] and LINK.findall(text) == [token]
    assert "Unsubscribe</a>" in html and "Unsubscribe: https://" in text


def test_template_with_unsubscribe_url_gets_its_link_and_no_footer(smtp: SMTPTestServer) -> None:
    template = Template.objects.create(
        name="own-link",
        subject="News",
        html='<html><body><p>News</p><a href="{{ unsubscribe_url }}">Leave this list</a></body></html>',
        text="News. Leave: {{ unsubscribe_url }}",
    )
    _, (message,) = running_campaign(template=template)
    url = sent_link(message, smtp)
    parsed = smtp.messages[0].parsed()
    html = parsed.get_body(("html",)).get_content()
    text = parsed.get_body(("plain",)).get_content()
    assert html.count("/u/") == 1 and f'href="{url}">Leave this list' in html
    assert text.strip() == f"News. Leave: {url}"


def test_footer_goes_before_the_closing_body_tag(smtp: SMTPTestServer) -> None:
    template = Template.objects.create(
        name="full-page", subject="News", html="<html><body><p>News</p></body></html>", text=""
    )
    _, (message,) = running_campaign(template=template)
    send_messages([message.pk])
    html = smtp.wait_for(1)[0].parsed().get_body(("html",)).get_content()
    assert re.search(r"<p>News</p><p [^>]*>.*Unsubscribe</a></p></body></html>", html)


def test_plain_transactional_mail_has_no_unsubscribe_header(smtp: SMTPTestServer) -> None:
    message = Message.objects.create(
        to_email="ann@example.com", subject="Reset", text="code 1", priority="critical"
    )
    send_messages([message.pk])
    assert smtp.wait_for(1)[0].parsed()["List-Unsubscribe"] is None


def test_api_flag_gives_a_transactional_message_the_headers(api, smtp: SMTPTestServer) -> None:  # noqa: ANN001
    response = api.post(
        "/api/v1/messages",
        {
            "to": "ann@example.com",
            "subject": "Digest",
            "text": "news",
            "unsubscribe": True,
            "context": {"a": 1},
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    message = Message.objects.get(pk=response.json()["id"])
    assert message.list_unsubscribe and message.context == {"a": 1}  # the flag is no context key
    send_messages([message.pk])
    parsed = smtp.wait_for(1)[0].parsed()
    token = re.fullmatch(r"<https://mail\.example\.com/u/(.+)>", parsed["List-Unsubscribe"]).group(1)
    assert read_token(token) == message.pk
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_api_refuses_the_reserved_context_key(api) -> None:  # noqa: ANN001
    response = api.post(
        "/api/v1/messages",
        {"to": "ann@example.com", "subject": "x", "text": "y", "context": {"emailhub:unsubscribe": True}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["context"] == [
        "'emailhub:unsubscribe' is reserved; use the unsubscribe field"
    ]
    assert Message.objects.count() == 0


# --- the /u/<token> page ---------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["urlencoded", "multipart"])
def test_one_click_post_suppresses_and_counts_before_answering(smtp: SMTPTestServer, encoding: str) -> None:
    campaign, (message,) = running_campaign()
    url = sent_link(message, smtp)
    client = browser()
    if encoding == "urlencoded":
        response = client.post(
            path_of(url), "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
        )
    else:
        response = client.post(path_of(url), {"List-Unsubscribe": "One-Click"})  # multipart/form-data
    assert response.status_code == 200 and "Location" not in response
    assert "Set-Cookie" not in response and not response.cookies
    suppression = Suppression.objects.get()
    assert (suppression.email, suppression.reason) == (message.to_email, "unsubscribed")
    event = EmailEvent.objects.get()
    assert (event.message_id, event.kind, event.provider) == (message.pk, "unsubscribed", "emailhub")
    assert event.detail == "one-click (RFC 8058)"
    assert counts(campaign) == (1, 1, 1)


def test_repeated_post_is_idempotent(smtp: SMTPTestServer) -> None:
    campaign, (message,) = running_campaign()
    url = sent_link(message, smtp)
    for _ in range(3):
        response = browser().post(path_of(url), {"List-Unsubscribe": "One-Click"})
        assert response.status_code == 200
    # A second link of the same message (a retried send issues a new token) is the same unsubscribe.
    other = make_token(message.pk, int(time.time()) - 60)
    assert browser().post(f"/u/{other}").status_code == 200
    assert counts(campaign) == (1, 1, 1)


def test_get_and_head_show_the_page_and_write_nothing(smtp: SMTPTestServer) -> None:
    campaign, (message,) = running_campaign()
    url = sent_link(message, smtp)
    response = browser().get(path_of(url))
    assert response.status_code == 200
    body = response.content.decode()
    assert '<form method="post">' in body and "<button" in body
    assert message.to_email not in body  # masked: a forwarded link does not reveal the address
    assert browser().head(path_of(url)).status_code == 200
    assert counts(campaign) == (0, 0, 0)


def test_forged_malformed_and_orphan_tokens_are_400_and_write_nothing(smtp: SMTPTestServer) -> None:
    campaign, (message,) = running_campaign()
    token = sent_link(message, smtp).rsplit("/", 1)[1]
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    orphan = make_token(message.pk + 10_000)
    future = make_token(message.pk, int(time.time()) + 3600)
    for bad in (flipped, token[:-1], token + "A", "x" * 38, orphan, future):
        for method in ("get", "post"):
            response = getattr(browser(), method)(f"/u/{bad}")
            assert response.status_code == 400, (bad, method)
            assert "Location" not in response
    with pytest.raises(InvalidToken):
        read_token(flipped)
    assert counts(campaign) == (0, 0, 0)


def test_expired_token_is_410_and_writes_nothing(smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001
    campaign, (message,) = running_campaign()
    days = settings.EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS
    expired = make_token(message.pk, int(time.time()) - days * 86400 - 10)
    still_valid = make_token(message.pk, int(time.time()) - days * 86400 + 60)
    assert browser().get(f"/u/{expired}").status_code == 410
    assert browser().post(f"/u/{expired}").status_code == 410
    with pytest.raises(ExpiredToken):
        read_token(expired)
    assert counts(campaign) == (0, 0, 0)
    assert read_token(still_valid) == message.pk


def test_tokens_of_consecutive_messages_share_nothing() -> None:
    first, second = make_token(1000, 1_700_000_000), make_token(1001, 1_700_000_000)
    assert len(first) == len(second) == 38
    # Nothing sequential: the tag is first, and the id is sealed under a keystream from the tag.
    assert len(os.path.commonprefix([first, second])) < 4
    assert "1000" not in first and read_token(first, now=1_700_000_000) == 1000


def test_other_methods_are_refused() -> None:
    token = make_token(1)
    assert browser().put(f"/u/{token}").status_code == 405
    assert browser().delete(f"/u/{token}").status_code == 405


# --- what an unsubscribe stops -----------------------------------------------------------------


def test_unsubscribe_stops_campaign_mail_but_not_transactional_mail(smtp: SMTPTestServer) -> None:
    campaign, (first,) = running_campaign()
    url = sent_link(first, smtp)
    assert browser().post(path_of(url), {"List-Unsubscribe": "One-Click"}).status_code == 200
    smtp.clear()
    address = first.to_email
    # A later campaign to the same address: its queued message is suppressed, not sent.
    later = make_campaign(campaign.contact_list, name="later")
    Campaign.objects.filter(pk=later.pk).update(status="sending", fanout_done=True, total_count=1)
    queued = Message.objects.create(
        campaign=later, contact=first.contact, template=later.template, to_email=address, status="queued"
    )
    # A password reset still goes.
    reset = Message.objects.create(to_email=address, subject="Reset", text="code", priority="critical")
    # A transactional newsletter that asked for an unsubscribe link is marketing: stopped.
    digest = Message.objects.create(
        to_email=address, subject="Digest", text="news", priority="high", list_unsubscribe=True
    )
    send_messages([queued.pk])
    send_messages([reset.pk])
    send_messages([digest.pk])
    statuses = dict(
        Message.objects.filter(pk__in=[queued.pk, reset.pk, digest.pk]).values_list("pk", "status")
    )
    assert statuses == {queued.pk: "suppressed", reset.pk: "sent", digest.pk: "suppressed"}
    assert [m.rcpt_tos for m in smtp.wait_for(1)] == [[address]]
    assert smtp.wait_for(1)[0].parsed()["Subject"] == "Reset"


# --- configuration -----------------------------------------------------------------------------


def test_public_url_checks(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PUBLIC_URL = "mail.example.com"
    assert [m.id for m in public_url_wellformed()] == ["campaigns.E001"]
    settings.EMAILHUB_PUBLIC_URL = "https://mail.example.com/?x=1"
    assert [m.id for m in public_url_wellformed()] == ["campaigns.E001"]
    settings.EMAILHUB_PUBLIC_URL = "http://localhost:8000"
    assert public_url_wellformed() == []
    errors = public_url_https()
    assert [m.id for m in errors] == ["campaigns.E002"] and all(isinstance(m, checks.Error) for m in errors)
    settings.EMAILHUB_PUBLIC_URL = "http://mail.example.com"
    assert [m.id for m in public_url_https()] == ["campaigns.E002"]
    settings.EMAILHUB_PUBLIC_URL = "https://mail.example.com"
    assert public_url_https() == []
