"""SendGrid's signed Event Webhook: real ECDSA P-256 (a key made here), the real view and
PostgreSQL. Every refused request is checked to have written nothing."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from campaigns.models import Campaign, Suppression
from delivery.models import EmailEvent, Message
from delivery.webhooks import ForgedWebhook, WebhookRequest, forget_webhooks
from delivery.webhooks.sendgrid import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SendGridWebhook,
    load_public_key,
    verify_signature,
)
from tests import factories
from tests.factories import make_audience, make_campaign
from tests.test_webhook_ses import delta, skipped

URL = "/api/v1/webhooks/sendgrid"
NOW = 1_780_000_000  # a fixed clock for the tolerance tests


def public_key_setting(key: ec.EllipticCurvePrivateKey) -> str:
    """The verification key as SendGrid's Mail Settings show it: base64 DER SubjectPublicKeyInfo."""
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(der).decode("ascii")


def sign(key: ec.EllipticCurvePrivateKey, body: bytes, timestamp: str) -> str:
    return base64.b64encode(key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))).decode("ascii")


@pytest.fixture
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def webhook_key(key: ec.EllipticCurvePrivateKey, settings: Any) -> Iterator[ec.EllipticCurvePrivateKey]:  # noqa: ANN401
    settings.EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY = public_key_setting(key)
    settings.EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS = 300
    forget_webhooks()
    yield key
    forget_webhooks()


def post(body: bytes, *, signature: str | None, timestamp: str | None) -> Any:  # noqa: ANN401
    headers = {}
    if signature is not None:
        headers[SIGNATURE_HEADER] = signature
    if timestamp is not None:
        headers[TIMESTAMP_HEADER] = timestamp
    return APIClient().post(URL, data=body, content_type="application/json", headers=headers)


def post_signed(key: ec.EllipticCurvePrivateKey, events: list[dict[str, Any]]) -> Any:  # noqa: ANN401
    body = json.dumps(events).encode()
    timestamp = str(int(time.time()))
    return post(body, signature=sign(key, body, timestamp), timestamp=timestamp)


def counts() -> tuple[int, int, list[tuple[int, int, int]]]:
    return (
        EmailEvent.objects.count(),
        Suppression.objects.count(),
        list(
            Campaign.objects.order_by("id").values_list(
                "bounced_count", "complained_count", "unsubscribed_count"
            )
        ),
    )


def campaign_messages(n: int) -> list[Message]:
    """`n` sent campaign messages to r1@example.com … (as if SendGrid had accepted them)."""
    return factories.campaign_messages(make_campaign(make_audience(n)), status="sent", provider="sendgrid")


def event(
    kind: str, message: Message | None, n: int, email: str | None = None, **extra: Any
) -> dict[str, Any]:  # noqa: ANN401
    data: dict[str, Any] = {
        "email": email or (message.to_email if message else "nobody@example.com"),
        "timestamp": NOW,
        "event": kind,
        "sg_event_id": f"evt-{kind}-{n}",
        "sg_message_id": f"14c5d75ce93.dfd.64b469.filter0001.{n}.0",
        **extra,
    }
    if message is not None:
        data["emailhub_id"] = str(message.pk)  # the custom arg delivery/providers/sendgrid.py sets
    return data


# SendGrid's documented sample batch (Event Webhook Reference, "an example of each type of
# event"), with distinct sg_event_ids, plus a `blocked` bounce as SendGrid sends it for a
# domain without MX (bounce_classification, no status).
DOCUMENTED_SAMPLE = [
    {"email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
     "event": "processed", "category": "cat facts", "sg_event_id": "rbtnWrG1DVDGGGFHFyun0A==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000"},
    {"email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
     "event": "deferred", "category": "cat facts", "sg_event_id": "t7LEShmowp86DTdUW8M-GQ==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "response": "400 try again later", "attempt": "5"},
    {"email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
     "event": "delivered", "category": "cat facts", "sg_event_id": "rWVYmVk90MjZJ9iohOBa3w==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "response": "250 OK"},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "open", "sg_machine_open": False,
     "category": "cat facts", "sg_event_id": "FOTFFO0ecsBE-zxFXfs6WA==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "useragent": "Mozilla/4.0 (compatible; MSIE 6.1; Windows XP; .NET CLR 1.1.4322; .NET CLR 2.0.50727)",
     "ip": "255.255.255.255"},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "click", "category": "cat facts",
     "sg_event_id": "kCAi1KttyQdEKHhdC-nuEA==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "useragent": "Mozilla/4.0 (compatible; MSIE 6.1; Windows XP; .NET CLR 1.1.4322; .NET CLR 2.0.50727)",
     "ip": "255.255.255.255", "url": "http://www.sendgrid.com/"},
    {"email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
     "event": "bounce", "category": "cat facts", "sg_event_id": "6g4ZI7SA-xmRDv57GoPIPw==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "reason": "500 unknown recipient", "status": "5.0.0", "type": "bounce"},
    {"email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
     "event": "dropped", "category": "cat facts", "sg_event_id": "zmzJhfJgAfUSOW80yEbPyw==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "reason": "Bounced Address", "status": "5.0.0"},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "spamreport",
     "sg_event_id": "37nvH5QBz858KGVYCM4uOA==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000"},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "unsubscribe", "category": "cat facts",
     "sg_event_id": "zz_BjPgU_5pS-J8vlfB1sg==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000"},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "group_unsubscribe",
     "category": "cat facts", "sg_event_id": "ahSCB7xYcXFb-hEaawsPRw==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "useragent": "Mozilla/4.0 (compatible; MSIE 6.1; Windows XP; .NET CLR 1.1.4322; .NET CLR 2.0.50727)",
     "ip": "255.255.255.255", "url": "http://www.sendgrid.com/", "asm_group_id": 10},
    {"email": "example@test.com", "timestamp": 1513299569, "event": "group_resubscribe",
     "category": "cat facts", "sg_event_id": "w_u0vJhLT-OFfprar5N93g==",
     "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
     "useragent": "Mozilla/4.0 (compatible; MSIE 6.1; Windows XP; .NET CLR 1.1.4322; .NET CLR 2.0.50727)",
     "ip": "255.255.255.255", "url": "http://www.sendgrid.com/", "asm_group_id": 10},
    {"bounce_classification": "Unclassified", "email": "noemail@this.does.not.exist.tld", "event": "bounce",
     "reason": "unable to get mx info: failed to get IPs from PTR record: lookup <nil>: unrecognized address",
     "sg_event_id": "Ym91bmNlLTQtNTA0ODUxOTUtZXVvMmlLeGRTYXlQRjRZRTQtLUk3QS0w",
     "sg_message_id": "euo2iKxdSayPF4YE4--I7A.recvd-5f54b5d587-pczjm-1-67BADEEA-6.0",
     "smtp-id": "<870b3a2a-160c-4fc8-bc9a-bd0d5b943b81@forum.umbraco.com>", "timestamp": 1740300320,
     "tls": 0, "type": "blocked"},
]  # fmt: skip


@pytest.mark.django_db
def test_the_documented_sample_batch_parses_into_one_event_per_delivery_event(webhook_key: Any) -> None:  # noqa: ANN401
    response = post_signed(webhook_key, DOCUMENTED_SAMPLE)

    assert response.status_code == 200, response.content
    # processed and group_resubscribe are not recorded (the rule in delivery/webhooks/sendgrid.py).
    assert response.json() == {
        "received": 10,
        "new": 10,
        "duplicates": 0,
        "suppressed": 1,
        "unmatched": 10,
        "ignored": 2,
        "skipped": 0,
    }
    rows = {e.provider_event_id: e for e in EmailEvent.objects.filter(provider="sendgrid")}
    kinds = {
        r.payload["event"]: (r.kind, r.bounce) for r in rows.values() if r.recipient == "example@test.com"
    }
    assert kinds == {
        "deferred": ("deferred", ""),
        "delivered": ("delivered", ""),
        "open": ("opened", ""),
        "click": ("clicked", ""),
        "bounce": ("bounced", "permanent"),
        "dropped": ("dropped", "permanent"),
        "spamreport": ("complained", ""),
        "unsubscribe": ("unsubscribed", ""),
        "group_unsubscribe": ("unsubscribed", ""),
    }
    blocked = rows["Ym91bmNlLTQtNTA0ODUxOTUtZXVvMmlLeGRTYXlQRjRZRTQtLUk3QS0w"]
    assert (blocked.kind, blocked.bounce, blocked.recipient) == (
        "bounced",
        "transient",
        "noemail@this.does.not.exist.tld",
    )
    assert "unable to get mx info" in blocked.detail
    assert rows["t7LEShmowp86DTdUW8M-GQ=="].detail == "400 try again later; attempt 5"
    assert rows["kCAi1KttyQdEKHhdC-nuEA=="].detail == "http://www.sendgrid.com/"
    assert rows["6g4ZI7SA-xmRDv57GoPIPw=="].occurred_at.timestamp() == 1513299569
    # One address suppressed (once); the blocked one is not.
    assert list(Suppression.objects.values_list("email", flat=True)) == ["example@test.com"]


@pytest.mark.django_db
def test_a_bounce_suppresses_the_address_and_counts_once_in_its_campaign(webhook_key: Any) -> None:  # noqa: ANN401
    hard, soft, dropped, complained = campaign_messages(4)
    events = [
        event("bounce", hard, 1, type="bounce", status="5.1.1", reason="550 5.1.1 user unknown"),
        event("bounce", soft, 2, type="blocked", status="4.7.1", reason="421 try later"),
        event("dropped", dropped, 3, reason="Bounced Address"),
        event("spamreport", complained, 4),
        # An asynchronous bounce carries the custom arg but no sg_message_id.
        {**event("bounce", hard, 5, type="bounce", reason="mailbox gone"), "sg_message_id": None},
    ]

    response = post_signed(webhook_key, events)

    assert response.status_code == 200, response.content
    assert response.json()["unmatched"] == 0
    assert dict(Suppression.objects.values_list("email", "reason")) == {
        hard.to_email: "bounced",
        dropped.to_email: "bounced",
        complained.to_email: "complained",
    }
    assert Suppression.objects.get(email=hard.to_email).detail in (
        "bounce; 5.1.1; 550 5.1.1 user unknown",
        "bounce; mailbox gone",
    )
    campaign = Campaign.objects.get()
    # Two events bounce `hard`: the message is counted once.
    assert (campaign.bounced_count, campaign.complained_count, campaign.unsubscribed_count) == (2, 1, 0)
    assert sorted(EmailEvent.objects.values_list("message_id", "kind", "bounce")) == sorted(
        [
            (hard.pk, "bounced", "permanent"),
            (soft.pk, "bounced", "transient"),
            (dropped.pk, "dropped", "permanent"),
            (complained.pk, "complained", ""),
            (hard.pk, "bounced", "permanent"),
        ]
    )
    # The message's own status is what emailhub did; the bounce is an event about it.
    assert set(Message.objects.values_list("status", flat=True)) == {"sent"}


@pytest.mark.django_db
def test_the_same_batch_posted_twice_changes_nothing_the_second_time(webhook_key: Any) -> None:  # noqa: ANN401
    messages = campaign_messages(3)
    events = [event("bounce", messages[0], 1, type="bounce"), event("unsubscribe", messages[1], 2)]
    events += [event("delivered", messages[2], 3), event("open", messages[2], 4)]
    body = json.dumps(events).encode()
    timestamp = str(int(time.time()))
    signature = sign(webhook_key, body, timestamp)

    first = post(body, signature=signature, timestamp=timestamp)
    after_first = counts()
    second = post(body, signature=signature, timestamp=timestamp)  # a replay of the exact request

    assert first.status_code == second.status_code == 200
    assert first.json()["new"] == 4
    assert second.json() == {
        "received": 4,
        "new": 0,
        "duplicates": 4,
        "suppressed": 0,
        "unmatched": 0,
        "ignored": 0,
        "skipped": 0,
    }
    assert counts() == after_first == (4, 2, [(1, 0, 1)])


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", ["body", "timestamp", "key", "signature", "missing"])
def test_a_request_not_signed_by_the_configured_key_is_refused_and_writes_nothing(
    webhook_key: Any,  # noqa: ANN401
    tamper: str,
) -> None:
    message = campaign_messages(1)[0]
    body = json.dumps([event("bounce", message, 1, type="bounce")]).encode()
    timestamp = str(int(time.time()))
    signature = sign(webhook_key, body, timestamp)
    if tamper == "body":  # one byte of the body changed after signing
        body = body.replace(b'"bounce"', b'"bounc3"', 1)
    elif tamper == "timestamp":
        timestamp = str(int(timestamp) - 1)
    elif tamper == "key":  # signed by some other key
        signature = sign(ec.generate_private_key(ec.SECP256R1()), body, timestamp)
    elif tamper == "signature":
        signature = "not base64!"
    before = counts()

    response = post(body, signature=None if tamper == "missing" else signature, timestamp=timestamp)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["status"] == 400
    assert counts() == before == (0, 0, [(0, 0, 0)])


def test_the_timestamp_tolerance_holds_exactly_at_its_boundary(key: ec.EllipticCurvePrivateKey) -> None:
    public_key = load_public_key(public_key_setting(key))
    body = b"[]"

    def check(timestamp: int) -> None:
        verify_signature(
            body=body,
            signature=sign(key, body, str(timestamp)),
            timestamp=str(timestamp),
            public_key=public_key,
            tolerance=300,
            now=NOW,
        )

    check(NOW - 300)  # exactly the tolerance old: accepted
    check(NOW + 300)  # exactly the tolerance ahead of our clock: accepted
    with pytest.raises(ForgedWebhook, match="301 s from our clock"):
        check(NOW - 301)
    with pytest.raises(ForgedWebhook, match="-301 s from our clock"):
        check(NOW + 301)


@pytest.mark.django_db
def test_a_stale_request_is_refused_at_the_webhook_and_a_fresh_one_recorded(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    """The boundary through Webhook.handle and record_events, with the webhook's clock fixed."""
    message = campaign_messages(1)[0]
    webhook = SendGridWebhook(public_key=public_key_setting(key), tolerance=300, clock=lambda: float(NOW))
    body = json.dumps([event("bounce", message, 1, type="bounce")]).encode()

    def request(timestamp: int) -> WebhookRequest:
        headers = {SIGNATURE_HEADER: sign(key, body, str(timestamp)), TIMESTAMP_HEADER: str(timestamp)}
        return WebhookRequest(body=body, headers=headers)

    with pytest.raises(ForgedWebhook):
        webhook.handle(request(NOW - 301))
    assert counts() == (0, 0, [(0, 0, 0)])

    assert webhook.handle(request(NOW - 300))["new"] == 1
    assert counts() == (1, 1, [(1, 0, 0)])


@pytest.mark.django_db
def test_an_authentic_body_that_is_not_an_event_array_is_a_400(webhook_key: Any) -> None:  # noqa: ANN401
    deep = b"[" * 5000 + b"]" * 5000  # past the decoder's recursion limit: no event can be read
    for body in (b'{"event": "bounce"}', b"not json", b"[1, 2", b'["\xff"]', deep):
        timestamp = str(int(time.time()))
        response = post(body, signature=sign(webhook_key, body, timestamp), timestamp=timestamp)
        assert response.status_code == 400, (body, response.content)
    assert counts() == (0, 0, [])


@pytest.mark.django_db
def test_unusable_events_in_a_signed_batch_are_skipped_logged_and_counted_and_the_rest_recorded(
    webhook_key: Any,  # noqa: ANN401
    caplog: pytest.LogCaptureFixture,
) -> None:
    hard, delivered = campaign_messages(2)
    nested: Any = "x"
    for _ in range(200):  # decodable, but deeper than delivery.services.events.MAX_JSON_DEPTH
        nested = [nested]
    no_address = event("bounce", None, 9)
    del no_address["email"]
    batch = [
        event("bounce", hard, 1, type="bounce"),
        {**event("bounce", None, 2), "spam": float("nan")},  # NaN: jsonb refuses it
        event("bounce", None, 3, reason="550 bad\u0000mailbox"),  # U+0000: PostgreSQL refuses it
        {**event("bounce", None, 4), "extra": nested},
        1,  # not an event object
        event("bounce", None, 5, email="x" * 250 + "@example.com"),  # longer than any address
        event("bounce", None, 6, email=5),  # not a string
        no_address,
        {k: v for k, v in event("delivered", None, 7).items() if k != "event"},  # no event type
        event("processed", None, 8),  # not recorded on purpose: ignored, not skipped
        event("delivered", delivered, 10),
    ]
    body = json.dumps(batch).encode()  # json.dumps writes NaN as SendGrid's batch would carry it
    assert b"NaN" in body
    timestamp = str(int(time.time()))
    before = skipped("sendgrid")
    with caplog.at_level(logging.WARNING, logger="delivery.webhooks"):
        response = post(body, signature=sign(webhook_key, body, timestamp), timestamp=timestamp)

    assert response.status_code == 200, response.content
    assert response.json() == {
        "received": 2,
        "new": 2,
        "duplicates": 0,
        "suppressed": 1,
        "unmatched": 0,
        "ignored": 1,
        "skipped": 8,
    }
    assert sorted(EmailEvent.objects.values_list("message_id", "kind")) == sorted(
        [(hard.pk, "bounced"), (delivered.pk, "delivered")]
    )
    assert list(Suppression.objects.values_list("email", flat=True)) == [hard.to_email]
    assert delta(before, skipped("sendgrid")) == {
        "unstorable": 3,
        "not_an_object": 1,
        "recipient_too_long": 1,
        "bad_recipient": 2,
        "missing_field": 1,
    }
    logged = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(logged) == 8, logged
    assert any("event 2 " in line and "unstorable" in line for line in logged), logged  # names which, and why


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setting", "reason"), [("", "is not set"), ("bm90IGEga2V5", "is not a base64 DER public key")]
)
def test_without_a_usable_key_every_request_is_refused_naming_the_setting(
    settings: Any,  # noqa: ANN401
    key: ec.EllipticCurvePrivateKey,
    setting: str,
    reason: str,
) -> None:
    settings.EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY = setting
    forget_webhooks()
    body = json.dumps([event("bounce", None, 1)]).encode()
    timestamp = str(int(time.time()))
    try:
        response = post(body, signature=sign(key, body, timestamp), timestamp=timestamp)
    finally:
        forget_webhooks()
    # Our configuration, not the sender's fault: SendGrid retries a 5xx, so nothing is lost.
    assert response.status_code == 503
    assert "EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY" in response.json()["error"]["message"]
    assert reason in response.json()["error"]["message"]
    assert EmailEvent.objects.count() == 0


def test_a_key_that_is_not_p256_is_a_configuration_error_naming_the_setting() -> None:
    rsa_der = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for value in ("not a key", base64.b64encode(rsa_der).decode()):
        with pytest.raises(ImproperlyConfigured, match="EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY"):
            load_public_key(value)
