"""cc and bcc (issue 21, part 3): validated like `to`, at most EMAILHUB_MESSAGE_MAX_RECIPIENTS in
all, given to each provider its own way (SMTP envelope, SES Destination, SendGrid
personalization) and never in a Bcc header; a suppressed or refused copy is left out and the
message's events say so, a refused recipient sends nothing to the copies."""

from __future__ import annotations

from email import message_from_bytes, policy
from typing import Any

import pytest
from rest_framework.test import APIClient

from campaigns.models import Suppression
from campaigns.suppressions import suppress
from core.models import OutboxTask
from delivery.models import EmailEvent, Message
from delivery.services.sending import send_messages
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer
from tests.test_webhook_sendgrid import key, post_signed, webhook_key  # noqa: F401 - the fixtures

pytestmark = pytest.mark.django_db

TO, CC, BCC = "ann@example.com", ["bob@example.com", "cy@example.com"], ["dee@example.com"]
VALID = {"to": TO, "cc": CC, "bcc": BCC, "subject": "Minutes", "text": "Attached.", "priority": "high"}


def post(api: APIClient, body: dict[str, Any]) -> Any:
    return api.post("/api/v1/messages", body, format="json")


def test_copies_are_stored_and_returned(api: APIClient) -> None:
    response = post(api, VALID)
    assert response.status_code == 202, response.json()
    assert (response.json()["cc"], response.json()["bcc"]) == (CC, BCC)
    message = Message.objects.get(pk=response.json()["id"])
    assert (message.to_email, message.cc, message.bcc) == (TO, CC, BCC)
    alone = post(api, {**VALID, "cc": [], "bcc": []}).json()
    assert (alone["cc"], alone["bcc"]) == ([], [])
    assert Message.objects.get(pk=alone["id"]).cc is None


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"cc": "bob@example.com"}, "cc", "must be an array"),
        ({"cc": ["bob@example.com", "not-an-address"]}, "cc", "'not-an-address' is not a valid email address"),
        ({"bcc": ["x@example.com\r\nBcc: spy@example.com"]}, "bcc", "line"),
        ({"cc": ["Ann@Example.com"]}, "cc", "is already a recipient"),
        ({"cc": ["bob@example.com"], "bcc": ["BOB@example.com"]}, "bcc", "is already a recipient"),
        ({"cc": ["bob@example.com", "bob@example.com"]}, "cc", "is already a recipient"),
        ({"cc": [f"c{n}@example.com" for n in range(30)], "bcc": [f"b{n}@example.com" for n in range(20)]},
         "cc", "51 recipients; at most 50 (EMAILHUB_MESSAGE_MAX_RECIPIENTS)"),
    ],
)  # fmt: skip
def test_a_bad_copy_is_a_400_naming_the_field_and_stores_nothing(
    api: APIClient, extra: dict[str, Any], field: str, says: str
) -> None:
    response = post(api, {**VALID, **extra})
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert field in fields and says in str(fields[field]), fields
    assert Message.objects.count() == 0 and OutboxTask.objects.count() == 0


def test_the_recipient_limit_is_a_setting_named_in_the_error(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_MESSAGE_MAX_RECIPIENTS = 3
    error = post(api, VALID).json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["limit"] == {"name": "EMAILHUB_MESSAGE_MAX_RECIPIENTS", "value": 3}
    assert post(api, {**VALID, "bcc": []}).status_code == 202


def accept_and_send(api: APIClient, body: dict[str, Any] = VALID) -> Message:
    response = post(api, body)
    assert response.status_code == 202, response.json()
    send_messages([response.json()["id"]])
    return Message.objects.get(pk=response.json()["id"])


def left_out(message: Message) -> dict[str, tuple[str, str]]:
    return {e.recipient: (e.kind, e.bounce) for e in EmailEvent.objects.filter(message=message)}


@pytest.mark.parametrize("pipelining", [True, False])
def test_smtp_sends_one_transaction_to_every_recipient_with_cc_in_its_header_and_bcc_in_none(
    api: APIClient, through: Any, pipelining: bool
) -> None:
    with SMTPTestServer(pipelining=pipelining) as server:
        through("smtp", server.port)
        message = accept_and_send(api)
        assert message.status == "sent"
        [received] = server.messages
    assert received.rcpt_tos == [TO, *CC, *BCC]
    parsed = message_from_bytes(received.data, policy=policy.default)
    assert str(parsed["To"]) == TO and [a.addr_spec for a in parsed["Cc"].addresses] == CC
    assert parsed["Bcc"] is None and b"dee@example.com" not in received.data
    assert left_out(message) == {}


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_copy_the_smtp_server_refuses_is_left_out_suppressed_and_said_while_the_others_get_it(
    api: APIClient, through: Any, pipelining: bool
) -> None:
    with SMTPTestServer(pipelining=pipelining) as server:
        server.reply_for("bob@example.com", "550 5.1.1 no such user")
        server.reply_for("dee@example.com", "450 4.2.1 mailbox busy")
        through("smtp", server.port)
        message = accept_and_send(api)
        [received] = server.messages
    assert message.status == "sent"
    assert received.rcpt_tos == [TO, "cy@example.com"]
    assert left_out(message) == {
        "bob@example.com": ("bounced", "permanent"),
        "dee@example.com": ("bounced", "transient"),
    }
    # A refused copy is suppressed as a bounced recipient is; a busy one is not.
    assert list(Suppression.objects.values_list("email", "reason")) == [("bob@example.com", "bounced")]


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_refused_recipient_fails_the_message_and_sends_nothing_to_its_copies(
    api: APIClient, through: Any, pipelining: bool
) -> None:
    with SMTPTestServer(pipelining=pipelining) as server:
        server.reply_for(TO, "550 5.1.1 no such user")
        through("smtp", server.port)
        message = accept_and_send(api)
        follow = accept_and_send(api, {**VALID, "to": "eve@example.com", "cc": [], "bcc": []})
        messages = server.messages
    assert message.status == "failed" and "550" in message.last_error
    # The copies' server took their RCPTs, but no content reached them; the next message went on.
    assert [m.rcpt_tos for m in messages] == [["eve@example.com"]]
    assert follow.status == "sent"
    assert list(Suppression.objects.values_list("email", flat=True)) == [TO]


def test_a_copy_on_the_suppression_list_is_left_out_and_said(
    api: APIClient, through: Any, smtp: SMTPTestServer
) -> None:
    through("smtp")
    suppress([("cy@example.com", "test")], "complained")
    message = accept_and_send(api)
    [received] = smtp.messages
    assert message.status == "sent" and received.rcpt_tos == [TO, "bob@example.com", "dee@example.com"]
    assert b"cy@example.com" not in received.data
    assert left_out(message) == {"cy@example.com": ("dropped", "")}
    # The recipient suppressed: the whole message is, copies and all.
    suppress([(TO, "test")], "bounced")
    again = accept_and_send(api)
    assert again.status == "suppressed" and len(smtp.messages) == 1


def test_ses_gets_the_copies_in_its_destination_and_no_bcc_header(
    api: APIClient, through: Any, ses_server: SESTestServer
) -> None:
    through("ses")
    assert accept_and_send(api).status == "sent"
    [(recipients, parsed)] = ses_server.sent()
    assert recipients == sorted([TO, *CC, *BCC])
    assert [a.addr_spec for a in parsed["Cc"].addresses] == CC and parsed["Bcc"] is None


def test_sendgrid_gets_the_copies_in_the_personalization(
    api: APIClient, through: Any, sendgrid_server: SendGridTestServer
) -> None:
    through("sendgrid")
    assert accept_and_send(api).status == "sent"
    [request] = sendgrid_server.requests
    [personalization] = request["personalizations"]
    assert personalization["to"] == [{"email": TO}]
    assert personalization["cc"] == [{"email": a} for a in CC]
    assert personalization["bcc"] == [{"email": a} for a in BCC]
    assert "bcc" not in {name.lower() for name in personalization["headers"]}


def test_a_bounce_reported_by_webhook_for_a_copy_suppresses_it_and_is_recorded_on_the_message(
    api: APIClient,
    through: Any,
    sendgrid_server: SendGridTestServer,
    webhook_key: Any,  # noqa: F811
) -> None:
    through("sendgrid")
    message = accept_and_send(api)
    event = {
        "email": "bob@example.com",
        "timestamp": 1_780_000_000,
        "event": "bounce",
        "type": "bounce",
        "sg_event_id": "bounce-of-a-copy",
        "sg_message_id": "sg-1.filter",
        "emailhub_id": str(message.pk),
        "reason": "550 5.1.1 no such user",
    }
    assert post_signed(webhook_key, [event]).status_code == 200
    [recorded] = EmailEvent.objects.filter(message=message)
    assert (recorded.recipient, recorded.kind, recorded.bounce) == ("bob@example.com", "bounced", "permanent")
    assert list(Suppression.objects.values_list("email", flat=True)) == ["bob@example.com"]
    message.refresh_from_db()
    assert message.status == "sent"  # the message itself reached its recipient


def test_a_batch_item_carries_its_copies_and_headers_like_a_single_message(api: APIClient) -> None:
    items = [
        {**VALID, "to": f"u{n}@example.com", "headers": {"X-Entity-Ref-ID": f"ref-{n}"}, "tags": [f"n{n}"]}
        for n in range(3)
    ]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code == 202, response.json()
    rows = Message.objects.order_by("id")
    assert [(m.to_email, m.cc, m.bcc, m.headers, m.tags) for m in rows] == [
        (f"u{n}@example.com", CC, BCC, {"X-Entity-Ref-ID": f"ref-{n}"}, [f"n{n}"]) for n in range(3)
    ]
