"""The lease on a claimed batch (delivery/services/lease.py), on the real database, with the
lease's clock in the test's hand: renewed when still held, abandoned when the sweep gave it back
or another worker holds it, and a lost claim's outcomes never written over the new owner's."""

from __future__ import annotations

import pytest
from django.db import connection

from delivery.models import Message
from delivery.providers import OutgoingEmail, Provider, SendResult, close_all, locmem
from delivery.services.lease import ClaimLease
from delivery.services.sending import send_messages
from delivery.services.transitions import Outcomes, claim, record_outcomes, requeue_stale
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0


class Clock:
    """The lease's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queued(count: int) -> list[int]:
    return [message.pk for message in factories.messages(count)]


def leased(ids: list[int], clock: Clock) -> ClaimLease:
    asked_at = clock()
    return ClaimLease(claim(ids), asked_at=asked_at, lease_seconds=LEASE, clock=clock)


def give_back_every_claim() -> None:
    """The stale-send sweep, as if every claim were older than its lease."""
    requeue_stale(lease_seconds=0, max_attempts=10)


def claimed_at(ids: list[int]) -> set:
    return set(Message.objects.filter(pk__in=ids).values_list("claimed_at", flat=True))


def test_one_claim_stamps_every_row_with_one_token() -> None:
    ids = queued(3)
    lease = leased(ids, Clock())
    assert claimed_at(ids) == {lease.token} and lease.token is not None


def test_before_half_the_lease_the_guard_asks_the_database_nothing(django_assert_num_queries) -> None:  # noqa: ANN001
    ids = queued(3)
    clock = Clock()
    lease = leased(ids, clock)
    clock.now += LEASE / 2 - 0.001
    with django_assert_num_queries(0):
        assert all(lease.allows(i) for i in ids)


def test_past_half_the_lease_a_claim_still_held_is_renewed_by_one_statement(
    django_assert_num_queries,
) -> None:  # noqa: ANN001
    ids = queued(3)
    clock = Clock()
    lease = leased(ids, clock)
    first = lease.token
    clock.now += LEASE / 2
    with django_assert_num_queries(1):  # one UPDATE for the batch, not one per message
        assert all(lease.allows(i) for i in ids)
    assert lease.lost == set() and lease.token is not None and lease.token > first
    assert claimed_at(ids) == {lease.token}  # the sweep now measures the lease from here
    clock.now += LEASE / 2 - 0.001  # the renewed lease's own first half
    with django_assert_num_queries(0):
        assert lease.allows(ids[0])


def test_a_claim_the_sweep_gave_back_is_abandoned_and_never_asked_about_again(
    django_assert_num_queries,
) -> None:  # noqa: ANN001
    ids = queued(3)
    clock = Clock()
    lease = leased(ids, clock)
    give_back_every_claim()
    clock.now += LEASE / 2
    assert not any(lease.allows(i) for i in ids)
    assert lease.lost == set(ids)
    clock.now += 10 * LEASE
    with django_assert_num_queries(0):
        assert not lease.allows(ids[0])
    assert set(Message.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"queued"}


def test_a_claim_another_worker_took_is_abandoned_and_its_late_outcomes_write_nothing() -> None:
    ids = queued(2)
    clock = Clock()
    frozen = leased(ids, clock)
    give_back_every_claim()
    other = leased(ids, clock)  # another worker claims the rows the sweep gave back
    assert other.token != frozen.token
    clock.now += LEASE  # the frozen worker wakes up
    assert not frozen.allows(ids[0]) and frozen.lost == set(ids)

    late = Outcomes()
    late.sent["smtp"] = [(i, "frozen-worker-id") for i in ids]
    late.failed = [(ids[0], "late failure")]
    assert frozen.token is not None
    assert record_outcomes(late, frozen.token).counts == {}
    assert set(Message.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"sending"}
    assert claimed_at(ids) == {other.token}

    own = Outcomes()
    own.sent["smtp"] = [(i, "other-worker-id") for i in ids]
    assert other.token is not None
    record_outcomes(own, other.token)
    rows = Message.objects.filter(pk__in=ids)
    assert set(rows.values_list("status", "provider_message_id")) == {("sent", "other-worker-id")}


def test_a_claim_the_database_cannot_confirm_is_abandoned_and_left_for_the_sweep() -> None:
    ids = queued(2)
    clock = Clock()
    lease = leased(ids, clock)
    token = lease.token
    with connection.cursor() as db:
        db.execute("SET default_transaction_read_only = on")  # the renewal's UPDATE fails
        try:
            clock.now += LEASE / 2
            assert not lease.allows(ids[0])
        finally:
            db.execute("SET default_transaction_read_only = off")
    assert lease.lost == set(ids)
    rows = Message.objects.filter(pk__in=ids)
    assert set(rows.values_list("status", "claimed_at")) == {("sending", token)}


class TakenOverMidBatch(Provider):
    """Sends one email at a time; after the second, the worker "stalls" past its lease: the
    sweep gives the batch back and another worker claims it."""

    name = "takenover"
    clock: Clock
    sent: list[int]

    def send_one(self, email: OutgoingEmail) -> SendResult:
        self.sent.append(email.message_id)
        if len(self.sent) == 2:
            self.clock.now += 2 * LEASE
            give_back_every_claim()
            claim([m.pk for m in Message.objects.filter(status="queued")])
        return SendResult.accepted(f"id-{email.message_id}")


def test_the_send_path_sends_and_records_nothing_more_of_a_batch_it_lost_mid_send(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDER_CLASSES = [
        *settings.EMAILHUB_PROVIDER_CLASSES,
        "tests.test_claim_lease.TakenOverMidBatch",
    ]
    settings.EMAILHUB_PROVIDERS_BULK = ["takenover", "locmem"]  # nothing lost fails over either
    settings.EMAILHUB_SENDING_LEASE_SECONDS = LEASE
    clock = Clock()
    TakenOverMidBatch.clock, TakenOverMidBatch.sent = clock, []
    ids = queued(5)
    try:
        report = send_messages(ids, clock=clock)
    finally:
        close_all()
    assert TakenOverMidBatch.sent == ids[:2]
    assert not {e.message_id for e in locmem.outbox} & set(ids)
    assert (report.claimed, report.abandoned) == (5, 5)
    # The new owner's claim stands, untouched: nothing recorded, not even the two accepted.
    rows = Message.objects.filter(pk__in=ids)
    assert set(rows.values_list("status", "provider", "attempts")) == {("sending", None, 2)}
    with connection.cursor() as db:
        db.execute("SELECT count(DISTINCT claimed_at) FROM delivery_message WHERE id = ANY(%s)", [ids])
        assert db.fetchone() == (1,)
