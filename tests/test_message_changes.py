"""An application's message after the 202: tags and metadata it recognises it by, cancel (by id,
by tag, by idempotency key) and reschedule (issue 21, parts 1 and 2), in process on the real
PostgreSQL and Redis. The same with the scheduler and workers running: test_message_changes_race.py.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import redis as redis_lib
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.models import Campaign
from core import schedule_index
from core.models import OutboxTask
from core.schedule_index import DUE, Unit, message_unit
from delivery.models import EmailEvent, Message, MessageStatus
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from scheduling.dispatch import dispatch
from tests import factories
from tests.conftest import wait_until

pytestmark = pytest.mark.usefixtures("fast_paths")

VALID = {"to": "ann@example.com", "subject": "Reminder", "text": "Finish signing up", "priority": "high"}


def post(api: APIClient, body: dict[str, Any], **headers: str) -> Any:
    return api.post("/api/v1/messages", body, format="json", **headers)


def later(minutes: int = 60) -> str:
    return (timezone.now() + timedelta(minutes=minutes)).isoformat()


def score(redis: redis_lib.Redis, message_id: int) -> float | None:
    return redis.zscore(DUE, message_unit(message_id))


# --- tags and metadata ---------------------------------------------------------------------------


def test_tags_and_metadata_are_stored_and_returned_and_a_repeated_tag_is_kept_once(api: APIClient) -> None:
    body = {**VALID, "tags": ["reminder", "user:42", "reminder"], "metadata": {"user_id": "42", "flow": ""}}
    response = post(api, body)
    assert response.status_code == 202, response.json()
    assert response.json()["tags"] == ["reminder", "user:42"]
    assert response.json()["metadata"] == {"user_id": "42", "flow": ""}
    message = Message.objects.get(pk=response.json()["id"])
    assert message.tags == ["reminder", "user:42"] and message.metadata == {"user_id": "42", "flow": ""}
    shown = api.get(f"/api/v1/messages/{message.pk}").json()
    assert shown["tags"] == ["reminder", "user:42"] and shown["metadata"] == {"user_id": "42", "flow": ""}


def test_a_message_without_tags_shows_empty_ones_and_stores_null(api: APIClient) -> None:
    response = post(api, VALID)
    assert response.json()["tags"] == [] and response.json()["metadata"] == {}
    assert Message.objects.filter(tags__isnull=True, metadata__isnull=True).count() == 1


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"tags": "reminder"}, "tags", "must be an array, not a string"),
        ({"tags": ["has space"]}, "tags", "is not a tag: letters, digits and _ . : - only"),
        ({"tags": ["ünïcode"]}, "tags", "is not a tag"),
        ({"tags": [""]}, "tags", "empty"),
        ({"tags": [7]}, "tags", "must be a string, not a number"),
        ({"tags": ["x" * 129]}, "tags", "at most 128"),
        (
            {"tags": [f"t{n}" for n in range(11)]},
            "tags",
            "has 11 tags; at most 10 (EMAILHUB_MESSAGE_MAX_TAGS)",
        ),
        ({"metadata": ["a"]}, "metadata", "must be an object, not an array"),
        ({"metadata": {"n": 1}}, "metadata", "must be a string, not a number"),
        ({"metadata": {"deep": {"er": "x"}}}, "metadata", "must be a string, not an object"),
        (
            {"metadata": {f"k{n}": "v" for n in range(21)}},
            "metadata",
            "at most 20 (EMAILHUB_METADATA_MAX_KEYS)",
        ),
        ({"metadata": {"big": "x" * 2100}}, "metadata", "at most 2048 (EMAILHUB_METADATA_MAX_BYTES)"),
    ],
)
def test_bad_tags_or_metadata_are_a_400_naming_the_field_and_store_nothing(
    api: APIClient, extra: dict[str, Any], field: str, says: str
) -> None:
    response = post(api, {**VALID, **extra})
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert list(fields) == [field] and says in str(fields[field]), fields
    assert Message.objects.count() == 0 and OutboxTask.objects.count() == 0


def test_a_limit_on_tags_is_named_in_the_error_shape(api: APIClient) -> None:
    response = post(api, {**VALID, "tags": [f"t{n}" for n in range(11)]})
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["limit"] == {"name": "EMAILHUB_MESSAGE_MAX_TAGS", "value": 10}


def test_the_limits_are_settings(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_MESSAGE_MAX_TAGS = 2
    settings.EMAILHUB_METADATA_MAX_KEYS = 1
    assert post(api, {**VALID, "tags": ["a", "b", "c"]}).status_code == 400
    assert post(api, {**VALID, "metadata": {"a": "1", "b": "2"}}).status_code == 400
    assert post(api, {**VALID, "tags": ["a", "b"], "metadata": {"a": "1"}}).status_code == 202


def test_each_item_of_a_batch_carries_its_own_tags_and_metadata(api: APIClient) -> None:
    items = [
        {**VALID, "to": f"user{n}@example.com", "tags": [f"order-{n}"], "metadata": {"n": str(n)}}
        for n in range(3)
    ]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code in (200, 202), response.json()
    rows = Message.objects.order_by("id")
    assert [(m.tags, m.metadata) for m in rows] == [([f"order-{n}"], {"n": str(n)}) for n in range(3)]
    bad = api.post("/api/v1/messages/batch", {"messages": [{**VALID, "tags": ["no space"]}]}, format="json")
    assert bad.status_code == 400 and Message.objects.count() == 3


def test_messages_are_listed_by_tag_and_only_the_keys_own(db) -> None:  # noqa: ANN001
    api, _ = factories.api_client("send", "read")  # not `manage`, which reads every key's
    first = post(api, {**VALID, "tags": ["order-1", "receipt"]}).json()["id"]
    second = post(api, {**VALID, "tags": ["order-2", "receipt"]}).json()["id"]
    post(api, VALID)
    other, _ = factories.api_client("send", "read")
    post(other, {**VALID, "tags": ["receipt"]})
    listed = api.get("/api/v1/messages", {"tag": "receipt"}).json()["results"]
    assert [m["id"] for m in listed] == [second, first]
    own = other.get("/api/v1/messages", {"tag": "receipt"}).json()["results"]
    assert len(own) == 1 and own[0]["id"] not in (first, second)
    assert [m["id"] for m in api.get("/api/v1/messages", {"tag": "order-1"}).json()["results"]] == [first]
    assert api.get("/api/v1/messages", {"tag": "no such"}).status_code == 400


def test_the_tag_filter_is_an_index_scan(db) -> None:  # noqa: ANN001
    factories.messages(2000)  # untagged: outside the partial index
    Message.objects.filter(pk__in=Message.objects.order_by("id").values("pk")[:5]).update(tags=["rare"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE delivery_message")
        cursor.execute("SET enable_seqscan = off")  # the planner's choice at 2,000 rows is not the question
        cursor.execute("EXPLAIN SELECT id FROM delivery_message WHERE tags @> '[\"rare\"]'::jsonb")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "message_tags_idx" in plan, plan


def test_the_event_tag_filter_reaches_events_through_the_message_tag_index(db) -> None:  # noqa: ANN001
    from delivery.selectors import events_matching

    factories.campaign(tags=["rare"])  # a tagged campaign: its messages are found by campaign id
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # the plan's shape, not the planner's choice at 0 rows
        sql, params = events_matching({"tag": "rare"}).query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "message_tags_idx" in plan and "uniq_campaign_contact" in plan, plan
    assert "SubPlan" not in plan and "Seq Scan" not in plan, plan


def test_events_carry_their_messages_tags_and_metadata_and_are_filtered_by_tag(api: APIClient) -> None:
    tagged = factories.sent_message(tags=["order-7"], metadata={"order": "7"})
    plain = factories.sent_message(to="bob@example.com")
    now = timezone.now()
    for message in (tagged, plain):
        EmailEvent.objects.create(
            message=message, kind="delivered", recipient=message.to_email, occurred_at=now
        )
    EmailEvent.objects.create(message=None, kind="bounced", recipient="nobody@example.com", occurred_at=now)
    events = api.get("/api/v1/events").json()["results"]
    by_recipient = {e["recipient"]: e for e in events}
    assert by_recipient["ann@example.com"]["tags"] == ["order-7"]
    assert by_recipient["ann@example.com"]["metadata"] == {"order": "7"}
    assert (
        by_recipient["bob@example.com"]["tags"] == [] and by_recipient["nobody@example.com"]["metadata"] == {}
    )
    filtered = api.get("/api/v1/events", {"tag": "order-7"}).json()["results"]
    assert [e["recipient"] for e in filtered] == ["ann@example.com"]
    of_message = api.get(f"/api/v1/messages/{tagged.pk}/events").json()["results"]
    assert of_message[0]["tags"] == ["order-7"]


# --- cancel one ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["scheduled", "queued", "retry_wait"])
def test_a_message_not_yet_handed_to_a_provider_is_cancelled_and_cancelling_again_is_200(
    api: APIClient,
    api_key,
    redis: redis_lib.Redis,
    status: str,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    message = factories.message(api_key=api_key[0], status=status, due_at=timezone.now() + timedelta(hours=1))
    redis.zadd(DUE, {message_unit(message.pk): 1.0})
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/v1/messages/{message.pk}/cancel")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "cancelled"
    message.refresh_from_db()
    assert message.status == "cancelled" and message.last_error == "cancelled through the API"
    if status != "queued":
        assert score(redis, message.pk) is None  # its unit left the schedule index
    again = api.post(f"/api/v1/messages/{message.pk}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.parametrize("status", ["sending", "sent", "failed", "suppressed"])
def test_cancelling_a_message_past_cancelling_is_a_409_naming_its_status(
    api: APIClient,
    api_key,
    status: str,  # noqa: ANN001
) -> None:
    message = factories.message(api_key=api_key[0], status=status)
    response = api.post(f"/api/v1/messages/{message.pk}/cancel")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "conflict" and f"is {status}" in error["message"]
    message.refresh_from_db()
    assert message.status == status


def test_another_keys_message_cannot_be_cancelled_or_seen(api: APIClient) -> None:
    other, other_key = factories.api_client("send", "read")
    message = factories.message(
        api_key=other_key, status="scheduled", due_at=timezone.now() + timedelta(hours=1)
    )
    mine, _ = factories.api_client("send", "read")
    assert mine.post(f"/api/v1/messages/{message.pk}/cancel").status_code == 404
    assert (
        mine.patch(f"/api/v1/messages/{message.pk}", {"send_at": later()}, format="json").status_code == 404
    )
    message.refresh_from_db()
    assert message.status == "scheduled"
    reader, _ = factories.api_client("read")
    assert reader.post(f"/api/v1/messages/{message.pk}/cancel").status_code == 403


def test_a_cancel_between_the_schedulers_claim_and_its_dispatch_wins_and_nothing_is_queued(
    api: APIClient,
    api_key,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    due = timezone.now() - timedelta(seconds=1)
    message = factories.message(api_key=api_key[0], status="scheduled", due_at=due)
    schedule_index.add([(message_unit(message.pk), due)])
    claim = schedule_index.claim(100, 30)
    assert [str(unit) for unit in claim.units] == [message_unit(message.pk)]
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/v1/messages/{message.pk}/cancel").json()["status"] == "cancelled"
        assert dispatch(claim.units) == 0
    schedule_index.ack(claim)
    assert Message.objects.get(pk=message.pk).status == "cancelled"
    assert OutboxTask.objects.count() == 0 and redis.zcard(DUE) == 0


def test_a_cancel_after_the_dispatch_leaves_the_send_task_nothing_to_claim(
    api: APIClient,
    api_key,  # noqa: ANN001
) -> None:
    message = factories.message(
        api_key=api_key[0], status="scheduled", due_at=timezone.now() - timedelta(seconds=1)
    )
    assert dispatch([Unit("m", message.pk)]) == 1
    assert Message.objects.get(pk=message.pk).status == "queued"
    assert api.post(f"/api/v1/messages/{message.pk}/cancel").json()["status"] == "cancelled"
    assert send_messages([message.pk]).claimed == 0
    assert Message.objects.get(pk=message.pk).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_cancel_while_the_worker_sends_is_a_409_and_the_message_is_sent_once(
    api: APIClient,
    api_key,
    smtp: SMTPTestServer,
    settings,  # noqa: ANN001
) -> None:
    """The worker holds the claim (`sending`) while the provider takes the message; the cancel
    that lands then is refused, and the send completes."""
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    message = factories.message(api_key=api_key[0])
    smtp.hold_data_replies()
    reports: list[Any] = []
    worker = threading.Thread(
        target=lambda: (reports.append(send_messages([message.pk])), connection.close())
    )
    worker.start()
    try:
        wait_until(lambda: smtp.held == 1, 10, "the message at the SMTP server")
        response = api.post(f"/api/v1/messages/{message.pk}/cancel")
    finally:
        smtp.hold_data_replies(False)
        worker.join(10)
    assert response.status_code == 409 and "is sending" in response.json()["error"]["message"]
    assert reports[0].sent == 1
    assert Message.objects.get(pk=message.pk).status == "sent"
    assert [m.rcpt_tos for m in smtp.messages] == [["ann@example.com"]]


# --- cancel by tag or idempotency key -----------------------------------------------------------


def test_cancel_by_tag_cancels_every_unsent_message_of_the_key_in_one_statement(
    api: APIClient,
    api_key,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    key = api_key[0]
    due = timezone.now() + timedelta(hours=1)
    waiting = [
        factories.message(
            to=f"w{n}@example.com", api_key=key, status=status, due_at=due, tags=["reminder:42"]
        )
        for n, status in enumerate(["scheduled", "scheduled", "queued", "retry_wait"])
    ]
    redis.zadd(DUE, {message_unit(m.pk): due.timestamp() for m in waiting if m.status != "queued"})
    sent = factories.message(to="s@example.com", api_key=key, status="sent", tags=["reminder:42"])
    done = factories.message(to="c@example.com", api_key=key, status="cancelled", tags=["reminder:42"])
    untagged = factories.message(
        to="u@example.com", api_key=key, status="scheduled", due_at=due, tags=["other"]
    )
    _, other_key = factories.api_client("send")
    others = factories.message(
        to="o@example.com", api_key=other_key, status="scheduled", due_at=due, tags=["reminder:42"]
    )

    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/messages/cancel", {"tag": "reminder:42"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"cancelled": 4, "already_cancelled": 1, "past_cancelling": 1}
    writes = [q["sql"] for q in queries.captured_queries if "delivery_message" in q["sql"]]
    assert len(writes) == 1 and "UPDATE delivery_message" in writes[0], writes
    assert set(Message.objects.filter(pk__in=[m.pk for m in waiting]).values_list("status", flat=True)) == {
        "cancelled"
    }
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert (statuses[sent.pk], statuses[done.pk], statuses[untagged.pk], statuses[others.pk]) == (
        "sent", "cancelled", "scheduled", "scheduled"
    )  # fmt: skip
    assert redis.zcard(DUE) == 0
    # Again: nothing left to cancel.
    again = api.post("/api/v1/messages/cancel", {"tag": "reminder:42"}, format="json").json()
    assert again == {"cancelled": 0, "already_cancelled": 5, "past_cancelling": 1}


def test_cancel_by_idempotency_key_cancels_the_message_sent_under_it(api: APIClient) -> None:
    accepted = post(api, {**VALID, "send_at": later()}, HTTP_IDEMPOTENCY_KEY="signup-42").json()
    post(api, {**VALID, "send_at": later()}, HTTP_IDEMPOTENCY_KEY="signup-43")
    response = api.post("/api/v1/messages/cancel", {"idempotency_key": "signup-42"}, format="json")
    assert response.json() == {"cancelled": 1, "already_cancelled": 0, "past_cancelling": 0}
    assert Message.objects.get(pk=accepted["id"]).status == "cancelled"
    assert Message.objects.filter(status="scheduled").count() == 1
    none = api.post("/api/v1/messages/cancel", {"idempotency_key": "never-used"}, format="json")
    assert none.json() == {"cancelled": 0, "already_cancelled": 0, "past_cancelling": 0}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "tag"),
        ({"tag": "a", "idempotency_key": "b"}, "idempotency_key"),
        ({"tag": "not a tag"}, "tag"),
        ({"tag": 5}, "tag"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "x" * 256}, "idempotency_key"),
        ({"tags": ["a"]}, "tags"),
    ],
)
def test_a_bad_cancel_request_is_a_400_naming_the_field_and_cancels_nothing(
    api: APIClient,
    api_key,
    body: dict[str, Any],
    field: str,  # noqa: ANN001
) -> None:
    message = factories.message(api_key=api_key[0], tags=["a"])
    response = api.post("/api/v1/messages/cancel", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"], response.json()
    message.refresh_from_db()
    assert message.status == "queued"


# --- reschedule ---------------------------------------------------------------------------------


def test_rescheduling_a_scheduled_message_moves_its_unit_and_the_old_instant_never_fires_it(
    api: APIClient,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        created = post(api, {**VALID, "send_at": later(60)}).json()
    old = score(redis, created["id"])
    new_time = timezone.now() + timedelta(hours=3)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.patch(
            f"/api/v1/messages/{created['id']}", {"send_at": new_time.isoformat()}, format="json"
        )
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "scheduled"
    message = Message.objects.get(pk=created["id"])
    assert message.due_at == new_time
    assert old == pytest.approx(message.created_at.timestamp() + 3600, abs=5)
    assert score(redis, message.pk) == pytest.approx(new_time.timestamp(), abs=1)
    # A scheduler that had claimed the unit at its old instant dispatches it: the row is not due,
    # so nothing is queued and the unit goes back in at its real time.
    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch([Unit("m", message.pk)]) == 0
    message.refresh_from_db()
    assert message.status == "scheduled"
    assert score(redis, message.pk) == pytest.approx(new_time.timestamp(), abs=1)


def test_rescheduling_to_now_queues_it_with_its_send_task_in_the_same_transaction(
    api: APIClient,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        created = post(api, {**VALID, "send_at": later(60)}).json()
    assert score(redis, created["id"]) is not None
    assert OutboxTask.objects.count() == 0  # a scheduled message has no send task yet
    past = (timezone.now() - timedelta(minutes=5)).isoformat()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.patch(f"/api/v1/messages/{created['id']}", {"send_at": past}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "queued"
    message = Message.objects.get(pk=created["id"])
    assert message.queued_at is not None and message.due_at is None
    # Committed with the row (the outbox); published and unindexed after the commit.
    assert [t.payload["ids"] for t in OutboxTask.objects.all()] == [[message.pk]]
    for callback in callbacks:
        callback()
    assert score(redis, message.pk) is None


def test_a_queued_message_can_be_put_off_and_its_waiting_task_then_claims_nothing(api: APIClient) -> None:
    created = post(api, VALID).json()
    response = api.patch(f"/api/v1/messages/{created['id']}", {"send_at": later(30)}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "scheduled"
    assert send_messages([created["id"]]).claimed == 0
    assert Message.objects.get(pk=created["id"]).status == "scheduled"


@pytest.mark.parametrize("status", ["sending", "sent", "failed", "cancelled"])
def test_rescheduling_a_message_past_it_is_a_409_naming_its_status(
    api: APIClient,
    api_key,
    status: str,  # noqa: ANN001
) -> None:
    message = factories.message(api_key=api_key[0], status=status)
    response = api.patch(f"/api/v1/messages/{message.pk}", {"send_at": later()}, format="json")
    assert response.status_code == 409 and f"is {status}" in response.json()["error"]["message"]
    message.refresh_from_db()
    assert message.status == status and message.due_at is None


def test_a_campaigns_message_is_not_rescheduled_through_the_message_api(api: APIClient) -> None:
    campaign = factories.sending_campaign(factories.make_audience(1))
    message = factories.campaign_messages(
        campaign, status="scheduled", due_at=timezone.now() + timedelta(hours=1)
    )[0]
    response = api.patch(f"/api/v1/messages/{message.pk}", {"send_at": later()}, format="json")
    assert response.status_code == 409 and "campaign" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "send_at"),
        ({"send_at": "tomorrow"}, "send_at"),
        ({"send_at": (timezone.now() + timedelta(days=400)).isoformat()}, "send_at"),
        ({"send_at": later(), "subject": "changed"}, "subject"),
    ],
)
def test_a_bad_reschedule_is_a_400_naming_the_field_and_changes_nothing(
    api: APIClient, body: dict[str, Any], field: str
) -> None:
    created = post(api, {**VALID, "send_at": later(60)}).json()
    response = api.patch(f"/api/v1/messages/{created['id']}", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"], response.json()
    message = Message.objects.get(pk=created["id"])
    assert message.status == MessageStatus.SCHEDULED and message.due_at.isoformat() == created[
        "due_at"
    ].replace("Z", "+00:00")


# --- a campaign's tags ------------------------------------------------------------------------------


def test_a_campaigns_tags_are_set_through_the_api_and_carried_by_its_messages_and_their_events(
    api: APIClient,
) -> None:
    audience = factories.make_audience(2)
    body = {"name": "spring", "template": factories.newsletter().name, "contact_list": audience.pk}
    bad = api.post("/api/v1/campaigns", {**body, "tags": ["no spaces please"]}, format="json")
    assert bad.status_code == 400 and "tags" in bad.json()["error"]["fields"]
    created = api.post("/api/v1/campaigns", {**body, "tags": ["spring-sale", "newsletter"]}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["tags"] == ["spring-sale", "newsletter"]
    campaign = Campaign.objects.get(pk=created.json()["id"])
    untagged = api.post("/api/v1/campaigns", {**body, "name": "plain"}, format="json").json()
    assert untagged["tags"] == [] and Campaign.objects.get(pk=untagged["id"]).tags is None

    first, second = factories.campaign_messages(campaign, status="sent")
    assert Message.objects.filter(campaign=campaign, tags__isnull=True).count() == 2  # no copy per row
    shown = api.get(f"/api/v1/messages/{first.pk}").json()
    assert shown["tags"] == ["spring-sale", "newsletter"] and shown["metadata"] == {}
    transactional = post(api, {**VALID, "tags": ["spring-sale"]}).json()["id"]
    listed = api.get("/api/v1/messages", {"tag": "spring-sale"}).json()["results"]
    assert sorted(m["id"] for m in listed) == sorted([first.pk, second.pk, transactional])

    EmailEvent.objects.create(
        message=first, kind="opened", recipient=first.to_email, occurred_at=timezone.now()
    )
    [event] = api.get("/api/v1/events", {"tag": "newsletter"}).json()["results"]
    assert event["message"] == first.pk and event["tags"] == ["spring-sale", "newsletter"]


def test_the_admins_campaign_form_takes_a_drafts_tags_through_the_apis_own_field(admin_client) -> None:  # noqa: ANN001
    audience = factories.make_audience(1)
    form = {"name": "c", "template": factories.newsletter().pk, "contact_list": audience.pk,
            "priority": "normal", "window_hours": 24}  # fmt: skip
    for bad in ('["no spaces"]', '"not-a-list"', str([f"t{n}" for n in range(11)]).replace("'", '"')):
        response = admin_client.post("/admin/campaigns/campaign/add/", {**form, "tags": bad})
        assert response.status_code == 200 and "tags" in response.context["adminform"].form.errors, bad
    assert Campaign.objects.count() == 0
    good = admin_client.post("/admin/campaigns/campaign/add/", {**form, "tags": '["spring-sale"]'})
    assert good.status_code == 302 and Campaign.objects.get().tags == ["spring-sale"]
    empty = admin_client.post("/admin/campaigns/campaign/add/", {**form, "name": "d", "tags": ""})
    assert empty.status_code == 302 and Campaign.objects.get(name="d").tags is None


@pytest.mark.django_db(transaction=True)
def test_tags_and_metadata_never_reach_the_recipient(api: APIClient, smtp: SMTPTestServer, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    body = {**VALID, "tags": ["secret-tag-x1"], "metadata": {"internal_user": "secret-value-y2"}}
    message_id = post(api, body).json()["id"]
    assert send_messages([message_id]).sent == 1
    [received] = smtp.messages
    assert b"secret-tag-x1" not in received.data and b"secret-value-y2" not in received.data
    assert b"internal_user" not in received.data
