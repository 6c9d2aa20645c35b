"""Open and click tracking: tokens, the /t/ views (no database, no cookie, no oracle), the Redis
queue drained in batches, hit classification, first open/click set once, and rewritten links in
real SMTP-received campaign mail."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from campaigns.models import Campaign, Contact, Template
from delivery.exceptions import InvalidToken
from delivery.models import EmailEvent, Message
from delivery.services.events import ProviderEvent, record_events
from delivery.services.sending import send_messages
from delivery.services.tracking import drain_hits
from delivery.testing.smtp_server import SMTPTestServer
from delivery.tracking import hits
from delivery.tracking.classify import BOT, HUMAN, MACHINE, PROXY, SCANNER, Hit, classify
from delivery.tracking.links import TrackedHtml
from delivery.tracking.tokens import click_token, open_token, read_click_token, read_open_token
from tests import factories
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "https://mail.example.com"
BROWSER = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"
TRACKED = re.compile(r"https://mail\.example\.com/t/([oc])/([A-Za-z0-9_-]+)")


@pytest.fixture(autouse=True)
def public_url(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PUBLIC_URL = PUBLIC
    settings.EMAILHUB_TRACKING_SCANNER_SECONDS = 10.0


def sent_message(sent_ago: timedelta = timedelta(hours=1)) -> Message:
    return factories.sent_message(priority="high", provider=None, sent_at=datetime.now(UTC) - sent_ago)


def get(path: str, *, agent: str = BROWSER, ip: str = "203.0.113.7"):  # noqa: ANN201
    return Client().get(path, HTTP_USER_AGENT=agent, REMOTE_ADDR=ip)


# --- tokens -------------------------------------------------------------------------------------


def test_tokens_round_trip_and_hide_the_message_id() -> None:
    assert read_open_token(open_token(41)) == 41
    click = read_click_token(click_token(41, 3, "https://shop.example.com/a?b=1&c=2"))
    assert (click.message_id, click.link, click.url) == (41, 3, "https://shop.example.com/a?b=1&c=2")
    # Consecutive messages' tokens share nothing (no sequence to walk).
    first, second = open_token(1000), open_token(1001)
    assert sum(a == b for a, b in zip(first, second, strict=True)) < len(first) // 2


def test_every_changed_character_of_a_click_token_is_refused() -> None:
    token = click_token(7, 0, "https://shop.example.com/")
    for i in range(len(token)):
        forged = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
        with pytest.raises(InvalidToken):
            read_click_token(forged)


# --- the views ------------------------------------------------------------------------------------


def test_unknown_open_token_gets_the_pixel_and_writes_nothing(redis) -> None:  # noqa: ANN001
    for token in ["nope", open_token(1)[:-1] + "x", "A" * 32, open_token(999_999)]:
        response = get(f"/t/o/{token}")
        assert response.status_code == 200
        assert response["Content-Type"] == "image/gif"
        assert len(response.content) == 43 and response.content.startswith(b"GIF89a")
        assert response["Cache-Control"] == "no-store, private"
        assert "Set-Cookie" not in response and not response.cookies
    # Only the genuine token of a (missing) message was queued; it records an unmatched open.
    assert redis.llen(hits.settings.EMAILHUB_TRACKING_QUEUE) == 1
    drain_hits()
    assert not Message.objects.filter(first_opened_at__isnull=False).exists()
    assert list(EmailEvent.objects.values_list("message_id", flat=True)) == [None]


def test_forged_click_is_404_and_a_url_parameter_is_ignored(redis) -> None:  # noqa: ANN001
    message = sent_message()
    token = click_token(message.pk, 0, "https://shop.example.com/spring")
    forged = click_token(message.pk, 0, "https://evil.example.net/")[:40] + token[40:]
    assert get(f"/t/c/{forged}").status_code == 404
    assert get("/t/c/?url=https://evil.example.net/").status_code == 404
    assert get(f"/t/c/{token[:-2]}").status_code == 404
    response = get(f"/t/c/{token}?url=https://evil.example.net/")
    assert response.status_code == 302
    assert response["Location"] == "https://shop.example.com/spring"
    assert "Set-Cookie" not in response
    assert redis.llen(hits.settings.EMAILHUB_TRACKING_QUEUE) == 1  # only the genuine click


def test_pixel_still_answers_when_redis_is_down(settings) -> None:  # noqa: ANN001
    from delivery import breakers

    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    breakers.reset_process_state()
    response = get(f"/t/o/{open_token(5)}")
    assert response.status_code == 200 and len(response.content) == 43
    breakers.reset_process_state()


def test_views_record_the_forwarded_client_of_a_trusted_proxy_only(redis, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_TRUSTED_PROXIES = ["10.0.0.0/8"]
    message = sent_message()
    pixel, link = f"/t/o/{open_token(message.pk)}", f"/t/c/{click_token(message.pk, 0, 'https://a.example/')}"
    client = Client()
    for path, agent, peer, forwarded_for in [
        (pixel, "Mozilla/5.0", "10.0.0.1", "17.58.1.2"),
        (pixel, "Mozilla/5.0", "203.0.113.9", "17.58.1.2"),
        (link, BROWSER, "10.0.0.1", "17.1.1.1, 198.51.100.7"),
    ]:
        client.get(path, HTTP_USER_AGENT=agent, REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded_for)
    assert drain_hits().hits == 3
    assert sorted(EmailEvent.objects.values_list("kind", "payload__ip", "classification")) == [
        ("clicked", "198.51.100.7", HUMAN),
        ("opened", "17.58.1.2", MACHINE),  # Apple's proxy, as our proxy forwarded it
        ("opened", "203.0.113.9", BOT),  # the header from a peer we do not trust is ignored
    ]


# --- the queue, in batches ----------------------------------------------------------------------


def test_500_hits_make_at_most_one_insert_per_batch(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_TRACKING_DRAIN_BATCH = 120
    message = sent_message()
    opened, clicked = (
        f"/t/o/{open_token(message.pk)}",
        f"/t/c/{click_token(message.pk, 0, 'https://a.example/')}",
    )
    client = Client()
    with CaptureQueriesContext(connection) as during_requests:
        for n in range(500):
            client.get(opened if n % 2 else clicked, HTTP_USER_AGENT=BROWSER, REMOTE_ADDR="203.0.113.9")
    assert not [q for q in during_requests.captured_queries if "INSERT" in q["sql"].upper()]
    with CaptureQueriesContext(connection) as draining:
        report = drain_hits(budget_seconds=60)
    inserts = [
        q for q in draining.captured_queries if q["sql"].lstrip().upper().startswith(("INSERT", "WITH"))
    ]
    inserts = [q for q in inserts if "INSERT INTO" in q["sql"].upper()]
    assert report.hits == 500
    assert len(inserts) <= math.ceil(500 / 120)
    assert EmailEvent.objects.filter(message=message).count() == 500
    assert set(EmailEvent.objects.values_list("provider", flat=True)) == {"emailhub"}


def test_first_open_and_click_are_set_once() -> None:
    message = sent_message()
    get(f"/t/o/{open_token(message.pk)}")
    drain_hits()
    message.refresh_from_db()
    first_open = message.first_opened_at
    assert first_open is not None and message.first_clicked_at is None
    get(f"/t/o/{open_token(message.pk)}")
    get(f"/t/c/{click_token(message.pk, 0, 'https://a.example/')}")
    drain_hits()
    message.refresh_from_db()
    assert message.first_opened_at == first_open  # not moved by the later open or the click
    assert message.first_clicked_at is not None and message.first_clicked_at > first_open
    # An earlier time reported later (a provider's delayed webhook) does not move it either.
    record_events(
        [
            ProviderEvent(
                provider="ses",
                event_id="late-open",
                kind="opened",
                occurred_at=first_open - timedelta(minutes=5),
                message_id=message.pk,
                user_agent=BROWSER,
                ip="198.51.100.4",
            )
        ]
    )
    message.refresh_from_db()
    assert message.first_opened_at == first_open
    assert EmailEvent.objects.filter(message=message, classification=HUMAN).count() == 4


def test_a_machine_open_never_sets_first_opened_at() -> None:
    message = sent_message()
    get(f"/t/o/{open_token(message.pk)}", agent="Mozilla/5.0", ip="17.58.63.21")  # Apple MPP
    get(f"/t/o/{open_token(message.pk)}", agent="Mozilla/5.0 (via ggpht.com GoogleImageProxy)")
    get(f"/t/c/{click_token(message.pk, 0, 'https://a.example/')}", agent="python-requests/2.32")
    drain_hits()
    record_events(
        [
            ProviderEvent(
                provider="sendgrid",
                event_id="sg-machine",
                kind="opened",
                occurred_at=datetime.now(UTC),
                message_id=message.pk,
                user_agent=BROWSER,
                machine_open=True,
            )
        ]
    )
    message.refresh_from_db()
    assert message.first_opened_at is None and message.first_clicked_at is None
    assert sorted(EmailEvent.objects.filter(message=message).values_list("classification", flat=True)) == [
        BOT,
        MACHINE,
        MACHINE,
        PROXY,
    ]


def test_clicks_right_after_sending_or_in_a_burst_are_a_scanner() -> None:
    fresh = sent_message(sent_ago=timedelta(seconds=1))
    old = sent_message()
    get(f"/t/c/{click_token(fresh.pk, 0, 'https://a.example/')}")
    for link in range(3):  # three links of one message in well under 2 s
        get(f"/t/c/{click_token(old.pk, link, f'https://a.example/{link}')}")
    drain_hits()
    assert list(EmailEvent.objects.filter(message=fresh).values_list("classification", flat=True)) == [
        SCANNER
    ]
    assert set(EmailEvent.objects.filter(message=old).values_list("classification", flat=True)) == {SCANNER}
    old.refresh_from_db()
    fresh.refresh_from_db()
    assert old.first_clicked_at is None and fresh.first_clicked_at is None


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("hit", "expected"),
    [
        (Hit("opened", BROWSER, "203.0.113.1"), HUMAN),
        (Hit("opened", "Mozilla/5.0", "17.0.0.1"), MACHINE),
        (Hit("opened", "Mozilla/5.0", "203.0.113.1"), BOT),  # the bare UA, not from Apple
        (Hit("opened", BROWSER, "17.0.0.1"), HUMAN),  # Apple's network, a real browser
        (Hit("opened", BROWSER, machine_open=True), MACHINE),
        (Hit("opened", "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)"), PROXY),
        (Hit("opened", "YahooMailProxy; https://help.yahoo.com/kb/yahoo-mail-proxy-SLN28749.html"), PROXY),
        (Hit("clicked", "curl/8.5.0"), BOT),
        (Hit("clicked", "Go-http-client/1.1"), BOT),
        (Hit("clicked", "Mozilla/5.0 (compatible; Googlebot/2.1)"), BOT),
        (Hit("clicked", ""), BOT),
        (Hit("clicked", BROWSER, occurred_at=NOW, sent_at=NOW - timedelta(seconds=3)), SCANNER),
        (Hit("clicked", BROWSER, occurred_at=NOW, sent_at=NOW - timedelta(seconds=30)), HUMAN),
        (Hit("opened", BROWSER, occurred_at=NOW, sent_at=NOW - timedelta(seconds=3)), HUMAN),
        (Hit("clicked", BROWSER, burst=True), SCANNER),
    ],
)  # fmt: skip
def test_classification(hit: Hit, expected: str) -> None:
    assert classify(hit, scanner_seconds=10.0) == expected


# --- rewriting --------------------------------------------------------------------------------


def test_rewriting_leaves_mailto_tel_anchors_relative_and_unsubscribe_links() -> None:
    source = (
        '<a href="mailto:a@b.c">m</a><a href="tel:+1">t</a><a href="#top">a</a><a href="/rel">r</a>'
        '<a href="{{ unsubscribe_url }}">u</a><a class="x" href=\'https://a.example/?q={{ q }}&amp;z=1\'>p</a>'
        "<p>end</p></body>"
    )
    tracked = TrackedHtml(source, template=True)
    assert tracked.links == 1
    html = tracked.render({"q": "x y", "unsubscribe_url": "https://u.example/1"}, 9, opens=True, clicks=True)
    for kept in (
        'href="mailto:a@b.c"',
        'href="tel:+1"',
        'href="#top"',
        'href="/rel"',
        'href="https://u.example/1"',
    ):
        assert kept in html
    (token,) = [t for k, t in TRACKED.findall(html) if k == "c"]
    assert read_click_token(token).url == "https://a.example/?q=x y&z=1"
    assert html.index("/t/o/") < html.index("</body>")


def test_campaign_message_over_smtp_has_tracked_links_and_pixel(smtp: SMTPTestServer) -> None:
    template = Template.objects.create(
        name="tracked",
        subject="Spring {{ first_name }}",
        html=(
            '<html><body><p>Hi {{ first_name }}</p><a href="https://shop.example.com/spring?c=1&amp;d=2">Shop</a>'
            '<a href="https://blog.example.com/{{ first_name }}">Blog</a><a href="mailto:help@example.com">Help</a>'
            "</body></html>"
        ),
        text="Hi {{ first_name }}: https://shop.example.com/spring",
    )
    campaign = make_campaign(make_audience(2))
    Campaign.objects.filter(pk=campaign.pk).update(
        template=template,
        status="sending",
        fanout_done=True,
        total_count=2,
        track_opens=True,
        track_clicks=True,
    )
    messages = [
        Message.objects.create(
            campaign=campaign,
            contact=c,
            template=template,
            to_email=c.email,
            priority="normal",
            status="queued",
        )
        for c in Contact.objects.order_by("id")
    ]
    assert send_messages([m.pk for m in messages]).sent == 2
    received = {m.rcpt_tos[0]: m.parsed() for m in smtp.wait_for(2)}
    for message in messages:
        html = received[message.to_email].get_body(("html",)).get_content()
        found = TRACKED.findall(html)
        opens = [t for k, t in found if k == "o"]
        clicks = [t for k, t in found if k == "c"]
        assert [read_open_token(t) for t in opens] == [message.pk]
        assert "mailto:help@example.com" in html and "/u/" in html  # untouched, footer not tracked
        first_name = Contact.objects.get(pk=message.contact_id).attributes["first_name"]
        targets = [get(f"/t/c/{t}")["Location"] for t in clicks]
        assert targets == [
            "https://shop.example.com/spring?c=1&d=2",
            f"https://blog.example.com/{first_name}",
        ]
        assert get(f"/t/o/{opens[0]}").status_code == 200
    drain_hits()
    # Both links of each message clicked within a second of sending, and of each other: what a
    # link scanner does, so recorded and classed, never counted as a person.
    assert (
        list(EmailEvent.objects.filter(kind="clicked").values_list("classification", flat=True))
        == [SCANNER] * 4
    )
    assert EmailEvent.objects.filter(kind="opened", classification=HUMAN).count() == 2


def test_transactional_tracking_flags_and_their_reserved_keys(api, smtp: SMTPTestServer) -> None:  # noqa: ANN001
    response = api.post(
        "/api/v1/messages",
        {
            "to": "bo@example.com",
            "subject": "x",
            "html": '<a href="https://a.example/">a</a>',
            "track_clicks": True,
        },
        format="json",
    )
    assert response.status_code in (201, 202), response.content
    message = Message.objects.get(pk=response.json()["id"])
    assert (message.track_opens, message.track_clicks, message.context) == (False, True, None)
    send_messages([message.pk])
    html = smtp.wait_for(1)[0].parsed().get_body(("html",)).get_content()
    assert [k for k, _ in TRACKED.findall(html)] == ["c"]  # clicks only, no pixel
    refused = api.post(
        "/api/v1/messages",
        {"to": "bo@example.com", "subject": "x", "text": "y", "context": {"emailhub:track_opens": True}},
        format="json",
    )
    assert refused.status_code == 400
    assert Message.objects.count() == 1
