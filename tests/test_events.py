"""Provider events recorded once, their consequences (suppressions, campaign feedback counters),
and the events API. Real PostgreSQL and Redis; the SMTP server on loopback for the sends."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import redis as redis_lib
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from campaigns import fanout
from campaigns.models import Campaign, Contact, Suppression
from delivery.exceptions import InvalidEvent
from delivery.models import EmailEvent, Message
from delivery.services.events import ProviderEvent, record_events
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests import factories
from tests.broker import queued_tasks
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def event(event_id: str, kind: str, message: Message | None = None, **fields: object) -> ProviderEvent:
    values: dict = {"provider": "ses", "occurred_at": T0, "message_id": message.pk if message else None}
    return ProviderEvent(event_id=event_id, kind=kind, **{**values, **fields})


def counters(campaign: Campaign) -> tuple[int, int, int]:
    campaign.refresh_from_db()
    return campaign.bounced_count, campaign.complained_count, campaign.unsubscribed_count


def suppressions() -> dict[str, str]:
    return dict(Suppression.objects.values_list("email", "reason"))


def sending_campaign(size: int) -> Campaign:
    return factories.sending_campaign(factories.make_audience(size))


def mixed_batch(campaign: Campaign) -> list[ProviderEvent]:
    ann, bob, cy, dee = (
        factories.sent_message(f"{name}@example.com", campaign=campaign)
        for name in ("ann", "bob", "cy", "dee")
    )
    return [
        event("d-1", "delivered", ann),
        event("b-1", "bounced", bob, bounce="permanent", detail="General"),
        event("c-1", "complained", cy, detail="abuse"),
        event("u-1", "unsubscribed", dee, provider="sendgrid"),
        event("t-1", "bounced", ann, bounce="transient", detail="MailboxFull"),
    ]


# --- recorded once -------------------------------------------------------------------------------


def test_the_same_batch_twice_changes_nothing() -> None:
    campaign = sending_campaign(0)
    batch = mixed_batch(campaign)
    first = record_events(batch)
    assert (first.received, first.new, first.duplicates, first.suppressed) == (5, 5, 0, 3)
    before = (EmailEvent.objects.count(), suppressions(), counters(campaign))

    second = record_events(batch)

    assert (second.received, second.new, second.duplicates, second.suppressed) == (5, 0, 5, 0)
    assert (EmailEvent.objects.count(), suppressions(), counters(campaign)) == before
    assert before == (
        5,
        {"bob@example.com": "bounced", "cy@example.com": "complained", "dee@example.com": "unsubscribed"},
        (1, 1, 1),
    )


def test_a_batch_is_recorded_by_the_same_few_queries_whatever_its_size() -> None:
    campaign = sending_campaign(0)

    def queries(n: int, prefix: str) -> int:
        message = factories.sent_message(f"{prefix}@example.com", campaign=campaign)
        batch = [event(f"{prefix}-{i}", "bounced", message, bounce="permanent") for i in range(n)]
        with CaptureQueriesContext(connection) as captured:
            assert record_events(batch).new == n
        inserts = [q for q in captured.captured_queries if "INSERT INTO delivery_emailevent" in q["sql"]]
        assert len(inserts) == 1  # one set-based insert for the whole batch
        return len(captured.captured_queries)

    assert queries(1, "small") == queries(500, "large")
    assert counters(campaign) == (2, 0, 0)  # 501 bounce events, two messages: each counted once


def test_duplicates_inside_one_batch_are_recorded_once() -> None:
    message = factories.sent_message()
    report = record_events([event("x", "delivered", message), event("x", "delivered", message)])
    assert (report.new, report.duplicates) == (1, 1)
    assert EmailEvent.objects.count() == 1


def test_the_same_event_id_from_two_providers_is_two_events() -> None:
    message = factories.sent_message()
    record_events([event("1", "delivered", message), event("1", "delivered", message, provider="sendgrid")])
    assert sorted(EmailEvent.objects.values_list("provider", flat=True)) == ["sendgrid", "ses"]


def test_events_find_their_message_by_id_then_by_provider_message_id_and_keep_unmatched_ones() -> None:
    by_id = factories.sent_message("one@example.com")
    by_provider_id = factories.sent_message("two@example.com", provider_message_id="0100-abc")
    report = record_events(
        [
            event("a", "delivered", by_id),
            event("b", "delivered", provider_message_id="0100-abc"),
            # An id that is no message of ours (a foreign custom arg) falls back to the provider id.
            event("c", "delivered", message_id=987654321, provider_message_id="0100-abc"),
            event("d", "bounced", bounce="permanent", recipient="Gone@Example.com"),
        ]
    )
    assert (report.new, report.unmatched) == (4, 1)
    rows = dict(EmailEvent.objects.values_list("provider_event_id", "message_id"))
    assert rows == {"a": by_id.pk, "b": by_provider_id.pk, "c": by_provider_id.pk, "d": None}
    recipients = dict(EmailEvent.objects.values_list("provider_event_id", "recipient"))
    # An event without a recipient is about its message's address.
    assert recipients == {
        "a": "one@example.com",
        "b": "two@example.com",
        "c": "two@example.com",
        "d": "gone@example.com",
    }
    assert suppressions() == {"gone@example.com": "bounced"}  # unmatched, still suppressed


def deep_list(levels: int) -> object:
    nested: object = "x"
    for _ in range(levels):
        nested = [nested]
    return nested


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "processed"},  # SendGrid's "processed": sources drop it (emailhub knows it sent)
        {"kind": "bounced", "bounce": "soft"},
        {"occurred_at": datetime(2025, 3, 1, 12, 0)},  # naive
        {"event_id": ""},
        {"event_id": "x" * 256},
        {"recipient": "a" * 250 + "@example.com"},
        # What PostgreSQL cannot store: a ValueError, a UnicodeEncodeError and a DataError at the
        # INSERT (a 500 for the source) before they were refused here.
        {"detail": "550 bad\x00mailbox"},
        {"recipient": "a\ud800@example.com"},
        {"payload": {"spam": float("nan")}},
        {"payload": {"deep": deep_list(100)}},  # past MAX_JSON_DEPTH, where json.dumps may run out
    ],
)
def test_a_malformed_event_refuses_the_whole_batch_and_writes_nothing(bad: dict) -> None:
    message = factories.sent_message()
    good = event("good", "complained", message)
    fields = {"event_id": "bad", "kind": "delivered", **bad}
    with pytest.raises(InvalidEvent):
        record_events([good, event(message=message, **fields)])
    assert not EmailEvent.objects.exists() and not Suppression.objects.exists()


# --- consequences ----------------------------------------------------------------------------------


def test_only_permanent_bounces_complaints_address_drops_and_unsubscribes_suppress() -> None:
    campaign = sending_campaign(0)
    kinds = {
        "hard": ("bounced", "permanent", True),
        "soft": ("bounced", "transient", False),
        "deferred": ("deferred", "", False),
        "delayed": ("delayed", "", False),
        "drop-bounced": ("dropped", "permanent", True),  # SendGrid "Bounced Address" / "Invalid"
        "drop-other": ("dropped", "", False),  # e.g. "Invalid SMTPAPI header": not the address
        "reject": ("rejected", "", False),  # SES Reject (virus): not the address
        "complaint": ("complained", "", True),
        "unsub": ("unsubscribed", "", True),
        "open": ("opened", "", False),
        "click": ("clicked", "", False),
        "delivered": ("delivered", "", False),
    }
    messages = {name: factories.sent_message(f"{name}@example.com", campaign=campaign) for name in kinds}
    record_events(
        [event(name, kind, messages[name], bounce=bounce) for name, (kind, bounce, _) in kinds.items()]
    )
    expected = {f"{name}@example.com" for name, (_, _, suppresses) in kinds.items() if suppresses}
    assert set(suppressions()) == expected
    assert suppressions()["drop-bounced@example.com"] == "bounced"
    assert counters(campaign) == (2, 1, 1)
    # A message's own status stays what emailhub did: it was sent.
    assert set(Message.objects.values_list("status", flat=True)) == {"sent"}


def test_the_suppression_records_the_reason_and_detail_and_a_later_event_keeps_the_first_reason() -> None:
    message = factories.sent_message("Ann@Example.com")
    record_events([event("1", "bounced", message, bounce="permanent", detail="Permanent/NoEmail: 550 5.1.1")])
    record_events([event("2", "complained", message, detail="abuse")])
    row = Suppression.objects.get()
    assert (row.email, row.reason, row.detail) == (
        "ann@example.com",
        "bounced",
        "Permanent/NoEmail: 550 5.1.1",
    )


def test_a_campaign_counter_moves_once_per_message_whatever_reports_it() -> None:
    campaign = sending_campaign(0)
    message = factories.sent_message(campaign=campaign)
    other = factories.sent_message("other@example.com", campaign=campaign)
    record_events([event("ses-1", "bounced", message, bounce="permanent")])
    record_events(
        [
            event("dsn-1", "bounced", message, provider="smtp", bounce="permanent"),  # the same bounce
            event("ses-2", "unsubscribed", message),
            event("ses-3", "unsubscribed", message),
            event("ses-4", "complained", other),
        ]
    )
    assert counters(campaign) == (1, 1, 1)


def test_transactional_events_move_no_campaign_counter() -> None:
    campaign = sending_campaign(0)
    record_events([event("1", "complained", factories.sent_message())])
    assert counters(campaign) == (0, 0, 0)
    assert suppressions() == {"ann@example.com": "complained"}


def test_two_requests_reporting_one_message_at_once_count_it_once() -> None:
    """The second request waits for the first's transaction (an advisory lock per campaign),
    then sees its event: without the lock each would see no earlier event and both would count."""
    campaign = sending_campaign(0)
    message = factories.sent_message(campaign=campaign)
    done = threading.Event()

    def second_request() -> None:
        try:
            record_events([event("sns-2", "bounced", message, bounce="permanent", provider="smtp")])
        finally:
            done.set()
            connection.close()

    def second_is_waiting_or_done() -> bool:
        if done.is_set():
            return True
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return cursor.fetchone()[0] > 0

    with transaction.atomic():
        record_events([event("sns-1", "bounced", message, bounce="permanent")])
        worker = threading.Thread(target=second_request)
        worker.start()
        # pg_stat_activity is read on a separate connection: this one is inside the transaction.
        wait_until(_on_new_connection(second_is_waiting_or_done), message="the second request to block")
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert EmailEvent.objects.count() == 2
    assert counters(campaign) == (1, 0, 0)


def _on_new_connection(check):  # noqa: ANN001, ANN202
    """Run `check` in a thread (its own database connection), for use inside an open transaction."""

    def run() -> bool:
        result: list[bool] = []

        def target() -> None:
            try:
                result.append(check())
            finally:
                connection.close()

        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
        return result[0]

    return run


# --- suppressions at send time -----------------------------------------------------------------------


def test_an_unsubscribe_stops_campaign_mail_but_not_transactional_mail(smtp: SMTPTestServer) -> None:
    campaign = sending_campaign(0)
    record_events(
        [event("u", "unsubscribed", factories.sent_message("ann@example.com"), provider="emailhub")]
    )
    reset = Message.objects.create(
        to_email="ann@example.com", subject="Reset", text="link", priority="critical"
    )
    newsletter = Message.objects.create(
        to_email="ann@example.com", campaign=campaign, subject="News", text="hi", priority="normal"
    )
    send_messages([reset.pk, newsletter.pk])
    reset.refresh_from_db()
    newsletter.refresh_from_db()
    assert (reset.status, newsletter.status) == ("sent", "suppressed")
    assert [m.rcpt_tos for m in smtp.wait_for(1)] == [["ann@example.com"]]


def test_a_bounce_or_complaint_stops_transactional_mail_too(smtp: SMTPTestServer) -> None:
    record_events(
        [
            event("b", "bounced", factories.sent_message("gone@example.com"), bounce="permanent"),
            event("c", "complained", factories.sent_message("angry@example.com")),
        ]
    )
    ids = [
        Message.objects.create(to_email=to, subject="Reset", text="x", priority="critical").pk
        for to in ("gone@example.com", "angry@example.com")
    ]
    report = send_messages(ids)
    assert report.sent == 0
    assert set(Message.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"suppressed"}
    assert smtp.count == 0


def test_a_permanent_bounce_while_a_campaign_sends_suppresses_its_later_batches(
    settings,
    smtp: SMTPTestServer,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_BATCH_SIZES = {**settings.EMAILHUB_BATCH_SIZES, "normal": 3}
    campaign = sending_campaign(6)
    fanout.fan_out(campaign.pk)
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    batches = [args[0] for name, args in queued_tasks(client, "normal") if name == "delivery.send_messages"]
    client.delete("normal")
    assert [len(b) for b in batches] == [3, 3]
    first, later = batches
    send_messages(first)
    # A bounce for an address of a later batch arrives (reported about another message to it).
    victim = Message.objects.get(pk=later[1])
    report = record_events(
        [
            event(
                "hard",
                "bounced",
                factories.sent_message(victim.to_email.upper()),
                bounce="permanent",
                detail="550 5.1.1",
            )
        ]
    )
    assert report.suppressed == 1

    send_messages(later)

    victim.refresh_from_db()
    assert victim.status == "suppressed"
    assert victim.to_email not in {m.rcpt_tos[0] for m in smtp.wait_for(5)}
    campaign.refresh_from_db()
    assert (campaign.sent_count, campaign.suppressed_count, campaign.status) == (5, 1, "completed")


# --- the events API ----------------------------------------------------------------------------------


def test_a_key_reads_its_own_messages_events_and_anothers_is_404() -> None:
    alice, alice_key = factories.api_client("send", "read")
    bob, _ = factories.api_client("send", "read")
    ops, _ = factories.api_client("manage")
    message = factories.sent_message(api_key=alice_key)
    record_events(
        [event("1", "delivered", message), event("2", "opened", message, occurred_at=T0 + timedelta(hours=1))]
    )

    page = alice.get(f"/api/v1/messages/{message.pk}/events")
    assert page.status_code == 200
    assert [e["kind"] for e in page.json()["results"]] == ["opened", "delivered"]  # newest first
    assert page.json()["results"][0]["message"] == message.pk
    assert bob.get(f"/api/v1/messages/{message.pk}/events").status_code == 404
    assert ops.get(f"/api/v1/messages/{message.pk}/events").status_code == 200
    assert alice.get("/api/v1/messages/999999999/events").status_code == 404
    assert alice.get(f"/api/v1/messages/{2**70}/events").status_code == 404


def test_listing_every_event_needs_manage() -> None:
    app, _ = factories.api_client("send", "read")
    response = app.get("/api/v1/events")
    assert response.status_code == 403 and "`manage`" in response.content.decode()


def test_events_filter_by_kind_provider_message_campaign_recipient_and_time() -> None:
    ops, _ = factories.api_client("manage")
    campaign = sending_campaign(0)
    news = factories.sent_message("ann@example.com", campaign=campaign)
    reset = factories.sent_message("bob@example.com")
    record_events(
        [
            event("1", "delivered", news),
            event("2", "bounced", reset, bounce="transient", occurred_at=T0 + timedelta(hours=1)),
            event("3", "complained", news, provider="sendgrid", occurred_at=T0 + timedelta(hours=2)),
        ]
    )

    def ids(**query: object) -> list[str]:
        response = ops.get("/api/v1/events", query)
        assert response.status_code == 200, response.content
        return [e["provider_event_id"] for e in response.json()["results"]]

    assert ids() == ["3", "2", "1"]
    assert ids(kind="bounced") == ["2"]
    assert ids(provider="sendgrid") == ["3"]
    assert ids(message=news.pk) == ["3", "1"]
    assert ids(campaign=campaign.pk) == ["3", "1"]
    assert ids(recipient="BOB@example.com") == ["2"]
    assert ids(bounce="transient") == ["2"]
    assert ids(since=(T0 + timedelta(hours=1)).isoformat()) == ["3", "2"]
    assert ids(until=(T0 + timedelta(hours=1)).isoformat()) == ["1"]


@pytest.mark.parametrize(
    "query",
    [
        {"kind": "exploded"},
        {"message": "abc"},
        {"campaign": "-1"},
        {"since": "yesterday"},
        {"since": "2025-03-02T00:00:00Z", "until": "2025-03-01T00:00:00Z"},
        {"recipent": "typo@example.com"},  # an unknown filter is not silently ignored
        {"message": str(2**70)},
    ],
)
def test_a_bad_event_filter_is_a_400(query: dict) -> None:
    ops, _ = factories.api_client("manage")
    assert ops.get("/api/v1/events", query).status_code == 400


def test_events_are_keyset_paginated_by_cursor_without_gaps_or_repeats() -> None:
    ops, _ = factories.api_client("manage")
    message = factories.sent_message()
    record_events([event(f"e{i}", "opened", message) for i in range(25)])
    seen: list[int] = []
    url: str | None = "/api/v1/events?page_size=10"
    pages = 0
    while url:
        body = ops.get(url).json()
        seen += [e["id"] for e in body["results"]]
        # New events arriving between pages do not shift what the cursor returns next.
        if pages == 0:
            record_events([event("late", "clicked", message)])
        url = body["next"]
        pages += 1
    assert pages == 3 and len(seen) == 25 == len(set(seen))
    assert seen == sorted(seen, reverse=True)
    assert "late" not in {e.provider_event_id for e in EmailEvent.objects.filter(pk__in=seen)}


# --- the admin ------------------------------------------------------------------------------------


def test_the_admin_shows_events_on_the_message_and_contact_pages_and_rates_per_campaign_and_provider(
    admin_client: Client,
) -> None:
    campaign = sending_campaign(0)
    Campaign.objects.filter(pk=campaign.pk).update(sent_count=4)
    contact = Contact.objects.create(email="Gone+news@example.com", timezone="UTC")
    message = factories.sent_message("Gone+news@example.com", campaign=campaign, sent_at=timezone.now())
    factories.sent_message("fine@example.com", sent_at=timezone.now())
    record_events([event("hb-1", "bounced", message, bounce="permanent", detail="General: 550 5.1.1")])

    message_page = admin_client.get(
        reverse("admin:delivery_message_change", args=[message.pk])
    ).content.decode()
    assert "hb-1" in message_page and "General: 550 5.1.1" in message_page

    contact_page = admin_client.get(
        reverse("admin:campaigns_contact_change", args=[contact.pk])
    ).content.decode()
    assert "bounced: General: 550 5.1.1" in contact_page
    link = reverse("admin:delivery_emailevent_changelist") + "?recipient=gone%2Bnews%40example.com"
    assert link in contact_page
    events_page = admin_client.get(link).content.decode()
    assert "hb-1" not in events_page  # the list shows ids and kinds, not provider event ids
    assert f">{EmailEvent.objects.get().pk}<" in events_page and "General: 550 5.1.1" in events_page
    filtered = admin_client.get(reverse("admin:delivery_emailevent_changelist") + "?bounce=transient")
    assert "General: 550 5.1.1" not in filtered.content.decode()

    campaigns_page = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert "25.00% (1)" in campaigns_page  # 1 hard bounce of 4 sent

    providers_page = admin_client.get(reverse("admin-provider-health")).content.decode()
    assert "<td>2</td><td>1</td><td>50.00%</td>" in providers_page  # ses: 2 sent (in the window), 1 bounced


# --- which suppression reason wins ---------------------------------------------------------------


def test_a_bounce_replaces_an_unsubscribe_in_one_batch_and_later_but_never_the_reverse() -> None:
    ann, bob, cy = (factories.sent_message(f"{n}@example.com") for n in ("ann", "bob", "cy"))
    # One batch: ann unsubscribes, then hard-bounces; bob hard-bounces, then unsubscribes.
    record_events(
        [
            event("w-1", "unsubscribed", ann, recipient="ann@example.com"),
            event("w-2", "bounced", ann, recipient="ann@example.com", bounce="permanent"),
            event("w-3", "bounced", bob, recipient="bob@example.com", bounce="permanent"),
            event("w-4", "unsubscribed", bob, recipient="bob@example.com"),
            event("w-5", "unsubscribed", cy, recipient="cy@example.com"),
        ]
    )
    assert suppressions() == {
        "ann@example.com": "bounced",
        "bob@example.com": "bounced",
        "cy@example.com": "unsubscribed",
    }
    # Later requests: cy complains (replaces the unsubscribe, which let transactional mail through);
    # bob unsubscribes again (a bounce is never weakened).
    record_events(
        [
            event("w-6", "complained", cy, recipient="cy@example.com"),
            event("w-7", "unsubscribed", bob, recipient="bob@example.com"),
        ]
    )
    assert suppressions() == {
        "ann@example.com": "bounced",
        "bob@example.com": "bounced",
        "cy@example.com": "complained",
    }
