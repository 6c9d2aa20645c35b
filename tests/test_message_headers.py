"""An application's own headers (issue 21, part 5): refused when emailhub owns them or they change
routing or authentication, otherwise sent unchanged through SMTP, SES and SendGrid (the real
clients against the local servers), from the API through the whole send path."""

from __future__ import annotations

from email import message_from_bytes, policy
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import OutboxTask
from delivery.models import Message
from delivery.services.sending import send_messages
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer

pytestmark = pytest.mark.django_db

VALID = {"to": "ann@example.com", "subject": "Re: your order", "text": "Shipped.", "priority": "high"}
THREAD = {
    "In-Reply-To": "<order-1234@shop.example.com>",
    "References": "<order-1234@shop.example.com> <reply-1@shop.example.com>",
    "X-Entity-Ref-ID": "order-1234",
    "X-Note": "Grüße aus Köln — non-ASCII, sent as RFC 2047 encoded-words",
}


def post(api: APIClient, body: dict[str, Any]) -> Any:
    return api.post("/api/v1/messages", body, format="json")


@pytest.mark.parametrize(
    "headers",
    [
        {"From": "evil@example.com"},
        {"subject": "lower case is the same header"},
        {"Bcc": "spy@example.com"},
        {"Content-Type": "text/html"},
        {"Content-Transfer-Encoding": "8bit"},
        {"MIME-Version": "2.0"},
        {"Message-ID": "<mine@example.com>"},
        {"DKIM-Signature": "v=1"},
        {"Received": "from somewhere"},
        {"Return-Path": "<bounce@example.com>"},
        {"List-Unsubscribe": "<https://example.com/u>"},
        {"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
        {"X-SMTPAPI": '{"to": ["x@example.com"]}'},
        {"X-SES-CONFIGURATION-SET": "other"},
        {"Resent-To": "x@example.com"},
        {"X-Emailhub-Message": "1"},
        {"Bad Name": "space in the name"},
        {"Colon:Name": "x"},
        {"Ünïcode": "x"},
        {"": "empty name"},
        {"X-Line": "one\r\nBcc: spy@example.com"},
        {"X-Line": "one\nline"},
        {"X-Long": "x" * 999},
        {"X-Same": "a", "x-same": "b"},
        {"X-Number": 5},
        {f"X-H{n}": "v" for n in range(51)},
    ],
)
def test_a_header_emailhub_owns_or_a_malformed_one_is_a_400_naming_headers_and_stores_nothing(
    api: APIClient, headers: dict[str, Any]
) -> None:
    response = post(api, {**VALID, "headers": headers})
    assert response.status_code == 400, response.json()
    assert list(response.json()["error"]["fields"]) == ["headers"], response.json()
    assert Message.objects.count() == 0 and OutboxTask.objects.count() == 0


def test_headers_must_be_an_object_of_strings(api: APIClient) -> None:
    response = post(api, {**VALID, "headers": ["In-Reply-To", "<a@b>"]})
    assert response.status_code == 400 and "must be an object" in str(response.json()["error"]["fields"])


def test_a_batch_item_with_a_reserved_header_is_refused_by_its_index(api: APIClient) -> None:
    items = [{**VALID, "headers": THREAD}, {**VALID, "headers": {"To": "x@example.com"}}]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code == 400
    assert "headers" in str(response.json()["error"]["fields"]["messages"]["1"])
    assert Message.objects.count() == 0


def accept_and_send(api: APIClient) -> Message:
    response = post(api, {**VALID, "headers": THREAD, "tags": ["order-1234"]})
    assert response.status_code == 202, response.json()
    assert send_messages([response.json()["id"]]).sent == 1
    return Message.objects.get(pk=response.json()["id"])


def test_headers_reach_the_smtp_server_unchanged(api: APIClient, through: Any, smtp: SMTPTestServer) -> None:
    through("smtp")
    message = accept_and_send(api)
    assert message.headers == THREAD
    [received] = smtp.messages
    parsed = message_from_bytes(received.data, policy=policy.default)
    assert {name: str(parsed[name]) for name in THREAD} == THREAD
    assert len(parsed.get_all("From")) == 1 and len(parsed.get_all("To")) == 1


def test_headers_reach_ses_unchanged_in_the_raw_mime(
    api: APIClient, through: Any, ses_server: SESTestServer
) -> None:
    through("ses")
    accept_and_send(api)
    [(_, parsed)] = ses_server.sent()
    assert {name: str(parsed[name]) for name in THREAD} == THREAD


def test_headers_reach_sendgrid_in_the_personalization(
    api: APIClient, through: Any, sendgrid_server: SendGridTestServer
) -> None:
    through("sendgrid")
    accept_and_send(api)
    [delivered] = sendgrid_server.delivered
    assert {name: delivered.headers[name] for name in THREAD} == THREAD
