"""`optimized` campaigns: schedule validation, due instants computed in SQL from each contact's
stored best hour (across DST changes), the holdout, few dispatch units, and the report."""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta
from math import sqrt
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns import fanout, lifecycle
from campaigns.besthour import best_hour
from campaigns.models import Campaign, Contact, EngagementPopulation, EngagementProfile
from campaigns.reporting import newcombe_difference, wilson
from core import schedule_index
from delivery.models import EmailEvent, Message
from delivery.services import transitions
from tests.factories import make_audience, make_campaign


def _first_instant(tz_name: str, hour: int, start: datetime, hours: int) -> datetime | None:
    """Brute force, independent of campaigns.optimized: walk the window minute by minute and
    take the first instant whose local wall time is `hour`:00 (or the window's start, if its
    local hour is `hour`)."""
    tz = ZoneInfo(tz_name)
    t = start
    while t < start + timedelta(hours=hours):
        local = t.astimezone(tz)
        if local.hour == hour and (t == start or local.minute == 0):
            return t
        t += timedelta(minutes=1) if t != start else timedelta(seconds=60 - start.second)
    return None


def _in_holdout(campaign_id: int, contact_id: int, percent: int) -> bool:
    return int(hashlib.md5(f"{campaign_id}:{contact_id}".encode()).hexdigest()[:8], 16) % 100 < percent


def _population(peak: int) -> list[float]:
    return [10.0 if hour == peak else 1.0 + hour / 100 for hour in range(24)]


# --- schedule validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"window_start": "2020-01-01T00:00:00Z"}, "window_start"),
        ({"window_hours": 0}, "window_hours"),
        ({"window_hours": 169}, "window_hours"),
        ({"holdout_percent": 51}, "holdout_percent"),
        ({"holdout_percent": -1}, "holdout_percent"),
        ({"window_hours": "many"}, "window_hours"),
    ],
)
def test_bad_optimized_schedule_is_a_400_naming_the_field_and_changes_nothing(
    api: APIClient, body: dict, field: str
) -> None:
    campaign = make_campaign(make_audience(3))
    response = api.post(
        f"/api/v1/campaigns/{campaign.pk}/schedule", {"type": "optimized", **body}, format="json"
    )
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    campaign.refresh_from_db()
    assert campaign.status == "draft" and campaign.window_start is None
    assert not Message.objects.exists()


def test_optimized_schedule_defaults_to_now_24_hours_and_10_percent(api: APIClient) -> None:
    campaign = make_campaign(make_audience(3))
    before = timezone.now().replace(microsecond=0)
    response = api.post(f"/api/v1/campaigns/{campaign.pk}/schedule", {"type": "optimized"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "sending" and body["schedule_type"] == "optimized"
    assert body["window_hours"] == 24 and body["holdout_percent"] == 10
    campaign.refresh_from_db()
    assert before <= campaign.window_start <= timezone.now()


# --- due instants -----------------------------------------------------------------------------


ZONES = ("America/New_York", "Australia/Lord_Howe")
# Windows that span a DST change: New York falls back on 2030-11-03 (01:00 happens twice) and
# springs forward on 2030-03-10 (02:00 does not exist); Lord Howe moves by 30 minutes on
# 2030-04-07 (back) and 2030-10-06 (forward).
WINDOWS = [
    (datetime(2030, 11, 2, 15, 17, 30, tzinfo=UTC), 48),
    (datetime(2030, 3, 9, 12, 0, tzinfo=UTC), 60),
    (datetime(2030, 4, 6, 5, 45, tzinfo=UTC), 30),
    (datetime(2030, 10, 5, 12, 0, tzinfo=UTC), 6),
]


@pytest.mark.usefixtures("far_horizon")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("start", "hours"), WINDOWS)
def test_due_instants_in_the_database_are_each_contacts_best_hour_in_the_window(
    start: datetime, hours: int
) -> None:
    population_peak = 7
    population = _population(population_peak)
    EngagementPopulation.objects.create(histogram=population, decayed_at=start)
    audience = make_audience(60)
    contacts = list(Contact.objects.filter(lists=audience).order_by("id"))
    best: dict[int, int | None] = {}
    for index, contact in enumerate(contacts):
        contact.timezone = ZONES[index % 2]
        contact.save(update_fields=["timezone"])
        # 0..23 for most contacts (1 and 2: the DST hours), no profile for every sixth.
        hour = None if index % 6 == 5 else (index * 5) % 24
        best[contact.pk] = hour
        if hour is not None:
            EngagementProfile.objects.create(
                contact=contact, histogram=[0.0] * 24, decayed_at=start, best_hour=hour
            )
    campaign = make_campaign(audience)
    lifecycle.schedule(campaign.pk, "optimized", window_start=start, window_hours=hours, holdout_percent=0)
    fanout.fan_out(campaign.pk)

    rows = list(Message.objects.filter(campaign=campaign).select_related("contact"))
    assert len(rows) == 60 and {m.status for m in rows} == {"scheduled"}
    for message in rows:
        tz = message.contact.timezone
        expected = (
            _first_instant(tz, best[message.contact_id], start, hours)
            if best[message.contact_id] is not None
            else None
        )
        if expected is None:  # no profile, or its hour is not in the window: the population's
            allowed = [h for h in range(24) if _first_instant(tz, h, start, hours) is not None]
            allowed.sort(key=lambda h: _first_instant(tz, h, start, hours))
            fallback = best_hour(None, population, k=settings.EMAILHUB_STO_PRIOR_STRENGTH, window=allowed)
            expected = _first_instant(tz, fallback, start, hours)
        assert message.due_at == expected, (tz, best[message.contact_id], message.due_at, expected)
        assert start <= message.due_at < start + timedelta(hours=hours)


@pytest.mark.usefixtures("far_horizon")
@pytest.mark.django_db(transaction=True)
def test_fall_back_hour_takes_its_first_occurrence_and_a_missing_hour_the_next_day() -> None:
    audience = make_audience(2)
    one, two = Contact.objects.filter(lists=audience).order_by("id")
    Contact.objects.filter(pk__in=[one.pk, two.pk]).update(timezone="America/New_York")
    EngagementProfile.objects.create(
        contact=one, histogram=[0.0] * 24, decayed_at=timezone.now(), best_hour=1
    )
    EngagementProfile.objects.create(
        contact=two, histogram=[0.0] * 24, decayed_at=timezone.now(), best_hour=2
    )
    # Fall back 2030-11-03: 01:00 EDT is 05:00 UTC (01:00 EST, 06:00 UTC, is the second one).
    campaign = make_campaign(audience, name="fall")
    start = datetime(2030, 11, 3, 0, 0, tzinfo=UTC)
    lifecycle.schedule(campaign.pk, "optimized", window_start=start, window_hours=24, holdout_percent=0)
    fanout.fan_out(campaign.pk)
    dues = dict(Message.objects.filter(campaign=campaign).values_list("contact_id", "due_at"))
    assert dues[one.pk] == datetime(2030, 11, 3, 5, 0, tzinfo=UTC)
    assert dues[two.pk] == datetime(2030, 11, 3, 7, 0, tzinfo=UTC)  # 02:00 EST
    # Spring forward 2030-03-10: 02:00 does not exist that day; the next day's 02:00 EDT is in the window.
    spring = make_campaign(audience, name="spring2")
    start = datetime(2030, 3, 10, 5, 0, tzinfo=UTC)
    lifecycle.schedule(spring.pk, "optimized", window_start=start, window_hours=30, holdout_percent=0)
    fanout.fan_out(spring.pk)
    dues = dict(Message.objects.filter(campaign=spring).values_list("contact_id", "due_at"))
    assert dues[two.pk] == datetime(2030, 3, 11, 6, 0, tzinfo=UTC)


# --- holdout and dispatch units ---------------------------------------------------------------


def _spread_audience(size: int, zones: list[str], seed: int) -> list[Contact]:
    rng = random.Random(seed)
    audience = make_audience(size)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE campaigns_contact SET timezone = (%s::text[])[1 + id %% %s]"
            " WHERE id IN (SELECT contact_id FROM campaigns_listmembership WHERE contact_list_id = %s)",
            [zones, len(zones), audience.pk],
        )
    contacts = list(Contact.objects.filter(lists=audience))
    EngagementProfile.objects.bulk_create(
        EngagementProfile(
            contact=c, histogram=[0.0] * 24, decayed_at=timezone.now(), best_hour=rng.randrange(24)
        )
        for c in contacts
    )
    return contacts


MANY_ZONES = [
    "UTC", "Europe/London", "Europe/Berlin", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Tokyo",
    "Australia/Adelaide", "Australia/Lord_Howe", "Pacific/Chatham", "America/New_York",
    "America/Los_Angeles", "America/St_Johns", "America/Sao_Paulo", "Africa/Lagos", "Asia/Tehran",
    "Pacific/Kiritimati", "Pacific/Honolulu", "Asia/Shanghai", "Europe/Moscow", "America/Caracas",
]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_holdout_share_is_due_at_the_window_start_and_chosen_by_the_stable_hash(redis) -> None:  # noqa: ANN001
    _spread_audience(2000, MANY_ZONES, seed=1)
    campaign = make_campaign(Contact.objects.first().lists.first())
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    lifecycle.schedule(campaign.pk, "optimized", window_start=start, holdout_percent=10)
    fanout.fan_out(campaign.pk)
    rows = list(Message.objects.filter(campaign=campaign).values_list("contact_id", "due_at"))
    held = [contact for contact, _ in rows if _in_holdout(campaign.pk, contact, 10)]
    assert all(due == start for contact, due in rows if _in_holdout(campaign.pk, contact, 10))
    # Binomial(2000, 0.1): sd 13.4, so 150..250 is beyond 3.7 sd either way.
    assert 150 <= len(held) <= 250
    # The optimized group spreads over the window (its best hours were random).
    assert len({due for contact, due in rows if not _in_holdout(campaign.pk, contact, 10)}) > 24


@pytest.mark.django_db(transaction=True)
def test_an_optimized_campaign_is_a_few_slot_units_not_one_per_message(redis) -> None:  # noqa: ANN001
    _spread_audience(3000, MANY_ZONES, seed=2)
    campaign = make_campaign(Contact.objects.first().lists.first())
    lifecycle.schedule(campaign.pk, "optimized", window_hours=168)
    fanout.fan_out(campaign.pk, step_size=500)  # several steps, each indexing the same units
    units = {m.decode() for m in redis.zrange(schedule_index.DUE, 0, -1)}
    mine = {u for u in units if u.startswith(f"c:{campaign.pk}:")}
    dues = set(Message.objects.filter(campaign=campaign).values_list("due_at", flat=True))
    assert {f"c:{campaign.pk}:{int(d.timestamp())}" for d in dues} <= mine
    # 168 hours × a few distinct offsets (:00, :30, :45) + the window start, not 3000.
    assert len(mine) < 600 and not any(u.startswith("m:") for u in units)
    # A slot dispatches its messages: the first one queues exactly the messages due then.
    first = min(dues)
    queued = transitions.queue_slot(campaign.pk, int(first.timestamp()))
    assert len(queued) == Message.objects.filter(campaign=campaign, due_at=first).count() > 0


# --- report ----------------------------------------------------------------------------------


def _wilson_by_quadratic(x: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's interval as the roots of (p̂ - p)² = z² p (1 - p) / n (not reporting's formula)."""
    phat = x / n
    a = 1 + z * z / n
    b = -(2 * phat + z * z / n)
    c = phat * phat
    root = sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def test_newcombe_interval_matches_the_published_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, Table II example (a): 56/70 - 48/80,
    # method 10: 0.0524 to 0.3339; Wilson for 56/70: 0.6918 to 0.8770.
    low, high = newcombe_difference(56, 70, 48, 80)
    assert round(low, 4) == 0.0524 and round(high, 4) == 0.3339
    assert tuple(round(v, 4) for v in wilson(56, 70)) == (0.6918, 0.8770)


@pytest.mark.django_db(transaction=True)
def test_report_gives_human_rates_other_hits_apart_and_the_lift_with_its_interval(api: APIClient) -> None:
    audience = make_audience(400)
    campaign = make_campaign(audience)
    lifecycle.schedule(campaign.pk, "optimized", holdout_percent=50)
    fanout.fan_out(campaign.pk)
    messages = list(Message.objects.filter(campaign=campaign).order_by("id"))
    treated = [m for m in messages if not _in_holdout(campaign.pk, m.contact_id, 50)]
    held = [m for m in messages if _in_holdout(campaign.pk, m.contact_id, 50)]
    n1, n2 = len(treated) - 5, len(held)  # five optimized messages failed: not sent
    now = timezone.now()
    x1, x2, c1, c2 = 60, 35, 20, 8
    with connection.cursor() as cursor:  # test data: the send and tracking paths are tested elsewhere
        cursor.execute(
            "UPDATE delivery_message SET status = 'sent', sent_at = now() WHERE campaign_id = %s",
            [campaign.pk],
        )
        cursor.execute(
            "UPDATE delivery_message SET status = 'failed' WHERE id = ANY(%s)", [[m.id for m in treated[-5:]]]
        )
        for group, opens, clicks in ((treated, x1, c1), (held, x2, c2)):
            cursor.execute(
                "UPDATE delivery_message SET first_opened_at = now() WHERE id = ANY(%s)",
                [[m.id for m in group[:opens]]],
            )
            # Clicks: the first few openers, plus one click with no open (images blocked).
            ids = [m.id for m in group[: clicks - 1]] + [group[opens].id]
            cursor.execute("UPDATE delivery_message SET first_clicked_at = now() WHERE id = ANY(%s)", [ids])
    x1, x2 = x1 + 1, x2 + 1  # the click-only message counts as opened
    events = []
    for message in messages[:30]:
        events.append(EmailEvent(message=message, kind="delivered", occurred_at=now))
    for cls, kind, count in (("machine", "opened", 7), ("proxy", "opened", 4), ("bot", "clicked", 3),
                             ("scanner", "clicked", 2), ("human", "opened", 5)):  # fmt: skip
        events += [
            EmailEvent(message=messages[i], kind=kind, classification=cls, occurred_at=now)
            for i in range(count)
        ]
    EmailEvent.objects.bulk_create(events)
    Campaign.objects.filter(pk=campaign.pk).update(bounced_count=2, complained_count=1, unsubscribed_count=3)

    response = api.get(f"/api/v1/campaigns/{campaign.pk}/report")
    assert response.status_code == 200
    report = response.json()
    assert report["sent"] == n1 + n2 and report["delivered"] == 30
    assert report["opened"] == x1 + x2 and report["open_rate"] == (x1 + x2) / (n1 + n2)
    assert report["clicked"] == c1 + c2 and report["click_rate"] == (c1 + c2) / (n1 + n2)
    assert report["open_hits"] == {
        "human": 5,
        "machine": 7,
        "proxy": 4,
        "bot": 0,
        "scanner": 0,
        "unclassified": 0,
    }
    assert report["click_hits"] == {
        "human": 0,
        "machine": 0,
        "proxy": 0,
        "bot": 3,
        "scanner": 2,
        "unclassified": 0,
    }
    assert (report["bounced"], report["complained"], report["unsubscribed"]) == (2, 1, 3)
    lift = report["lift"]
    assert lift["optimized"]["sent"] == n1 and lift["holdout"]["sent"] == n2
    assert lift["optimized"]["open_rate"] == x1 / n1 and lift["holdout"]["open_rate"] == x2 / n2
    p1, p2 = x1 / n1, x2 / n2
    assert lift["open_rate"]["difference"] == pytest.approx(p1 - p2)
    assert lift["open_rate"]["ratio"] == pytest.approx(p1 / p2)
    z = 1.959963984540054
    l1, u1 = _wilson_by_quadratic(x1, n1, z)
    l2, u2 = _wilson_by_quadratic(x2, n2, z)
    low = p1 - p2 - sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = p1 - p2 + sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    assert lift["open_rate"]["difference_ci95"] == pytest.approx([low, high], abs=1e-9)
    spread = z * sqrt(1 / x1 - 1 / n1 + 1 / x2 - 1 / n2)
    assert lift["open_rate"]["ratio_ci95"] == pytest.approx(
        [p1 / p2 / 2.718281828459045**spread, p1 / p2 * 2.718281828459045**spread]
    )
    assert lift["click_rate"]["difference"] == pytest.approx(c1 / n1 - c2 / n2)


def test_report_of_an_unknown_campaign_is_a_404(api: APIClient) -> None:
    assert api.get("/api/v1/campaigns/999999/report").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_report_of_an_immediate_campaign_has_no_lift(api: APIClient) -> None:
    campaign = make_campaign(make_audience(5))
    lifecycle.schedule(campaign.pk, "immediate")
    report = api.get(f"/api/v1/campaigns/{campaign.pk}/report").json()
    assert report["lift"] is None and report["sent"] == 0 and report["open_rate"] is None


@pytest.mark.django_db(transaction=True)
def test_admin_sends_a_draft_optimized_and_its_page_shows_the_lift(admin_client) -> None:  # noqa: ANN001
    campaign = make_campaign(make_audience(20))
    Campaign.objects.filter(pk=campaign.pk).update(window_hours=12, holdout_percent=20)
    response = admin_client.post(
        "/admin/campaigns/campaign/", {"action": "send_optimized", "_selected_action": [campaign.pk]}
    )
    assert response.status_code == 302
    campaign.refresh_from_db()
    assert (campaign.status, campaign.schedule_type, campaign.window_hours, campaign.holdout_percent) == (
        "sending", "optimized", 12, 20,
    )  # fmt: skip
    page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert "Open-rate lift" in page and "Holdout (20%)" in page and "Newcombe" in page
