"""Webhook bodies that are odd but not forged, and forged ones that are odd: always a 4xx (or a
200 that records what it can), never a 500, and a refused request writes nothing. Real crypto
(the SNS signer and a P-256 key made in the tests), the real view and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from campaigns.models import Suppression
from delivery import dsn
from delivery.models import EmailEvent
from delivery.testing.sns import SNSSigner, ses_bounce, ses_event
from delivery.webhooks import forget_webhooks
from tests.test_dsn_ingest import make_dsn, send_for_real
from tests.test_webhook_sendgrid import post as post_sendgrid
from tests.test_webhook_sendgrid import public_key_setting, sign

# The SES tests' fixtures: a signer with its certificate server, moto's SNS, the settings.
from tests.test_webhook_ses import moto_sns, nothing_written, post, sent_message, signer, webhook  # noqa: F401, E402

DEEP = 5000  # past the JSON decoder's recursion limit (about 1,000)


def signed_message(sns: SNSSigner, message: str) -> Any:  # noqa: ANN401
    return post(sns.notification(message))


def test_an_unsigned_body_nested_past_the_decoder_limit_is_400(webhook: SNSSigner) -> None:  # noqa: F811
    # Before the signature can be checked, SNS's body must be decoded: this was a RecursionError 500.
    response = post(b"[" * DEEP + b"]" * DEEP)
    assert response.status_code == 400, response.content
    assert nothing_written()


def test_a_signed_message_nested_past_the_decoder_limit_is_400_and_writes_nothing(
    webhook: SNSSigner,  # noqa: F811
) -> None:
    # No event can be read out of it at all: the notification, not one recipient, is unusable.
    sent_message("gone@example.com", "ses-1")
    response = signed_message(webhook, "[" * DEEP + "]" * DEEP)
    assert response.status_code == 400, response.content
    assert nothing_written()


@pytest.mark.parametrize("case", ["NaN in Message", "NUL in Message", "Message nested 100 deep"])
def test_a_signed_event_that_cannot_be_stored_is_skipped_and_writes_nothing(
    webhook: SNSSigner,  # noqa: F811
    case: str,
) -> None:
    # Readable, but no recipient's part of it can be stored (jsonb refuses NaN and U+0000; deep
    # nesting would exhaust json.dumps's stack): skipped and counted, not retried by SNS.
    sent_message("gone@example.com", "ses-1")
    event = ses_bounce(["gone@example.com"], ses_message_id="ses-1")
    if case == "NaN in Message":
        message = json.dumps(event).replace('"bounceType"', '"spam": NaN, "bounceType"', 1)
    elif case == "NUL in Message":
        event["bounce"]["feedbackId"] = "a\x00b"
        message = json.dumps(event)
    else:
        nested: Any = "x"
        for _ in range(100):
            nested = [nested]
        event["bounce"]["extra"] = nested
        message = json.dumps(event)
    response = signed_message(webhook, message)
    assert response.status_code == 200, response.content
    assert (response.json()["received"], response.json()["skipped"]) == (0, 1)
    assert nothing_written()


def test_odd_fields_in_a_signed_ses_event_are_read_around_not_a_500(webhook: SNSSigner) -> None:  # noqa: F811
    message = sent_message("gone@example.com", "ses-1")
    # A timestamp that overflows when moved to UTC; our header with a digit that is not 0-9.
    bounce = ses_bounce(["gone@example.com"], ses_message_id="ses-1")
    bounce["bounce"]["timestamp"] = "9999-12-31T23:59:59-01:00"
    bounce["mail"]["timestamp"] = "0001-01-01T00:00:00+01:00"
    bounce["mail"]["headers"] = [{"name": "X-Emailhub-Message", "value": "\u00b2"}]
    response = signed_message(webhook, json.dumps(bounce))
    assert response.status_code == 200, response.content
    recorded = EmailEvent.objects.get()
    assert recorded.message_id == message.id  # found by SES's message id instead
    assert recorded.occurred_at.year not in (1, 9999)  # the notification's own time
    # A destination that is not a list: nothing to record for it, and no 500.
    reject = ses_event("Reject", "reject", {"reason": "Bad content"}, [], ses_message_id="ses-1")
    reject["mail"]["destination"] = 5
    reject["mail"]["headers"] = 7
    response = signed_message(webhook, json.dumps(reject))
    assert response.status_code == 200, response.content
    assert response.json()["received"] == 0
    assert EmailEvent.objects.count() == 1


@pytest.fixture
def sendgrid_key(settings: Any) -> Iterator[ec.EllipticCurvePrivateKey]:  # noqa: ANN401
    key = ec.generate_private_key(ec.SECP256R1())
    settings.EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY = public_key_setting(key)
    settings.EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS = 300
    forget_webhooks()
    yield key
    forget_webhooks()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "stamp", ["\u00b2", "1\u00b2", "\u0661\u0662"]
)  # superscript two, Arabic-Indic digits
def test_a_sendgrid_timestamp_of_non_ascii_digits_is_400(
    sendgrid_key: ec.EllipticCurvePrivateKey, stamp: str
) -> None:
    body = json.dumps([{"event": "bounce", "email": "gone@example.com", "sg_event_id": "e1"}]).encode()
    # Not signed: the timestamp is read before the signature, so anyone can send it. Was a 500.
    response = post_sendgrid(body, signature="AAAA", timestamp=stamp)
    assert response.status_code == 400, response.content
    assert not EmailEvent.objects.exists() and not Suppression.objects.exists()


@pytest.mark.django_db
def test_a_signed_sendgrid_event_nested_too_deep_is_skipped_and_an_odd_custom_arg_matches_nothing(
    sendgrid_key: ec.EllipticCurvePrivateKey,
) -> None:
    def post_events(events: list[dict[str, Any]]) -> Any:  # noqa: ANN401
        body = json.dumps(events).encode()
        stamp = str(int(time.time()))
        return post_sendgrid(body, signature=sign(sendgrid_key, body, stamp), timestamp=stamp)

    nested: Any = "x"
    for _ in range(200):  # decodable, but deeper than json.dumps in record_events may go (MAX_JSON_DEPTH)
        nested = [nested]
    deep = {"event": "bounce", "email": "gone@example.com", "sg_event_id": "deep", "extra": nested}
    response = post_events([deep])
    assert response.status_code == 200, response.content  # skipped: SendGrid would retry it for nothing
    assert (response.json()["received"], response.json()["skipped"]) == (0, 1)
    assert not EmailEvent.objects.exists() and not Suppression.objects.exists()

    odd = {"event": "delivered", "email": "a@example.com", "sg_event_id": "odd", "emailhub_id": "\u00b2"}
    response = post_events([odd])
    assert response.status_code == 200, response.content
    assert EmailEvent.objects.get().message_id is None


def test_a_dsn_whose_emailhub_header_has_a_non_ascii_digit_is_read_without_it(
    smtp: Any,  # noqa: ANN401
    db: None,
) -> None:
    # Anyone can mail the bounce mailbox; int("²") raised and stopped ingest_bounces at that DSN.
    ((message, original),) = send_for_real(smtp, 1)
    header = f"X-Emailhub-Message: {message.pk}".encode()
    assert header in original
    raw = make_dsn(
        original.replace(header, "X-Emailhub-Message: \u00b2".encode()),
        recipient=message.to_email,
        action="failed",
        status="5.1.1",
        diagnostic="550 5.1.1 user unknown",
        dsn_id="odd@mx.example.net",
    )
    (report,) = dsn.parse(raw)
    assert report.message_id is None
    assert report.original_message_id == message.provider_message_id  # still matched by Message-ID
