from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.models import Template
from core.models import OutboxTask
from delivery.models import Message
from tests import factories
from tests.broker import queued_tasks

# With the fast paths on (kept serializers, the fast publisher) and with every one off.
pytestmark = pytest.mark.usefixtures("fast_paths")

VALID = {"to": "ann@example.com", "subject": "Your code", "text": "123456", "priority": "critical"}


def post(api: APIClient, body: dict, **headers: str):  # noqa: ANN201
    return api.post("/api/v1/messages", body, format="json", **headers)


def test_accepted_message_is_stored_queued_with_an_outbox_row(
    api: APIClient, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    response = post(api, VALID)
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["priority"] == "critical" and body["to"] == "ann@example.com"
    message = Message.objects.get(pk=body["id"])
    assert message.queued_at is not None and message.created_at is not None
    assert OutboxTask.objects.filter(payload__ids=[message.pk], payload__priority="critical").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**VALID, "to": "not-an-address"}, "to"),
        ({**VALID, "to": "ann@example.com\r\nBcc: x@example.com"}, "to"),
        ({**VALID, "subject": "Hi\r\nBcc: x@example.com"}, "subject"),
        ({**VALID, "subject": "Hi\nthere"}, "subject"),
        ({**VALID, "priority": "urgent"}, "priority"),
        ({"to": "ann@example.com", "template": "no-such-template"}, "template"),
        ({"to": "ann@example.com", "text": "no subject"}, "subject"),
        ({"to": "ann@example.com", "subject": "no body"}, "text"),
        ({**VALID, "from": "Evil\r\nBcc: x@example.com <a@example.com>"}, "from"),
        ({**VALID, "reply_to": "nope"}, "reply_to"),
        ({**VALID, "send_at": "next tuesday"}, "send_at"),
        ({**VALID, "context": ["not", "a", "dict"]}, "context"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(
    api: APIClient, body: dict, field: str
) -> None:
    response = post(api, body)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"], response.json()
    assert Message.objects.count() == 0
    assert OutboxTask.objects.count() == 0


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("emailhub:unsubscribe", "'emailhub:unsubscribe' is reserved; use the unsubscribe field"),
        ("emailhub:track_opens", "'emailhub:track_opens' is reserved; use the track_opens field"),
        ("emailhub:track_clicks", "'emailhub:track_clicks' is reserved; use the track_clicks field"),
        ("emailhub:test_send", "'emailhub:test_send' is reserved for the admin's test sends"),
    ],
)
def test_a_context_key_that_once_carried_a_flag_is_still_refused(api: APIClient, key: str, says: str) -> None:
    response = post(api, {**VALID, "context": {"a": 1, key: True}})
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"context": [says]}
    assert Message.objects.count() == 0


@pytest.mark.parametrize("batch", [False, True])
def test_the_api_flags_are_stored_as_columns_and_the_context_is_the_clients_own(
    api: APIClient, batch: bool
) -> None:
    body = {**VALID, "unsubscribe": True, "track_clicks": True}
    plain = {**VALID, "context": {"a": 1}}
    if batch:
        response = api.post("/api/v1/messages/batch", {"messages": [body, plain]}, format="json")
        ids = [result["id"] for result in response.json()["results"]]
    else:
        ids = [post(api, body).json()["id"], post(api, plain).json()["id"]]
    flags = {
        pk: rest
        for pk, *rest in Message.objects.values_list(
            "pk", "list_unsubscribe", "track_opens", "track_clicks", "test_send_by", "context"
        )
    }
    assert flags == {ids[0]: [True, False, True, None, None], ids[1]: [False, False, False, None, {"a": 1}]}


def test_malformed_json_is_a_400(api: APIClient) -> None:
    response = api.post("/api/v1/messages", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert Message.objects.count() == 0


@pytest.mark.django_db
def test_no_key_or_a_wrong_key_is_401() -> None:
    client = APIClient()
    assert client.post("/api/v1/messages", VALID, format="json").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Bearer eh_wrong")
    assert client.post("/api/v1/messages", VALID, format="json").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    assert client.get("/api/v1/messages/1").status_code == 401
    assert Message.objects.count() == 0


def test_revoked_key_is_refused(api: APIClient, api_key) -> None:  # noqa: ANN001
    from django.utils import timezone

    api_key[0].revoked_at = timezone.now()
    api_key[0].save()
    assert post(api, VALID).status_code == 401


def test_unknown_message_id_is_404(api: APIClient) -> None:
    assert api.get("/api/v1/messages/999999").status_code == 404


def test_template_message_renders_from_the_template(api: APIClient) -> None:
    Template.objects.create(name="otp", subject="Code {{ code }}", text="Your code is {{ code }}")
    response = post(api, {"to": "ann@example.com", "template": "otp", "context": {"code": "42"}})
    assert response.status_code == 202
    assert response.json()["template"] == "otp"


def test_same_idempotency_key_and_body_returns_the_same_message(api: APIClient) -> None:
    first = post(api, VALID, HTTP_IDEMPOTENCY_KEY="order-1")
    second = post(api, VALID, HTTP_IDEMPOTENCY_KEY="order-1")
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert second["Idempotent-Replayed"] == "true"
    assert Message.objects.count() == 1
    assert OutboxTask.objects.count() == 1


def test_same_idempotency_key_with_another_body_is_refused(api: APIClient) -> None:
    assert post(api, VALID, HTTP_IDEMPOTENCY_KEY="order-2").status_code == 202
    response = post(api, {**VALID, "text": "654321"}, HTTP_IDEMPOTENCY_KEY="order-2")
    assert response.status_code == 422
    assert "Idempotency-Key" in response.json()["error"]["fields"]
    assert Message.objects.count() == 1


def test_idempotency_keys_are_per_api_key(api: APIClient) -> None:
    other, _ = factories.api_client("send", "read", name="other")
    a = post(api, VALID, HTTP_IDEMPOTENCY_KEY="k")
    b = post(other, VALID, HTTP_IDEMPOTENCY_KEY="k")
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_requests_with_one_key_make_one_message_and_one_task(api_key, redis) -> None:  # noqa: ANN001
    def send(_: int) -> tuple[int, int]:
        client = factories.authenticated(api_key[1])
        try:
            response = post(client, VALID, HTTP_IDEMPOTENCY_KEY="parallel-1")
            return response.status_code, response.json()["id"]
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(send, range(20)))
    assert {status for status, _ in results} == {202}
    assert len({message_id for _, message_id in results}) == 1
    assert Message.objects.count() == 1
    assert OutboxTask.objects.count() == 0  # published on commit, then deleted
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[results[0][1]]])]


def test_send_at_in_the_future_is_scheduled_not_queued(api: APIClient) -> None:
    day = (timezone.now() + timedelta(days=30)).date()  # within EMAILHUB_SCHEDULE_HORIZON_DAYS
    response = post(api, {**VALID, "send_at": f"{day}T09:00:00+01:00"})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "scheduled" and body["due_at"] == f"{day}T08:00:00Z"
    assert OutboxTask.objects.count() == 0


@pytest.mark.django_db
def test_openapi_schema_and_health_are_served() -> None:
    client = APIClient()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "/api/v1/messages" in schema.json()["paths"]
    assert client.get("/healthz").json() == {"status": "ok"}
