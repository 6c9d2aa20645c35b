"""campaigns.engagement: the set-based profile refresh against the real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from campaigns import engagement
from campaigns.models import Contact, EngagementPopulation, EngagementProfile
from delivery.models import EmailEvent, Message
from tests import factories

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def engagement_settings(settings):  # noqa: ANN001, ANN201
    settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS = 0
    settings.EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS = 30
    settings.EMAILHUB_ENGAGEMENT_CLICK_WEIGHT = 2.0
    settings.EMAILHUB_ENGAGEMENT_OPEN_WEIGHT = 1.0
    settings.EMAILHUB_STO_PRIOR_STRENGTH = 5.0
    settings.EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES = 60
    settings.EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT = 0.2
    return settings


def contact(email: str, tz: str = "UTC") -> Contact:
    return factories.contact(email, timezone=tz)


def hits(
    who: Contact, instants: Iterable[datetime], *, kind: str = "opened", classification: str = "human"
) -> None:
    EmailEvent.objects.bulk_create(
        EmailEvent(kind=kind, classification=classification, recipient=who.email, occurred_at=at)
        for at in instants
    )


def profile(who: Contact) -> EngagementProfile:
    return EngagementProfile.objects.get(contact=who)


def nonzero_bins(who: Contact) -> dict[int, float]:
    return {h: w for h, w in enumerate(profile(who).histogram) if w > 0}


def refresh(now: datetime | None = None, **kwargs) -> engagement.RefreshReport:  # noqa: ANN003
    # `now` after every created_at, so the settle cutoff (0 s here) lets every event in.
    return engagement.refresh_profiles(now=now or timezone.now() + timedelta(seconds=1), **kwargs)


def test_opens_land_in_the_contacts_local_hour_across_dst_changes() -> None:
    new_york = contact("ny@example.com", "America/New_York")
    lord_howe = contact("lh@example.com", "Australia/Lord_Howe")
    # New York springs forward on 8 March 2026: 13:30 UTC is 08:30 EST before, 09:30 EDT after.
    ny_hits = [datetime(2026, 3, 7, 13, 30, tzinfo=UTC), datetime(2026, 3, 9, 12, 30, tzinfo=UTC)]
    # Lord Howe falls back half an hour on 5 April 2026 (UTC+11 → UTC+10:30): 22:20 UTC is 09:20
    # local before and 08:50 after; a fixed offset would put both in the same bin.
    lh_hits = [datetime(2026, 4, 3, 22, 20, tzinfo=UTC), datetime(2026, 4, 6, 22, 20, tzinfo=UTC)]
    hits(new_york, ny_hits)
    hits(lord_howe, lh_hits)
    now = max(timezone.now() + timedelta(seconds=1), datetime(2026, 4, 7, tzinfo=UTC))
    refresh(now)

    assert [at.astimezone(ZoneInfo("America/New_York")).hour for at in ny_hits] == [8, 8]
    assert set(nonzero_bins(new_york)) == {8}
    assert [at.astimezone(ZoneInfo("Australia/Lord_Howe")).hour for at in lh_hits] == [9, 8]
    assert set(nonzero_bins(lord_howe)) == {8, 9}
    # Each weight decayed from its instant to the refresh: 2^(-age / 30 days).
    for at in lh_hits:
        local_hour = at.astimezone(ZoneInfo("Australia/Lord_Howe")).hour
        expected = 2 ** (-(now - at).total_seconds() / (30 * 86400))
        assert nonzero_bins(lord_howe)[local_hour] == pytest.approx(expected)


def test_clicks_weigh_more_than_opens_and_only_opens_and_clicks_count() -> None:
    ann = contact("ann@example.com")
    now = timezone.now() + timedelta(seconds=1)
    at = now.replace(hour=14, minute=0, second=0, microsecond=0)
    if at + 3 * HOUR > now:  # every event in the past (a future one is not decayed: factor 1)
        at -= DAY
    hits(ann, [at], kind="opened")
    hits(ann, [at + HOUR], kind="clicked")
    hits(ann, [at + 2 * HOUR], kind="delivered")
    hits(ann, [at + 3 * HOUR], kind="bounced")
    refresh(now)
    factor = 2 ** (-(now - at).total_seconds() / (30 * 86400))
    bins = nonzero_bins(ann)
    assert set(bins) == {14, 15}
    assert bins[14] == pytest.approx(1.0 * factor)
    assert bins[15] == pytest.approx(2.0 * factor * 2 ** (3600 / (30 * 86400)))


def test_machine_proxy_bot_and_scanner_hits_never_change_a_best_hour() -> None:
    ann = contact("ann@example.com")
    base = (timezone.now() - 5 * DAY).replace(hour=20, minute=15, second=0, microsecond=0)
    hits(ann, [base - i * DAY for i in range(6)])
    refresh()
    before = profile(ann)
    assert before.best_hour == 20
    population_before = EngagementPopulation.objects.get().histogram

    # Apple MPP fetches every message at delivery (03:00 here), dozens of times.
    for classification in ("machine", "proxy", "bot", "scanner", ""):
        hits(ann, [base.replace(hour=3) - i * DAY for i in range(12)], classification=classification)
        hits(
            ann,
            [base.replace(hour=3) - i * DAY for i in range(12)],
            kind="clicked",
            classification=classification,
        )
    report = refresh()
    after = profile(ann)
    assert after.best_hour == 20
    assert set(nonzero_bins(ann)) == {20}
    assert after.histogram == pytest.approx(before.histogram, rel=1e-3)  # only decayed a moment
    assert EngagementPopulation.objects.get().histogram == pytest.approx(population_before, rel=1e-3)
    assert report.last_event_id == EmailEvent.objects.order_by("-id").first().id  # looked at, skipped


def test_a_habit_that_moved_from_8_to_20_flips_the_best_hour_with_decay() -> None:
    ann = contact("ann@example.com", "Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    start = timezone.now().astimezone(berlin)
    old = [(start - (120 - i) * DAY).replace(hour=8, minute=20) for i in range(0, 30, 1)]
    hits(ann, old)
    refresh()
    assert profile(ann).best_hour == 8

    # Later, evenings: fewer events than the old habit (12 vs 30), but recent.
    later = start + 100 * DAY
    new = [(later - i * DAY).replace(hour=20, minute=40) for i in range(12, 0, -1)]
    hits(ann, new)
    refresh(later.astimezone(UTC) + timedelta(seconds=1))
    assert profile(ann).best_hour == 20
    bins = nonzero_bins(ann)
    assert bins[20] > bins[8] > 0


def test_without_decay_the_old_habit_would_have_won(engagement_settings) -> None:  # noqa: ANN001
    engagement_settings.EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS = 1_000_000
    ann = contact("ann@example.com", "Europe/Berlin")
    start = timezone.now().astimezone(ZoneInfo("Europe/Berlin"))
    hits(ann, [(start - (120 - i) * DAY).replace(hour=8, minute=20) for i in range(30)])
    refresh()
    later = start + 100 * DAY
    hits(ann, [(later - i * DAY).replace(hour=20, minute=40) for i in range(12, 0, -1)])
    refresh(later.astimezone(UTC) + timedelta(seconds=1))
    assert profile(ann).best_hour == 8


def test_campaign_events_map_by_contact_and_transactional_ones_by_address() -> None:
    ann = contact("ann@example.com")
    bob = contact("bob@example.com")
    # A campaign message to Ann whose event carries another address (the provider's view).
    message = Message.objects.create(to_email="old-ann@example.com", subject="s", text="t", contact=ann)
    at = datetime(2026, 6, 1, 7, 30, tzinfo=UTC)
    EmailEvent.objects.create(
        message=message,
        kind="opened",
        classification="human",
        recipient="old-ann@example.com",
        occurred_at=at,
    )
    # A transactional message (no contact) to Bob, and an event for nobody we know.
    EmailEvent.objects.create(
        kind="clicked", classification="human", recipient="bob@example.com", occurred_at=at
    )
    EmailEvent.objects.create(
        kind="opened", classification="human", recipient="zed@example.com", occurred_at=at
    )
    refresh()
    assert set(nonzero_bins(ann)) == {7}
    assert set(nonzero_bins(bob)) == {7}
    assert EngagementProfile.objects.count() == 2


def test_population_is_the_sum_of_profiles_and_a_second_refresh_adds_nothing() -> None:
    people = [
        contact(f"p{i}@example.com", tz) for i, tz in enumerate(["UTC", "Asia/Tokyo", "America/Denver"])
    ]
    base = timezone.now() - 3 * DAY
    for i, who in enumerate(people):
        hits(who, [base + i * HOUR + j * DAY for j in range(i + 1)])
    now = timezone.now() + timedelta(seconds=1)
    refresh(now)
    population = EngagementPopulation.objects.get()
    sums = [sum(p.histogram[h] for p in EngagementProfile.objects.all()) for h in range(24)]
    assert population.histogram == pytest.approx(sums)
    assert population.decayed_at == now
    assert population.last_event_id == EmailEvent.objects.order_by("-id").first().id

    report = refresh(now)
    assert report.contacts == 0
    assert EngagementPopulation.objects.get().histogram == pytest.approx(sums)


def test_steps_fold_the_same_as_one_statement() -> None:
    ann = contact("ann@example.com", "Asia/Kolkata")
    base = timezone.now() - 10 * DAY
    hits(ann, [base + i * 7 * HOUR for i in range(25)])
    now = timezone.now() + timedelta(seconds=1)
    one = refresh(now)
    whole = profile(ann).histogram
    EngagementProfile.objects.all().delete()
    EngagementPopulation.objects.all().delete()
    stepped = refresh(now, step=4)
    assert (one.steps, stepped.steps) == (2, 8)  # the last step of each finds nothing new
    assert profile(ann).histogram == pytest.approx(whole)


def test_unsettled_events_wait_for_the_next_refresh(engagement_settings) -> None:  # noqa: ANN001
    engagement_settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS = 30
    ann = contact("ann@example.com")
    hits(ann, [timezone.now() - HOUR])
    report = engagement.refresh_profiles(now=timezone.now())
    assert report.contacts == 0
    assert report.last_event_id < EmailEvent.objects.get().id  # the watermark stops before it
    assert not EngagementProfile.objects.exists()
    engagement.refresh_profiles(now=timezone.now() + timedelta(seconds=31))
    assert profile(ann).best_hour is not None


def query_count_for(contacts: int, prefix: str) -> int:
    people = Contact.objects.bulk_create(Contact(email=f"{prefix}{i}@example.com") for i in range(contacts))
    base = timezone.now() - DAY
    EmailEvent.objects.bulk_create(
        EmailEvent(
            kind="opened", classification="human", recipient=p.email, occurred_at=base + (i % 24) * HOUR
        )
        for i, p in enumerate(people)
        for _ in range(2)
    )
    with CaptureQueriesContext(connection) as queries:
        refresh()
    assert EngagementProfile.objects.filter(contact__email__startswith=prefix).count() == contacts
    return len(queries)


def test_the_refresh_is_set_based_its_query_count_does_not_grow_with_contacts() -> None:
    assert query_count_for(5, "a") == query_count_for(400, "b")


def test_best_hours_for_a_fanout_step_honour_the_window() -> None:
    ann = contact("ann@example.com")
    bob = contact("bob@example.com")  # no history
    base = (timezone.now() - 5 * DAY).replace(hour=3, minute=10)
    hits(ann, [base - i * DAY for i in range(10)])
    hits(ann, [(base - i * DAY).replace(hour=23) for i in range(4)])
    refresh()
    assert profile(ann).best_hour == 3
    assert engagement.best_hours([ann.pk, bob.pk]) == {ann.pk: 3, bob.pk: 3}
    window = (20, 21, 22, 23, 0, 1)  # 20:00 .. 01:59, wrapping midnight
    assert engagement.best_hours([ann.pk, bob.pk], window) == {ann.pk: 23, bob.pk: 23}
    assert engagement.best_hours([bob.pk], range(12, 14)) == {bob.pk: 12}


def test_a_hit_right_after_the_send_counts_less_than_one_read_later() -> None:
    ann = contact("ann@example.com")
    sent = (timezone.now() - 2 * DAY).replace(hour=10, minute=0, second=0, microsecond=0)
    message = Message.objects.create(to_email=ann.email, subject="s", text="t", contact=ann, sent_at=sent)
    for at in (sent + timedelta(minutes=5), sent + 9 * HOUR):  # on arrival; in the evening
        EmailEvent.objects.create(
            message=message, kind="opened", classification="human", recipient=ann.email, occurred_at=at
        )
    now = timezone.now() + timedelta(seconds=1)
    refresh(now)
    bins = nonzero_bins(ann)
    decay = 2 ** (-(now - sent).total_seconds() / (30 * 86400))
    assert bins[10] == pytest.approx(0.2 * decay, rel=1e-3)
    assert bins[19] == pytest.approx(1.0 * decay * 2 ** (9 * 3600 / (30 * 86400)), rel=1e-3)


def profile_writes() -> tuple[int, int]:
    """Rows inserted and updated in campaigns_engagementprofile by this (test) transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            ["campaigns_engagementprofile"],
        )
        return cursor.fetchone()


def test_a_backlog_of_many_steps_writes_each_touched_profile_once() -> None:
    # A backlog costs one write per contact, not one per contact per step (the 1M-contact
    # refresh spent most of its 668 s rewriting the same profiles step after step).
    people = [contact(f"w{i}@example.com", "Europe/Paris") for i in range(3)]
    base = timezone.now() - 10 * DAY
    for i, who in enumerate(people):
        hits(who, [base + (i + j * 5) * HOUR for j in range(10)])
    before = profile_writes()
    report = refresh(step=4)
    inserted, updated = (a - b for a, b in zip(profile_writes(), before, strict=True))
    assert report.steps == 9  # 30 events in steps of 4, then the empty one
    assert (inserted, updated) == (3, 0)
    assert all(p.best_hour is not None for p in EngagementProfile.objects.all())


def test_best_hours_stored_by_the_refresh_are_the_estimators_answers() -> None:
    # The refresh chooses best hours in SQL; they must be exactly besthour.best_hour's, ties
    # (to the earliest hour) included.
    import random

    from campaigns.besthour import best_hour

    rng = random.Random(11)
    base = timezone.now() - 20 * DAY
    zones = ["UTC", "Asia/Kathmandu", "America/New_York", "Australia/Lord_Howe"]
    for i in range(40):
        who = contact(f"b{i}@example.com", zones[i % len(zones)])
        hits(who, [base + timedelta(minutes=rng.randrange(20 * 24 * 60)) for _ in range(rng.randrange(1, 6))])
        if i % 3 == 0:
            hits(who, [base + timedelta(hours=rng.randrange(480))], kind="clicked")
    tied = contact("tied@example.com")  # one open at 05:00 and one at 07:00: 06:00 scores most
    hits(tied, [base.replace(hour=5, minute=0), base.replace(hour=7, minute=0)])
    refresh()
    population = EngagementPopulation.objects.get().histogram
    profiles = list(EngagementProfile.objects.all())
    assert len(profiles) == 41
    for p in profiles:
        assert p.best_hour == best_hour(p.histogram, population, k=5.0), p.contact_id
