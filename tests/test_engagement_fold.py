"""campaigns.engagement's one-pass fold: the bulk plan, folds of a long backlog, the step count
around skipped ids, and the profile's key without a database foreign key."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from campaigns import engagement
from campaigns.models import Contact, EngagementPopulation, EngagementProfile
from delivery.models import EmailEvent

pytestmark = pytest.mark.django_db

ZONES = ["UTC", "Australia/Lord_Howe", "America/New_York", "Asia/Kathmandu", "Not/AZone"]


@pytest.fixture(autouse=True)
def engagement_settings(settings):  # noqa: ANN001, ANN201
    settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS = 0
    settings.EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS = 30
    settings.EMAILHUB_STO_PRIOR_STRENGTH = 5.0
    return settings


def population(seed: int = 3, contacts: int = 30) -> list[Contact]:
    rng = random.Random(seed)
    people = [
        Contact.objects.create(email=f"f{i}@example.com", timezone=ZONES[i % len(ZONES)])
        for i in range(contacts)
    ]
    base = timezone.now() - timedelta(days=60)
    EmailEvent.objects.bulk_create(
        EmailEvent(
            kind=rng.choice(["opened", "opened", "clicked"]),
            classification=rng.choice(["human", "human", "human", "machine"]),
            recipient=who.email,
            occurred_at=base + timedelta(minutes=rng.randrange(60 * 24 * 60)),
        )
        for who in people
        for _ in range(rng.randrange(1, 9))
    )
    return people


def snapshot() -> tuple[dict[int, tuple[list[float], int | None]], list[float]]:
    profiles = {p.contact_id: (p.histogram, p.best_hour) for p in EngagementProfile.objects.all()}
    return profiles, EngagementPopulation.objects.get().histogram


def reset() -> None:
    EngagementProfile.objects.all().delete()
    EngagementPopulation.objects.all().delete()


def assert_same(a, b, *, best_hours: bool = True) -> None:  # noqa: ANN001
    (profiles_a, population_a), (profiles_b, population_b) = a, b
    assert profiles_a.keys() == profiles_b.keys()
    for contact_id, (histogram, best) in profiles_a.items():
        assert profiles_b[contact_id][0] == pytest.approx(histogram, rel=1e-12), contact_id
        if best_hours:
            assert profiles_b[contact_id][1] == best, contact_id
    assert population_b == pytest.approx(population_a, rel=1e-12)


def test_the_bulk_plan_folds_exactly_what_the_small_plan_folds(monkeypatch) -> None:  # noqa: ANN001
    population()
    now = timezone.now() + timedelta(seconds=1)
    engagement.refresh_profiles(now=now)
    small = snapshot()
    humans = EmailEvent.objects.filter(classification="human").values_list("recipient", flat=True)
    assert len(small[0]) == len(set(humans)) > 20
    reset()
    monkeypatch.setattr(engagement, "_BULK_EVENTS", 1)  # hash joins, parallel plan, 512 MB
    engagement.refresh_profiles(now=now)
    assert_same(small, snapshot())


def test_a_backlog_longer_than_a_fold_commits_in_folds_and_adds_up_the_same(monkeypatch) -> None:  # noqa: ANN001
    population(seed=5, contacts=40)
    events = EmailEvent.objects.count()
    now = timezone.now() + timedelta(seconds=1)
    whole = engagement.refresh_profiles(now=now)
    one = snapshot()
    reset()
    monkeypatch.setattr(engagement, "_STEPS_PER_FOLD", 7)  # folds of 21 events: the ordered walk
    stepped = engagement.refresh_profiles(now=now, step=3)
    assert events > 4 * 21
    # As one statement per step counted them: ⌈events / 3⌉ steps, then the one finding nothing.
    assert (whole.steps, stepped.steps) == (2, -(-events // 3) + 1)
    assert stepped.last_event_id == whole.last_event_id == EmailEvent.objects.order_by("-id").first().id
    # Best hours not compared: a contact last touched by an earlier fold keeps the hour chosen
    # against the population of then (docs/scheduling.md), as with one statement per step.
    assert_same(one, snapshot(), best_hours=False)
    assert engagement.refresh_profiles(now=now, step=3).steps == 1  # nothing new


def test_max_steps_stops_the_watermark_after_that_many_steps() -> None:
    population(seed=7, contacts=10)
    ids = list(EmailEvent.objects.order_by("id").values_list("id", flat=True))
    report = engagement.refresh_profiles(now=timezone.now() + timedelta(seconds=1), step=2, max_steps=3)
    assert report.steps == 3
    assert report.last_event_id == ids[5]


def test_skipped_ids_before_an_unsettled_event_are_a_step_of_their_own(engagement_settings) -> None:  # noqa: ANN001
    engagement_settings.EMAILHUB_ENGAGEMENT_SETTLE_SECONDS = 30
    ann = Contact.objects.create(email="ann@example.com")
    now = timezone.now()
    settled, skipped, unsettled = (
        EmailEvent.objects.create(kind="opened", classification="human", recipient=ann.email, occurred_at=now)
        for _ in range(3)
    )
    EmailEvent.objects.filter(pk=settled.pk).update(created_at=now - timedelta(minutes=5))
    EmailEvent.objects.filter(pk=skipped.pk).delete()  # a rolled-back id, in effect
    report = engagement.refresh_profiles(now=now, step=1)
    # Step 1 folds `settled`, step 2 only moves the watermark over the skipped id, step 3 sees
    # only the unsettled event: what the per-step statements reported.
    assert report.steps == 3
    assert report.last_event_id == unsettled.pk - 1
    assert report.contacts == 1


def test_deleting_a_contact_deletes_its_profile() -> None:
    (ann, *_) = population(seed=9, contacts=2)
    EmailEvent.objects.create(
        kind="clicked", classification="human", recipient=ann.email, occurred_at=timezone.now()
    )
    engagement.refresh_profiles(now=timezone.now() + timedelta(seconds=1))
    assert EngagementProfile.objects.filter(contact=ann).exists()
    ann.delete()
    assert not EngagementProfile.objects.filter(contact_id=ann.pk).exists()
