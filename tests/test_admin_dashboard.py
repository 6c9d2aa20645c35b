"""Issue 12 item 3, the admin's frame: the operator's dashboard (a campaign in flight, its rate and
ETA, the queue, providers, recent failures and bounces, the JSON it refreshes from, staff only),
failed logins throttled by django-axes, internal models hidden or read-only, "View site", and
every time shown in UTC and the operator's zone."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis as redis_lib
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Min
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from campaigns import fanout, lifecycle
from campaigns.models import Campaign, Contact
from core import redis_clients
from core.admin import zoned_text
from core.models import OutboxTask
from core.operator_zone import TIMEZONE_COOKIE
from delivery import breakers, selectors
from delivery.exceptions import ProviderUnavailable
from delivery.models import EmailEvent, Message
from delivery.providers import get_provider
from delivery.services import transitions
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from operations import dashboard
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _dashboard_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "SHARED_SECONDS", 0.0)  # every read computes (one test shares)


def _running_campaign(smtp: SMTPTestServer, size: int = 10, sent: int = 4) -> Campaign:
    """A campaign sending: fanned out, `sent` of its messages delivered through real SMTP and
    one refused permanently (550)."""
    campaign = make_campaign(make_audience(size), name="winter sale")
    lifecycle.schedule(campaign.pk, "immediate")
    fanout.fan_out(campaign.pk)
    ids = list(Message.objects.filter(campaign=campaign).order_by("id").values_list("id", flat=True))
    refused = Message.objects.get(pk=ids[sent]).to_email
    smtp.reply_for(refused, "550 5.1.1 no such user")
    send_messages(ids[: sent + 1])
    campaign.refresh_from_db()
    assert (campaign.status, campaign.sent_count, campaign.failed_count) == ("sending", sent, 1)
    return campaign


def test_dashboard_shows_a_campaign_in_flight_with_progress_queue_providers_and_failures(
    admin_client: Client,
    smtp: SMTPTestServer,
) -> None:
    campaign = _running_campaign(smtp)
    bounce = EmailEvent.objects.create(
        kind="bounced", bounce="permanent", provider="ses", recipient="gone@example.com",
        detail="General: mailbox does not exist", occurred_at=timezone.now(),
    )  # fmt: skip
    EmailEvent.objects.create(kind="opened", recipient="r1@example.com", occurred_at=timezone.now())

    page = admin_client.get("/admin/dashboard/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="dashboard"' in html and 'data-url="/admin/dashboard/data/"' in html
    bar = re.search(rf'<progress class="campaign-progress" data-campaign-id="{campaign.pk}"[^>]*>', html)
    assert bar is not None
    assert 'value="50"' in bar.group(0) and 'aria-valuenow="50"' in bar.group(0)  # (4 + 1) / 10
    row = re.search(rf'<tr class="campaign-row" data-campaign-id="{campaign.pk}">.*?</tr>', html, re.S)
    assert row is not None
    assert "winter sale" in row.group(0)
    assert '<td class="campaign-sent">4</td>' in row.group(0)
    assert '<td class="campaign-failed">1</td>' in row.group(0)
    assert '<td class="campaign-total">10</td>' in row.group(0)
    # The queue per priority: the 5 unsent messages are the normal queue's pending.
    assert re.search(r'data-priority="normal"><td>normal</td><td class="queue-pending">5</td>', html)
    assert 'data-provider="smtp"' in html and "circuit-closed" in html
    # The refused message with its last error, and the bounce (not the open).
    assert "SMTP 550 refused at recipient: 5.1.1 no such user" in html
    assert f'data-event-id="{bounce.pk}"' in html and "gone@example.com" in html
    assert "r1@example.com</td><td>" not in html.split('id="dashboard-feedback"')[1]
    assert "/static/emailhub/dashboard.js" in html


def test_dashboard_json_rate_over_the_window_and_eta(
    admin_client: Client, smtp: SMTPTestServer, redis: redis_lib.Redis
) -> None:
    campaign = _running_campaign(smtp)

    first = admin_client.get("/admin/dashboard/data/")
    assert first.status_code == 200 and first["Content-Type"] == "application/json"
    assert "no-store" in first["Cache-Control"]
    data = first.json()
    assert set(data) >= {"campaigns", "queue", "providers", "recent_failures", "recent_feedback"}
    (row,) = [c for c in data["campaigns"] if c["id"] == campaign.pk]
    assert (row["sent"], row["failed"], row["finished"], row["total"], row["remaining"]) == (4, 1, 5, 10, 5)
    assert row["percent"] == 50.0 and row["status"] == "sending" and row["fanout_done"] is True
    # No sample a second old yet: the average since the campaign started.
    assert row["rate_basis"] == "since_start" and row["rate_per_second"] > 0
    assert data["queue"]["normal"] == {"pending": 5, "processing": 0}
    assert "550" in data["recent_failures"][0]["last_error"]

    # A sample 30 s ago with 2 finished: the window rate is 3 messages / 30 s.
    key = f"emailhub:dashboard:finished:{campaign.pk}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now())")
        then = float(cursor.fetchone()[0]) - 30.0
    redis.zadd(key, {f"{then:.3f}:2": then})
    data = admin_client.get("/admin/dashboard/data/").json()
    (row,) = [c for c in data["campaigns"] if c["id"] == campaign.pk]
    generated = datetime.fromisoformat(data["generated_at"].replace("Z", "+00:00")).timestamp()
    rate = 3 / (generated - then)
    assert row["rate_basis"] == "window"
    assert row["rate_per_second"] == pytest.approx(rate, abs=0.01)
    assert row["eta_seconds"] == pytest.approx(5 / rate, abs=1)
    assert row["eta_display"] == f"{row['eta_seconds']} s"  # about 50 s
    assert redis.zcard(key) >= 3  # every read leaves its sample

    lifecycle.pause(campaign.pk)
    data = admin_client.get("/admin/dashboard/data/").json()
    (row,) = [c for c in data["campaigns"] if c["id"] == campaign.pk]
    assert row["status"] == "paused" and row["rate_per_second"] is None and row["eta_seconds"] is None


def test_viewers_share_one_computed_refresh_per_zone(
    admin_client: Client, smtp: SMTPTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = _running_campaign(smtp)
    monkeypatch.setattr(dashboard, "SHARED_SECONDS", 60.0)
    first = admin_client.get("/admin/dashboard/data/").json()
    Campaign.objects.filter(pk=campaign.pk).update(sent_count=9)
    with CaptureQueriesContext(connection) as queries:
        again = admin_client.get("/admin/dashboard/").content.decode()
    assert not [q for q in queries.captured_queries if "delivery_message" in q["sql"]]
    assert f'data-refreshed-at="{first["generated_at"]}"' in again  # the same refresh
    assert '<td class="campaign-sent">4</td>' in again
    # Another zone's display strings differ: computed apart, and it sees the new counter.
    admin_client.cookies[TIMEZONE_COOKIE] = "Asia/Tokyo"
    tokyo = admin_client.get("/admin/dashboard/data/").json()
    assert tokyo["generated_at"] != first["generated_at"] and "JST" in tokyo["generated_at_display"]
    (row,) = [c for c in tokyo["campaigns"] if c["id"] == campaign.pk]
    assert row["sent"] == 9


def _local_time_campaign(zones: list[str]) -> Campaign:
    """A local-time campaign for 9:00 on a date to come, fanned out: every message `scheduled`."""
    campaign = make_campaign(make_audience(len(zones)), name="new year")
    for zone, contact in zip(zones, Contact.objects.order_by("id"), strict=True):
        Contact.objects.filter(pk=contact.pk).update(timezone=zone)
    lifecycle.schedule(campaign.pk, "local_time", local_date=date(2031, 1, 1), local_time=time(9))
    fanout.fan_out(campaign.pk)
    return campaign


@pytest.mark.usefixtures("far_horizon")  # fixed dates years ahead
def test_a_campaign_waiting_for_its_first_due_instant_shows_when_it_sends_next_not_a_zero_rate(
    admin_client: Client, smtp: SMTPTestServer
) -> None:
    campaign = _local_time_campaign(["Asia/Tokyo", "Europe/Paris", "America/New_York"])
    first = Message.objects.filter(campaign=campaign).aggregate(first=Min("due_at"))["first"]
    assert first == datetime(2031, 1, 1, 0, tzinfo=UTC)  # 9:00 in Tokyo
    later = make_campaign(make_audience(2, name="later", prefix="l"), name="launch")
    starts = (timezone.now() + timedelta(hours=3)).replace(microsecond=0)
    lifecycle.schedule(later.pk, "at", starts)
    admin_client.cookies[TIMEZONE_COOKIE] = "Europe/Paris"

    data = admin_client.get("/admin/dashboard/data/").json()
    rows = {c["id"]: c for c in data["campaigns"]}
    with timezone.override(ZoneInfo("Europe/Paris")):
        shown = {campaign.pk: zoned_text(first), later.pk: zoned_text(starts)}
    for row, at in ((rows[campaign.pk], first), (rows[later.pk], starts)):
        assert row["waiting"] is True and row["next_send_at"] == at.isoformat().replace("+00:00", "Z")
        assert row["next_send_display"] == shown[row["id"]]
        assert row["rate_per_second"] is None and row["eta_seconds"] is None
    assert (rows[campaign.pk]["status"], rows[later.pk]["status"]) == ("sending", "scheduled")
    html = admin_client.get("/admin/dashboard/").content.decode()
    row = re.search(rf'<tr class="campaign-row" data-campaign-id="{campaign.pk}">.*?</tr>', html, re.S)
    assert row is not None
    assert f'<td class="campaign-status">waiting — next send at {shown[campaign.pk]}</td>' in row.group(0)
    assert '<td class="campaign-rate">-</td>' in row.group(0)
    assert f"waiting — next send at {shown[later.pk]}" in html

    # Its first slot goes out and a message of it is sent: sending, with a rate.
    tokyo = Message.objects.filter(campaign=campaign, due_at=first)
    transitions.queue_slot(campaign.pk, int(first.timestamp()))
    send_messages(list(tokyo.values_list("id", flat=True)))
    (row,) = [
        c for c in admin_client.get("/admin/dashboard/data/").json()["campaigns"] if c["id"] == campaign.pk
    ]
    assert row["waiting"] is False and row["next_send_at"] is None and row["finished"] == 1
    assert row["rate_per_second"] is not None


@pytest.mark.usefixtures("far_horizon")  # fixed dates years ahead
def test_the_next_due_instants_of_all_campaigns_are_one_query(django_assert_num_queries: Any) -> None:
    waiting = _local_time_campaign(["Asia/Tokyo", "Europe/London"])
    sending = make_campaign(make_audience(2, name="now", prefix="n"), name="now")
    lifecycle.schedule(sending.pk, "immediate")
    fanout.fan_out(sending.pk)
    with django_assert_num_queries(1):
        dues = selectors.next_sends([waiting.pk, sending.pk])
    assert dues == {waiting.pk: datetime(2031, 1, 1, 0, tzinfo=UTC)}


def test_the_provider_page_says_when_the_last_error_happened(admin_client: Client, settings: Any) -> None:
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    settings.EMAILHUB_PROVIDERS_BULK = ["smtp"]

    def refused() -> None:
        raise ProviderUnavailable("smtp: connection refused")

    # The circuit of smtp at this process's SMTP server, the one the page shows first.
    key = breakers.circuit_key("smtp", get_provider("smtp").endpoint)
    with pytest.raises(ProviderUnavailable):
        breakers.guarded_call(key, refused)
    circuit = breakers.snapshot(key)
    assert circuit["state"] == "closed" and circuit["last_error"] == "smtp: connection refused"
    at = datetime.fromtimestamp(circuit["last_error_at"], UTC)
    admin_client.cookies[TIMEZONE_COOKIE] = "Europe/Paris"
    with timezone.override(ZoneInfo("Europe/Paris")):
        when = zoned_text(at)

    page = admin_client.get("/admin/providers/").content.decode()
    iso = at.isoformat().replace("+00:00", "Z")
    assert (
        f'smtp: connection refused <span class="quiet">at <time class="zoned" datetime="{iso}" '
        f'title="Europe/Paris">{when}</time></span>' in page
    )
    dashboard_page = admin_client.get("/admin/dashboard/").content.decode()
    assert f"smtp: connection refused (at {when})" in dashboard_page
    (provider,) = admin_client.get("/admin/dashboard/data/").json()["providers"]
    assert provider["circuit"]["last_error_at_display"] == when


def test_eta_reads_as_a_duration() -> None:
    assert [dashboard._duration(s) for s in (45, 89.4, 720, 5399, 11_100)] == [
        "45 s", "89 s", "12 min", "90 min", "3 h 05 min",
    ]  # fmt: skip


def test_dashboard_survives_redis_being_away(
    admin_client: Client, smtp: SMTPTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = _running_campaign(smtp)
    away = redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(redis_clients, "pages", lambda: away)
    data = admin_client.get("/admin/dashboard/data/").json()
    (row,) = [c for c in data["campaigns"] if c["id"] == campaign.pk]
    assert row["rate_basis"] == "since_start"


def test_dashboard_and_its_json_are_for_staff_only(client: Client, django_user_model: type[User]) -> None:
    for url in ("/admin/dashboard/", "/admin/dashboard/data/", "/admin/timezone/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    django_user_model.objects.create_user("viewer", password="pw-not-staff-1")
    client.force_login(django_user_model.objects.get(username="viewer"))
    for url in ("/admin/dashboard/", "/admin/dashboard/data/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_every_admin_page_links_the_dashboard_and_view_site_goes_to_the_api_docs(
    admin_client: Client,
) -> None:
    html = admin_client.get("/admin/").content.decode()
    assert '<a href="/admin/dashboard/" id="nav-dashboard">Dashboard</a>' in html
    assert '<div id="site-name"><a href="/admin/">emailhub</a></div>' in html
    assert '<a href="/api/docs/">View site</a>' in html
    assert "<title>Operations | emailhub</title>" in html
    assert "/static/emailhub/admin.js" in html


# Failed logins: django-axes, by (username, IP address)


def _login(client: Client, password: str, ip: str = "10.0.0.7") -> int:
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": password, "next": "/admin/"},
        REMOTE_ADDR=ip,
    )
    return response.status_code


def test_the_sixth_wrong_password_locks_the_user_out_until_the_cool_off(
    client: Client, django_user_model: type[User], settings: Any
) -> None:
    assert settings.AXES_FAILURE_LIMIT == 5
    django_user_model.objects.create_user("operator", password="right-horse-battery", is_staff=True)
    for _ in range(4):
        assert _login(client, "wrong") == 200  # the form again, with its error
    assert _login(client, "right-horse-battery") == 302  # a success clears the failures
    client.logout()
    for _ in range(5):
        _login(client, "wrong")
    # Locked out: the right password is refused too, and no session is made.
    assert _login(client, "right-horse-battery") == 429
    refused = client.post("/admin/login/", {"username": "operator", "password": "x"}, REMOTE_ADDR="10.0.0.7")
    assert refused.status_code == 429 and "Too many failed logins" in refused.content.decode()
    assert "for <strong>operator</strong>" in refused.content.decode()
    assert client.get("/admin/").status_code == 302
    # Another address is another pair: one guesser cannot lock the operator out everywhere.
    assert _login(client, "right-horse-battery", ip="10.0.0.8") == 302
    client.logout()
    # After the cool-off the pair may log in again.
    AccessAttempt.objects.filter(username="operator").update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert _login(client, "right-horse-battery") == 302


def _login_via(client: Client, password: str, *, peer: str, forwarded_for: str) -> int:
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": password, "next": "/admin/"},
        REMOTE_ADDR=peer,
        HTTP_X_FORWARDED_FOR=forwarded_for,
    )
    return response.status_code


def test_behind_a_trusted_proxy_failures_lock_the_forwarded_client_not_the_proxy(
    client: Client, django_user_model: type[User], settings: Any
) -> None:
    settings.EMAILHUB_TRUSTED_PROXIES = ["10.0.0.0/8"]
    django_user_model.objects.create_user("operator", password="right-horse-battery", is_staff=True)
    for _ in range(5):  # one guesser, through our proxy 10.0.0.7
        _login_via(client, "wrong", peer="10.0.0.7", forwarded_for="198.51.100.1")
    assert _login_via(client, "right-horse-battery", peer="10.0.0.7", forwarded_for="198.51.100.1") == 429
    # The operator, through the same proxy, from another address: not locked out.
    assert _login_via(client, "right-horse-battery", peer="10.0.0.7", forwarded_for="198.51.100.2") == 302
    client.logout()
    # A peer we do not trust cannot pose as the operator's address (nor dodge its own lock).
    for _ in range(5):
        _login_via(client, "wrong", peer="203.0.113.5", forwarded_for="198.51.100.2")
    assert _login_via(client, "right-horse-battery", peer="203.0.113.5", forwarded_for="198.51.100.9") == 429
    assert _login_via(client, "right-horse-battery", peer="10.0.0.7", forwarded_for="198.51.100.2") == 302
    # Each pair: five wrong passwords and the refused right one.
    assert sorted(AccessAttempt.objects.values_list("ip_address", "failures_since_start")) == [
        ("198.51.100.1", 6),
        ("203.0.113.5", 6),
    ]


def test_axes_tables_are_read_only_in_the_admin(
    admin_client: Client, client: Client, django_user_model: type[User]
) -> None:
    django_user_model.objects.create_user("operator", password="right-horse-battery", is_staff=True)
    _login(client, "wrong")
    attempt = AccessAttempt.objects.get(username="operator")
    assert admin_client.get(reverse("admin:axes_accessattempt_add")).status_code == 403
    change = reverse("admin:axes_accessattempt_change", args=[attempt.pk])
    page = admin_client.get(change).content.decode()
    assert 'name="_save"' not in page and "wrong" not in page.split('id="content"')[1]  # no form data
    assert admin_client.post(change, {"username": "someone"}).status_code == 403
    assert admin_client.get(reverse("admin:axes_accesslog_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:axes_accessfailurelog_changelist")).status_code == 200


# Internal models


def test_beat_schedules_are_hidden_and_periodic_tasks_are_read_only_but_for_enabled(
    admin_client: Client,
) -> None:
    from django_celery_beat.models import PeriodicTask

    from emailhub.periodic import ensure_periodic_tasks

    ensure_periodic_tasks()
    index = admin_client.get("/admin/").content.decode()
    for model in ("intervalschedule", "crontabschedule", "solarschedule", "clockedschedule"):
        assert f"/admin/django_celery_beat/{model}/" not in index
        assert admin_client.get(f"/admin/django_celery_beat/{model}/").status_code == 404
    listing = admin_client.get(reverse("admin:django_celery_beat_periodictask_changelist")).content.decode()
    assert 'id="periodic-task-note"' in listing and "Recurring schedules</a> page" in listing
    assert admin_client.get(reverse("admin:django_celery_beat_periodictask_add")).status_code == 403
    task = PeriodicTask.objects.get(name="emailhub: relay outbox")
    change = reverse("admin:django_celery_beat_periodictask_change", args=[task.pk])
    page = admin_client.get(change).content.decode()
    assert 'name="enabled"' in page and 'name="task"' not in page and 'name="args"' not in page
    response = admin_client.post(change, {"enabled": "", "task": "evil.task", "args": "[1]", "_save": "Save"})
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.enabled, task.task, task.args) == (False, "delivery.relay_outbox", "[]")
    delete = reverse("admin:django_celery_beat_periodictask_delete", args=[task.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def test_the_outbox_is_read_only(admin_client: Client) -> None:
    event = OutboxTask.objects.create(kind="send_messages", payload={"ids": [1]})
    assert admin_client.get(reverse("admin:core_outboxtask_add")).status_code == 403
    change = reverse("admin:core_outboxtask_change", args=[event.pk])
    assert 'name="_save"' not in admin_client.get(change).content.decode()
    assert admin_client.post(change, {"kind": "x"}).status_code == 403


# Times with their zone


def test_zoned_text_shows_utc_and_the_operator_zone_across_dst_and_dates() -> None:
    winter = datetime(2026, 12, 1, 14, 3, 7, tzinfo=UTC)
    summer = datetime(2026, 7, 1, 14, 3, 7, tzinfo=UTC)
    assert zoned_text(winter) == "2026-12-01 14:03:07 UTC"  # no zone chosen: UTC only
    with timezone.override(ZoneInfo("Europe/Paris")):
        assert zoned_text(winter) == "2026-12-01 14:03:07 UTC (15:03:07 CET)"
        assert zoned_text(summer) == "2026-07-01 14:03:07 UTC (16:03:07 CEST)"
    with timezone.override(ZoneInfo("Australia/Lord_Howe")):  # +11 in December: the next day
        assert zoned_text(winter) == "2026-12-01 14:03:07 UTC (2026-12-02 01:03:07 +11)"
    assert zoned_text(None) == "-"


def test_admin_lists_and_read_only_pages_show_times_in_utc_and_the_operator_zone(
    admin_client: Client,
) -> None:
    message = Message.objects.create(
        to_email="a@example.com", subject="s", text="t", priority="high", queued_at=timezone.now()
    )
    event = EmailEvent.objects.create(
        message=message, kind="delivered", provider="ses", recipient="a@example.com",
        occurred_at=datetime(2026, 12, 1, 23, 30, tzinfo=UTC),
    )  # fmt: skip
    message.refresh_from_db()
    created = message.created_at
    queued = message.queued_at.astimezone(UTC)
    queued_paris = queued.astimezone(ZoneInfo("Europe/Paris"))
    paris = created.astimezone(ZoneInfo("Europe/Paris"))
    expected = f"{created.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({paris:%H:%M:%S} {paris.tzname()})"
    if paris.date() != created.astimezone(UTC).date():
        expected = (
            f"{created.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({paris:%Y-%m-%d %H:%M:%S} {paris.tzname()})"
        )
    admin_client.cookies[TIMEZONE_COOKIE] = "Europe/Paris"

    listing = admin_client.get(reverse("admin:delivery_message_changelist")).content.decode()
    assert expected in listing and '<time class="zoned"' in listing
    assert "Times: UTC + Europe/Paris" in listing
    page = admin_client.get(reverse("admin:delivery_message_change", args=[message.pk])).content.decode()
    # A read-only field (every field of a message is).
    assert (
        f'<time class="zoned" datetime="{queued.isoformat().replace("+00:00", "Z")}" title="Europe/Paris">'
        in page
    )
    assert f"{queued:%Y-%m-%d %H:%M:%S} UTC ({queued_paris:%H:%M:%S} {queued_paris.tzname()})" in page or (
        queued_paris.date() != queued.date()
    )
    # The events inline's read-only times too (the next day in Paris).
    assert "2026-12-01 23:30:00 UTC (2026-12-02 00:30:00 CET)" in page
    assert event.pk
    # Sorting by the zoned column still sorts by the field.
    assert admin_client.get(reverse("admin:delivery_message_changelist") + "?o=7").status_code == 200


def test_the_operator_picks_a_zone_and_a_bad_one_is_refused(admin_client: Client) -> None:
    response = admin_client.post("/admin/timezone/", {"timezone": "America/New_York", "next": "/admin/"})
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert response.cookies[TIMEZONE_COOKIE].value == "America/New_York"
    page = admin_client.get("/admin/timezone/").content.decode()
    assert 'value="America/New_York" selected' in page and "UTC (" in page
    bad = admin_client.post("/admin/timezone/", {"timezone": "Mars/Olympus"})
    assert bad.status_code == 400 and TIMEZONE_COOKIE not in bad.cookies
    off_site = admin_client.post("/admin/timezone/", {"timezone": "UTC", "next": "https://evil.example/"})
    assert off_site["Location"] == "/admin/timezone/"
    # An unknown zone in the cookie (hand-edited) is ignored: UTC only.
    admin_client.cookies[TIMEZONE_COOKIE] = "Nowhere/Special"
    assert "Times: UTC</a>" in admin_client.get("/admin/").content.decode()


def test_the_api_writes_utc_whatever_zone_cookie_a_browser_sends(api) -> None:  # noqa: ANN001
    message = Message.objects.create(to_email="a@example.com", subject="s", text="t", priority="high")
    api.cookies[TIMEZONE_COOKIE] = "Asia/Tokyo"
    body = api.get(f"/api/v1/messages/{message.pk}").json()
    assert body["created_at"].endswith("Z")
