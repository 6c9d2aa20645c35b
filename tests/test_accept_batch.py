"""delivery.services.messages.accept_batch called directly: how leaders, followers (a key
repeated in the batch), replays of earlier messages and conflicts combine, in the items' order,
and the statements a batch with a replayed key sends (one SELECT of the earlier rows, whatever
their number)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import OutboxTask
from delivery.exceptions import BatchConflict
from delivery.models import ApiKey, Message
from delivery.services.messages import BatchItem, NewMessage, accept_batch

pytestmark = pytest.mark.django_db


def batch_item(n: int, key: str | None = None, body: str = "a", send_at: datetime | None = None) -> BatchItem:
    """Item `n` (its recipient), with an optional key; `body` stands for its request body."""
    new = NewMessage(to=f"user{n}@example.com", priority="normal", subject=f"Receipt #{n}", send_at=send_at)
    return BatchItem(new, idempotency_key=key, fingerprint=f"body-{body}" if key else None)


@pytest.fixture
def key(api_key: tuple[ApiKey, str]) -> ApiKey:
    return api_key[0]


def test_followers_of_a_leader_that_replays_an_earlier_message_replay_it_too(key: ApiKey) -> None:
    later = timezone.now() + timedelta(days=1)
    earlier = accept_batch([batch_item(0, "k", send_at=later)], api_key=key)
    accepted = accept_batch([batch_item(0, "k"), batch_item(1), batch_item(0, "k")], api_key=key)
    assert accepted.ids[0] == accepted.ids[2] == earlier.ids[0]
    assert accepted.statuses == ["scheduled", "queued", "scheduled"]  # the earlier row's status
    assert accepted.replayed == [True, False, True]
    assert accepted.conflicts == []
    assert Message.objects.count() == 2


def test_followers_of_a_leader_in_conflict_conflict_too_and_the_conflicts_come_sorted(key: ApiKey) -> None:
    earlier = accept_batch([batch_item(0, "k")], api_key=key)
    items = [
        batch_item(1, "d"),
        batch_item(0, "k", body="b"),  # an earlier message holds k, with another body
        batch_item(2),
        batch_item(0, "k", body="b"),  # follows the conflicting leader: a conflict as well
        batch_item(1, "d", body="c"),  # follows item 0 with another body
        batch_item(1, "d"),  # follows item 0, same body: a replay
    ]
    with pytest.raises(BatchConflict) as raised:
        accept_batch(items, api_key=key)
    assert raised.value.indexes == [1, 3, 4]
    assert Message.objects.count() == 1  # all or nothing: the batch was rolled back

    accepted = accept_batch(items, api_key=key, partial=True)
    assert accepted.conflicts == [1, 3, 4]
    assert accepted.ids[1] is accepted.ids[3] is accepted.ids[4] is None
    assert accepted.ids[5] == accepted.ids[0] not in (None, earlier.ids[0])
    assert accepted.replayed == [False, False, False, False, False, True]
    assert accepted.statuses == ["queued", None, "queued", None, None, "queued"]
    stored = set(Message.objects.values_list("pk", flat=True))
    assert stored == {earlier.ids[0], accepted.ids[0], accepted.ids[2]}  # items 0 and 2 only


def test_a_batch_with_replayed_keys_reads_the_earlier_rows_in_one_select(key: ApiKey) -> None:
    accept_batch([batch_item(n, f"k{n}") for n in range(3)], api_key=key)
    items = [batch_item(n, f"k{n}") for n in range(3)] + [batch_item(n) for n in range(3, 6)]
    with CaptureQueriesContext(connection) as captured:
        accepted = accept_batch(items, api_key=key)
    shapes = [" ".join(q["sql"].replace('"', "").split()[:7]) for q in captured.captured_queries]
    # The messages' INSERT is a WITH: their outbound events go in the same statement.
    assert [s.split()[0] for s in shapes] == ["SAVEPOINT", "WITH", "SELECT", "INSERT", "RELEASE"]
    assert "INSERT INTO delivery_message" in shapes[1] and "delivery_message" in shapes[2]
    assert "core_outboxtask" in shapes[3]
    assert accepted.replayed == [True] * 3 + [False] * 3
    # Only the three new messages get a send task (one task: fewer than a normal batch's 100).
    assert [task.payload["ids"] for task in OutboxTask.objects.all()][-1] == accepted.ids[3:]
