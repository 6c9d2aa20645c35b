"""The claim's storage format: one string per lease, every unit kind parsed back, old leases reaped."""

from __future__ import annotations

import time as clock
from datetime import UTC, datetime

from django.utils import timezone

from core import schedule_index


def test_a_claim_returns_every_kind_of_unit_and_leases_them_as_one_string(redis) -> None:  # noqa: ANN001
    due = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    schedule_index.add(
        [
            (schedule_index.message_unit(12345678901), due),
            (schedule_index.slot_unit(7, due), due),
            (schedule_index.campaign_unit(9), due),
        ]
    )
    claim = schedule_index.claim(10, lease_seconds=30)
    assert sorted(claim.units) == sorted(
        [
            schedule_index.Unit("a", 9),
            schedule_index.Unit("c", 7, int(due.timestamp())),
            schedule_index.Unit("m", 12345678901),
        ]
    )
    assert all(type(unit) is schedule_index.Unit for unit in claim.units)
    lease = redis.get(schedule_index.CLAIM_PREFIX + claim.token)
    assert sorted(lease.split(b" ")) == sorted(str(unit).encode() for unit in claim.units)
    assert redis.zscore(schedule_index.CLAIMS, claim.token) is not None
    schedule_index.ack(claim)
    assert not redis.exists(schedule_index.CLAIM_PREFIX + claim.token)
    assert schedule_index.sizes() == {"due": 0, "leased": 0}


def test_a_claim_with_nothing_due_leases_nothing_and_says_when_the_next_is(redis) -> None:  # noqa: ANN001
    later = timezone.now().timestamp() + 3600
    schedule_index.add([("m:1", datetime.fromtimestamp(later, UTC))])
    claim = schedule_index.claim(10, lease_seconds=30)
    assert claim.units == [] and claim.next_due is not None and abs(claim.next_due - later) < 0.01
    assert schedule_index.sizes() == {"due": 1, "leased": 0}


def test_an_expired_lease_kept_as_a_list_by_the_previous_format_is_reaped_too(redis) -> None:  # noqa: ANN001
    # A scheduler of the previous release died with this claim in flight (its units RPUSHed).
    redis.rpush(schedule_index.CLAIM_PREFIX + "old", "m:1", "c:2:1767600000")
    redis.zadd(schedule_index.CLAIMS, {"old": clock.time() - 5})
    schedule_index.add([("m:3", timezone.now())])
    schedule_index.claim(10, lease_seconds=0.01)  # a claimer of this release dies too
    clock.sleep(0.05)
    assert schedule_index.reap() == 3
    assert sorted(str(u) for u in schedule_index.claim(10, 30).units) == ["c:2:1767600000", "m:1", "m:3"]
    assert not redis.exists(schedule_index.CLAIM_PREFIX + "old")
