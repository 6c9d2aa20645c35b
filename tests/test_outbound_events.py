"""Outbound events (issue 22): which changes write which event, for whom, and that an event exists
exactly when its change committed. In process on the real PostgreSQL, Redis and SMTP test server;
the events are read from their table (core_outboundevent), as the dispatcher will send them. Their
delivery to endpoints: tests/test_outbound_webhooks.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis as redis_lib
from django.conf import LazySettings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns import fanout, lifecycle
from campaigns.erasure import erase_contacts
from campaigns.models import Campaign
from campaigns.suppressions import suppress
from core.models import OutboundEvent
from delivery.models import ApiKey, Message
from delivery.providers import close_all
from delivery.services import transitions
from delivery.services.events import ProviderEvent, record_events
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer, free_port
from outbound.models import Delivery, Endpoint
from outbound.services import dispatching, endpoints
from outbound.services.registration import DISPATCH_BELL
from tests import factories
from tests.broker import queued_tasks

pytestmark = pytest.mark.django_db

# Registration checks the URL (outbound/services/addresses.py); nothing is sent to it here.
URL = "http://127.0.0.1:9/hook"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture(autouse=True)
def local(settings: LazySettings) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = True
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True


@pytest.fixture
def app() -> tuple[ApiKey, APIClient]:
    """An application's key (send and read, not manage: it hears of its own messages only)."""
    key, raw = factories.api_key("send", "read")
    return key, factories.authenticated(raw)


@pytest.fixture
def listening(app: tuple[ApiKey, APIClient]) -> Endpoint:
    """An endpoint of the application's key that wants every event type."""
    return endpoints.create(app[0], URL)[0]


def written() -> list[dict[str, Any]]:
    """Every event written so far, oldest first, as it will be sent; each checked for the
    envelope every event has (its type as in the row, an RFC 3339 UTC timestamp, data)."""
    found = []
    for row in OutboundEvent.objects.order_by("id"):
        assert set(row.payload) == {"type", "timestamp", "data"}, row.payload
        assert row.payload["type"] == row.type and ISO.match(row.payload["timestamp"]), row.payload
        found.append(row.payload)
    return found


def types() -> list[str]:
    return [event["type"] for event in written()]


def accept(client: APIClient, **fields: Any) -> int:
    body = {"to": "ann@example.com", "subject": "s", "text": "t", "priority": "high", **fields}
    response = client.post("/api/v1/messages", body, format="json")
    assert response.status_code == 202, response.content
    return int(response.json()["id"])


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- what each change writes ----------------------------------------------------------------------


@pytest.mark.usefixtures("fast_paths")
def test_an_accepted_message_is_queued_with_its_tags_and_metadata(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    message_id = accept(app[1], tags=["otp", "signup"], metadata={"order": "42", "plan": "gold"})
    [event] = written()
    assert event["type"] == "message.queued"
    assert event["data"] == {
        "message_id": message_id,
        "to": "ann@example.com",
        "status": "queued",
        "priority": "high",
        "provider": None,
        "provider_message_id": None,
        "campaign_id": None,
        "tags": ["otp", "signup"],
        "metadata": {"order": "42", "plan": "gold"},
        "attempts": 0,
        "error": None,
        "due_at": None,
    }
    assert OutboundEvent.objects.get().owner_key_id == app[0].pk


def test_a_message_sent_later_is_queued_with_its_due_time(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    due = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    message_id = accept(app[1], send_at=due.isoformat())
    [event] = written()
    assert event["type"] == "message.queued"
    assert (event["data"]["message_id"], event["data"]["status"]) == (message_id, "scheduled")
    assert event["data"]["due_at"] == iso(due)


def test_a_repeated_idempotency_key_writes_no_second_event_and_a_batch_one_per_message(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    client = app[1]
    for _ in range(2):
        response = client.post(
            "/api/v1/messages",
            {"to": "ann@example.com", "subject": "s", "text": "t"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="signup-1",
        )
        assert response.status_code in (200, 202), response.content
    batch = [{"to": f"b{n}@example.com", "subject": "s", "text": "t", "tags": [f"n{n}"]} for n in range(3)]
    response = client.post("/api/v1/messages/batch", {"messages": batch}, format="json")
    assert response.status_code in (200, 201, 202, 207), response.content
    events = written()
    assert [e["type"] for e in events] == ["message.queued"] * 4
    assert [e["data"]["to"] for e in events] == [
        "ann@example.com",
        "b0@example.com",
        "b1@example.com",
        "b2@example.com",
    ]
    assert [e["data"]["tags"] for e in events[1:]] == [["n0"], ["n1"], ["n2"]]


def test_a_sent_message_is_announced_with_its_provider(
    app: tuple[ApiKey, APIClient], listening: Endpoint, smtp: SMTPTestServer
) -> None:
    message_id = accept(app[1], tags=["receipt"], metadata={"order": "7"})
    send_messages([message_id])
    queued, sent = written()
    assert (queued["type"], sent["type"]) == ("message.queued", "message.sent")
    message = Message.objects.get(pk=message_id)
    assert sent["data"]["status"] == "sent" and sent["data"]["provider"] == "smtp"
    assert sent["data"]["provider_message_id"] == message.provider_message_id is not None
    assert (sent["data"]["tags"], sent["data"]["metadata"], sent["data"]["attempts"]) == (
        ["receipt"], {"order": "7"}, 1
    )  # fmt: skip


def test_a_permanently_refused_recipient_is_announced_failed_with_the_servers_reply(
    app: tuple[ApiKey, APIClient], listening: Endpoint, smtp: SMTPTestServer
) -> None:
    smtp.reply_for("gone@example.com", "550 5.1.1 no such user")
    message_id = accept(app[1], to="gone@example.com")
    send_messages([message_id])
    assert types() == ["message.queued", "message.failed"]
    failed = written()[1]["data"]
    assert failed["message_id"] == message_id and failed["status"] == "failed"
    assert "550" in failed["error"] and failed["error"] == Message.objects.get(pk=message_id).last_error


def test_a_message_to_a_suppressed_address_is_announced_suppressed(
    app: tuple[ApiKey, APIClient], listening: Endpoint, smtp: SMTPTestServer
) -> None:
    suppress([("blocked@example.com", "test")], "bounced")
    message_id = accept(app[1], to="blocked@example.com")
    send_messages([message_id])
    assert types() == ["message.queued", "message.suppressed"]
    assert written()[1]["data"]["message_id"] == message_id
    assert smtp.messages == []


def test_every_provider_down_announces_the_message_deferred_with_its_next_try(
    app: tuple[ApiKey, APIClient], listening: Endpoint, settings: LazySettings
) -> None:
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    settings.SMTP_PORT = free_port()  # nothing listens there
    close_all()
    try:
        message_id = accept(app[1])
        send_messages([message_id])
    finally:
        close_all()
    message = Message.objects.get(pk=message_id)
    assert message.status == "retry_wait"
    assert types() == ["message.queued", "message.deferred"]
    deferred = written()[1]["data"]
    assert deferred["status"] == "retry_wait" and deferred["due_at"] == iso(message.due_at)
    assert deferred["error"] == message.last_error and deferred["error"]


def test_cancelling_by_id_and_by_tag_announces_each_message_cancelled(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    client = app[1]
    alone = accept(client, send_at=(timezone.now() + timedelta(hours=1)).isoformat())
    tagged = [accept(client, to=f"t{n}@example.com", tags=["reminder:42"]) for n in range(2)]
    OutboundEvent.objects.all().delete()
    assert client.post(f"/api/v1/messages/{alone}/cancel").status_code == 200
    response = client.post("/api/v1/messages/cancel", {"tag": "reminder:42"}, format="json")
    assert response.status_code == 200 and response.json()["cancelled"] == 2
    events = written()
    assert [e["type"] for e in events] == ["message.cancelled"] * 3
    assert sorted(e["data"]["message_id"] for e in events) == sorted([alone, *tagged])
    assert {e["data"]["status"] for e in events} == {"cancelled"}
    assert events[0]["data"]["error"] == "cancelled through the API"
    # Cancelling again changes nothing, and says nothing.
    client.post(f"/api/v1/messages/{alone}/cancel")
    client.post("/api/v1/messages/cancel", {"tag": "reminder:42"}, format="json")
    assert len(written()) == 3


def test_a_message_whose_workers_kept_dying_is_announced_failed_and_a_requeued_one_is_not(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    long_ago = timezone.now() - timedelta(hours=1)
    given_up = factories.message(
        "a@example.com", api_key=app[0], status="sending", attempts=3, claimed_at=long_ago
    )
    factories.message("b@example.com", api_key=app[0], status="sending", attempts=1, claimed_at=long_ago)
    transitions.requeue_stale(lease_seconds=60, max_attempts=3)
    [event] = written()
    assert event["type"] == "message.failed" and event["data"]["message_id"] == given_up.pk
    assert event["data"]["error"].startswith("gave up: its worker died while sending")


# --- what providers and recipients report ---------------------------------------------------------


def _report(message: Message, kind: str, n: int = 0, **fields: Any) -> None:
    record_events(
        [
            ProviderEvent(
                provider="sendgrid",
                event_id=f"{kind}-{n}-{fields.get('bounce', '')}",
                kind=kind,
                occurred_at=datetime(2026, 3, 1, 12, 0, n, tzinfo=UTC),
                message_id=message.pk,
                **fields,
            )
        ]
    )


@pytest.mark.parametrize(
    ("kind", "fields", "announced", "extra"),
    [
        ("delivered", {}, "message.delivered", {}),
        ("bounced", {"bounce": "permanent", "detail": "550 no such user"}, "message.bounced",
         {"bounce": "permanent", "detail": "550 no such user"}),
        ("bounced", {"bounce": "transient", "detail": "mailbox full"}, "message.bounced",
         {"bounce": "transient", "detail": "mailbox full"}),
        ("complained", {"detail": "abuse"}, "message.complained", {"detail": "abuse"}),
        ("rejected", {"detail": "virus"}, "message.rejected", {"detail": "virus"}),
        ("dropped", {"detail": "spam content"}, "message.rejected", {"detail": "spam content"}),
        ("deferred", {}, "message.deferred", {}),
        ("delayed", {}, "message.deferred", {}),
        ("unsubscribed", {}, "contact.unsubscribed", {}),
    ],
)  # fmt: skip
def test_provider_events_are_announced_in_the_normalised_vocabulary(
    app: tuple[ApiKey, APIClient],
    listening: Endpoint,
    kind: str,
    fields: dict[str, str],
    announced: str,
    extra: dict[str, str],
) -> None:
    message = factories.message(
        api_key=app[0], status="sent", provider="sendgrid", provider_message_id="sg-1",
        tags=["welcome"], metadata={"user": "9"},
    )  # fmt: skip
    _report(message, kind, **fields)
    [event] = written()
    assert event["type"] == announced
    assert event["timestamp"] == "2026-03-01T12:00:00.000000Z"  # when it happened, not when told
    assert event["data"] == {
        "message_id": message.pk,
        "to": "ann@example.com",
        "status": "sent",
        "priority": "critical",
        "provider": "sendgrid",
        "provider_message_id": "sg-1",
        "campaign_id": None,
        "tags": ["welcome"],
        "metadata": {"user": "9"},
        "attempts": 0,
        "error": None,
        "due_at": None,
        "event": kind,
        "source": "sendgrid",
        "recipient": "ann@example.com",
        **extra,
    }
    # A provider retrying its webhook: recorded once, announced once.
    _report(message, kind, **fields)
    assert len(written()) == 1


def test_opens_and_clicks_say_whether_a_person_made_them(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    message = factories.message(api_key=app[0], status="sent", provider="sendgrid")
    _report(message, "opened", 1, machine_open=True)
    _report(message, "opened", 2, classification="human")
    _report(message, "clicked", 3, classification="human", detail="https://shop.example.com/cart?id=1")
    _report(message, "clicked", 4, classification="bot", detail="https://shop.example.com/")
    events = written()
    assert [e["type"] for e in events] == [
        "message.opened",
        "message.opened",
        "message.clicked",
        "message.clicked",
    ]
    assert [(e["data"]["classification"], e["data"]["human"]) for e in events] == [
        ("machine", False), ("human", True), ("human", True), ("bot", False)
    ]  # fmt: skip
    assert events[2]["data"]["url"] == "https://shop.example.com/cart?id=1"
    assert "detail" not in events[2]["data"] and "url" not in events[0]["data"]


def test_an_unmatched_provider_event_writes_nothing(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    record_events(
        [
            ProviderEvent(
                "ses", "x-1", "bounced", timezone.now(), recipient="who@example.com", bounce="permanent"
            )
        ]
    )
    assert written() == []


# --- campaigns ---------------------------------------------------------------------------------------


def test_a_completed_campaign_is_announced_to_endpoints_that_see_every_keys_mail(
    app: tuple[ApiKey, APIClient], smtp: SMTPTestServer
) -> None:
    own = endpoints.create(app[0], URL)[0]
    operator, _ = factories.api_key()  # every scope, manage among them
    everything = endpoints.create(operator, URL)[0]
    assert (own.all_messages, everything.all_messages) == (False, True)
    campaign = factories.sending(factories.make_campaign(factories.make_audience(3), name="spring"))
    Campaign.objects.filter(pk=campaign.pk).update(tags=["spring-sale"])
    fanout.fan_out(campaign.pk)
    ids = list(Message.objects.filter(campaign=campaign).order_by("id").values_list("id", flat=True))
    send_messages(ids)
    campaign.refresh_from_db()
    assert campaign.status == "completed"
    assert types() == ["message.queued"] * 3 + ["message.sent"] * 3 + ["campaign.completed"]
    completed = written()[-1]["data"]
    assert completed == {
        "campaign_id": campaign.pk,
        "name": "spring",
        "tags": ["spring-sale"],
        "total": 3,
        "sent": 3,
        "failed": 0,
        "suppressed": 0,
        "cancelled": 0,
        "excluded": 0,
        "completed_at": iso(campaign.completed_at),
    }
    assert {e["data"]["campaign_id"] for e in written()[:6]} == {campaign.pk}
    assert set(OutboundEvent.objects.values_list("owner_key_id", flat=True)) == {None}
    # Campaign mail belongs to no key: only the endpoint that sees every key's mail gets it.
    dispatching.dispatch()
    assert Delivery.objects.filter(endpoint=own).count() == 0
    assert Delivery.objects.filter(endpoint=everything).count() == 7


def test_a_campaign_completed_with_no_message_to_record_is_announced_once() -> None:
    operator, _ = factories.api_key()
    endpoints.create(operator, URL, event_types=["campaign.completed"])
    campaign = factories.sending(factories.make_campaign(factories.make_audience(0, name="empty")))
    fanout.fan_out(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == "completed"
    [event] = written()
    assert event["type"] == "campaign.completed"
    assert (event["data"]["campaign_id"], event["data"]["total"]) == (campaign.pk, 0)


def test_a_cancelled_campaigns_messages_are_announced_cancelled(app: tuple[ApiKey, APIClient]) -> None:
    operator, _ = factories.api_key()
    endpoints.create(operator, URL, event_types=["message.cancelled", "campaign.completed"])
    campaign = factories.sending(factories.make_campaign(factories.make_audience(4)))
    fanout.fan_out(campaign.pk)
    lifecycle.cancel(campaign.pk)
    events = written()
    assert [e["type"] for e in events] == ["message.cancelled"] * 4  # cancelled is not completed
    assert {(e["data"]["campaign_id"], e["data"]["error"]) for e in events} == {
        (campaign.pk, "campaign cancelled")
    }


# --- who is told ----------------------------------------------------------------------------------


def test_only_the_event_types_some_endpoint_wants_are_written(
    app: tuple[ApiKey, APIClient], smtp: SMTPTestServer
) -> None:
    endpoints.create(app[0], URL, event_types=["message.sent", "message.bounced"])
    message_id = accept(app[1])
    send_messages([message_id])
    message = Message.objects.get(pk=message_id)
    _report(message, "delivered")
    _report(message, "bounced", bounce="permanent")
    assert types() == ["message.sent", "message.bounced"]


def test_an_endpoint_hears_only_its_own_keys_messages_and_a_manage_keys_hears_every_ones(
    app: tuple[ApiKey, APIClient],
) -> None:
    other_key, other_raw = factories.api_key("send", "read")
    operator, _ = factories.api_key()
    mine = endpoints.create(app[0], URL)[0]
    theirs = endpoints.create(other_key, URL)[0]
    everything = endpoints.create(operator, URL)[0]
    accept(app[1], to="mine@example.com")
    accept(factories.authenticated(other_raw), to="theirs@example.com")
    factories.message("nokey@example.com", status="queued")  # an operator's test send, say: no key
    transitions.cancel(list(Message.objects.filter(api_key=None).values_list("id", flat=True)), "test")
    dispatching.dispatch()

    def heard(endpoint: Endpoint) -> list[str]:
        ids = [i for d in Delivery.objects.filter(endpoint=endpoint) for i in d.event_ids]
        return [e.payload["data"]["to"] for e in OutboundEvent.objects.filter(pk__in=ids).order_by("id")]

    assert heard(mine) == ["mine@example.com"]
    assert heard(theirs) == ["theirs@example.com"]
    assert heard(everything) == ["mine@example.com", "theirs@example.com", "nokey@example.com"]


def test_with_no_enabled_endpoint_nothing_is_written(
    app: tuple[ApiKey, APIClient], smtp: SMTPTestServer
) -> None:
    accept(app[1])
    endpoint = endpoints.create(app[0], URL, enabled=False)[0]
    other_key, _ = factories.api_key("send")
    endpoints.create(other_key, URL)  # another key's endpoint wants none of this key's events
    send_messages([accept(app[1])])
    assert OutboundEvent.objects.count() == 0
    endpoints.update(endpoint, enabled=True)
    accept(app[1])
    assert types() == ["message.queued"]


# --- only what committed --------------------------------------------------------------------------


class Boom(Exception):
    pass


def test_a_change_rolled_back_writes_no_event(app: tuple[ApiKey, APIClient], listening: Endpoint) -> None:
    queued = factories.message(api_key=app[0])
    sending = factories.message("b@example.com", api_key=app[0])
    [claimed] = transitions.claim([sending.pk])
    sent = factories.message("c@example.com", api_key=app[0], status="sent")

    with pytest.raises(Boom), transaction.atomic():
        transitions.cancel([queued.pk], "by the test")
        outcomes = transitions.Outcomes()
        outcomes.sent["smtp"].append((sending.pk, "smtp-1"))
        transitions.record_outcomes(outcomes, claimed.claimed_at)
        _report(sent, "delivered")
        assert types() == ["message.cancelled", "message.sent", "message.delivered"]
        raise Boom

    assert OutboundEvent.objects.count() == 0
    assert list(Message.objects.order_by("id").values_list("status", flat=True)) == [
        "queued",
        "sending",
        "sent",
    ]


def test_the_events_of_a_batch_are_written_by_the_statements_that_move_it(
    app: tuple[ApiKey, APIClient], listening: Endpoint
) -> None:
    """One statement per outcome whatever the batch size, and the same statements with or
    without an endpoint to tell (docs: events are written set-based with their transitions)."""

    def record(count: int) -> int:
        batch = factories.messages(count, prefix=f"n{count}-", api_key=app[0])
        claimed = transitions.claim([m.pk for m in batch])
        outcomes = transitions.Outcomes()
        outcomes.sent["smtp"] = [(m.id, f"smtp-{m.id}") for m in claimed[: count // 2]]
        outcomes.failed = [(m.id, "550 refused") for m in claimed[count // 2 :]]
        with CaptureQueriesContext(connection) as queries:
            transitions.record_outcomes(outcomes, claimed[0].claimed_at)
        return len(queries.captured_queries)

    small, large = record(2), record(200)
    assert small == large == 2
    assert types().count("message.sent") == 101 and types().count("message.failed") == 101
    Endpoint.objects.all().delete()
    assert record(200) == 2 and OutboundEvent.objects.count() == 202


# --- the dispatcher's doorbell ------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_paths")
def test_the_doorbell_rings_after_commit_and_events_whose_ring_was_lost_are_dispatched_by_the_tick(
    app: tuple[ApiKey, APIClient],
    listening: Endpoint,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    message = factories.message(api_key=app[0], status="sent")
    with django_capture_on_commit_callbacks(execute=True):
        _report(message, "delivered")
    with django_capture_on_commit_callbacks(execute=True):
        _report(message, "opened", 1, classification="human")
    # One dispatcher task on the webhooks queue: the second ring found the bell set.
    assert queued_tasks(redis, "webhooks") == [("outbound.dispatch_events", [])]
    # The task is lost (a broker restart, a process killed after the commit): the beat tick's
    # dispatch finds the events all the same, and unsets the bell for the next ring.
    redis.delete("webhooks")
    assert not OutboundEvent.objects.filter(dispatched=True).exists()
    assert dispatching.dispatch() == 2
    assert redis.exists(DISPATCH_BELL.key) == 0
    [delivery_1, delivery_2] = Delivery.objects.filter(endpoint=listening)
    assert (delivery_1.status, delivery_2.status) == ("pending", "pending")
    assert not OutboundEvent.objects.filter(dispatched=False).exists()
    assert dispatching.dispatch() == 0  # dispatched once
    assert Delivery.objects.count() == 2


def test_erasing_a_recipient_scrubs_what_its_events_say_of_it(
    app: tuple[ApiKey, APIClient], listening: Endpoint, smtp: SMTPTestServer
) -> None:
    contact = factories.contact("ann@example.com")
    sent = accept(app[1], metadata={"customer": "Ann Example"})
    send_messages([sent])
    waiting = accept(app[1], send_at=(timezone.now() + timedelta(hours=1)).isoformat())
    record_events(
        [ProviderEvent(provider="ses", event_id="b-1", kind="bounced", occurred_at=datetime.now(UTC),
                       message_id=sent, bounce="transient", detail="ann@example.com: mailbox full")]
    )  # fmt: skip
    erase_contacts([contact.pk])

    events = written()
    assert types() == [
        "message.queued",
        "message.sent",
        "message.queued",
        "message.bounced",
        "message.cancelled",
    ]
    assert "ann@example.com" not in str(events).lower() and "Ann Example" not in str(events)
    assert {e["data"]["to"] for e in events} == {f"erased-{contact.pk}@invalid"}
    assert [e["data"]["message_id"] for e in events] == [sent, sent, waiting, sent, waiting]
