"""`/api/v1/webhook-endpoints` (issue 22): registration with its one-time secret, who sees which
endpoints, the URL rules named in 400s, changes, the delivery log, rotation and replays, against
a real local receiver verifying with `standardwebhooks`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from delivery.services.sending import send_messages
from outbound.models import Delivery, Endpoint
from outbound.services import delivering, dispatching
from outbound.testing.receiver import Receiver
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:  # noqa: ANN001
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = True
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True
    with Receiver() as found:
        yield found


def _register(client: APIClient, url: str, **extra: object) -> dict:
    response = client.post("/api/v1/webhook-endpoints", {"url": url, **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_registration_shows_the_secret_once_and_each_key_sees_its_own(receiver: Receiver) -> None:
    sender, sender_key = factories.api_client("send", "read")
    other, _ = factories.api_client("send", "read")
    manager, _ = factories.api_client("manage")
    created = _register(sender, receiver.url, event_types=["message.sent"], description="orders")
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert created["event_types"] == ["message.sent"] and created["all_messages"] is False
    shown = sender.get(f"/api/v1/webhook-endpoints/{created['id']}").json()
    assert "secret" not in shown and shown["url"] == receiver.url
    assert [e["id"] for e in sender.get("/api/v1/webhook-endpoints").json()["results"]] == [created["id"]]
    assert other.get("/api/v1/webhook-endpoints").json()["results"] == []
    assert other.get(f"/api/v1/webhook-endpoints/{created['id']}").status_code == 404
    assert [e["id"] for e in manager.get("/api/v1/webhook-endpoints").json()["results"]] == [created["id"]]
    assert _register(manager, receiver.url)["all_messages"] is True
    assert Endpoint.objects.get(pk=created["id"]).api_key == sender_key


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://hooks.example.com/x", "https"),
        ("https://127.0.0.1/hook", "loopback"),
        ("https://localhost/hook", "loopback"),
        ("https://10.1.2.3/hook", "private"),
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://[::1]/hook", "loopback"),
        ("https://[::ffff:127.0.0.1]/hook", "loopback"),
        ("https://user:pw@hooks.example.com/x", "credentials"),
        ("https://no-such-host.invalid/x", "does not resolve"),
        ("not a url", "valid URL"),
    ],
)
def test_a_url_that_may_not_be_called_is_a_400_naming_url_and_stores_nothing(
    api: APIClient, url: str, said: str
) -> None:
    response = api.post("/api/v1/webhook-endpoints", {"url": url}, format="json")
    assert response.status_code == 400
    assert said in str(response.json()["error"]["fields"]["url"])
    assert not Endpoint.objects.exists()


def test_unknown_event_types_and_fields_are_400s(api: APIClient, receiver: Receiver) -> None:
    response = api.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url, "event_types": ["message.nope"]}, format="json"
    )
    assert response.status_code == 400 and "event_types" in response.json()["error"]["fields"]
    response = api.post("/api/v1/webhook-endpoints", {"url": receiver.url, "secret": "mine"}, format="json")
    assert response.status_code == 400
    assert not Endpoint.objects.exists()


def test_a_read_key_may_list_but_not_register(receiver: Receiver) -> None:
    reader, _ = factories.api_client("read")
    assert reader.get("/api/v1/webhook-endpoints").status_code == 200
    assert reader.post("/api/v1/webhook-endpoints", {"url": receiver.url}, format="json").status_code == 403


def test_patch_delete_attempts_rotation_and_replay(api: APIClient, receiver: Receiver, smtp) -> None:  # noqa: ANN001
    created = _register(api, receiver.url, event_types=["message.sent"])
    endpoint_id = created["id"]
    receiver.secret = created["secret"]
    changed = api.patch(
        f"/api/v1/webhook-endpoints/{endpoint_id}", {"description": "v2", "batch": True}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["batch"] is True

    message = api.post(
        "/api/v1/messages", {"to": "a@example.com", "subject": "s", "text": "t"}, format="json"
    ).json()
    send_messages([message["id"]])
    dispatching.dispatch()
    delivering.deliver(endpoint_id)
    [request] = receiver.received
    assert request.verified and request.json[0]["data"]["message_id"] == message["id"]  # a batch: an array

    attempts = api.get(f"/api/v1/webhook-endpoints/{endpoint_id}/attempts").json()["results"]
    assert [(a["number"], a["status_code"], a["succeeded"]) for a in attempts] == [(1, 200, True)]
    assert attempts[0]["webhook_id"] == request.headers["webhook-id"]

    rotated = api.post(f"/api/v1/webhook-endpoints/{endpoint_id}/rotate-secret").json()
    assert rotated["secret"] != created["secret"] and rotated["previous_secret_until"]
    receiver.secrets = [created["secret"], rotated["secret"]]

    event_id = attempts[0]["event_ids"][0]
    replayed = api.post(
        f"/api/v1/webhook-endpoints/{endpoint_id}/replay", {"event_id": event_id}, format="json"
    )
    assert replayed.status_code == 202 and replayed.json() == {"replayed": 1}
    delivering.deliver(endpoint_id)
    first, again = receiver.received
    assert again.headers["webhook-id"] == first.headers["webhook-id"]
    assert sorted(again.verified_by) == [0, 1]  # both secrets sign during the grace period

    missing = api.post(f"/api/v1/webhook-endpoints/{endpoint_id}/replay", {"event_id": 10**9}, format="json")
    assert missing.status_code == 404
    neither = api.post(f"/api/v1/webhook-endpoints/{endpoint_id}/replay", {}, format="json")
    assert neither.status_code == 400 and "event_id" in neither.json()["error"]["fields"]
    since = api.post(
        f"/api/v1/webhook-endpoints/{endpoint_id}/replay", {"since": "2020-01-01T00:00:00Z"}, format="json"
    )
    assert since.json() == {"replayed": 0}  # nothing failed

    assert api.delete(f"/api/v1/webhook-endpoints/{endpoint_id}").status_code == 204
    assert not Endpoint.objects.exists() and not Delivery.objects.exists()


def test_a_request_is_replayed_by_the_webhook_id_the_application_saw(
    api: APIClient, receiver: Receiver, smtp
) -> None:  # noqa: ANN001
    created = _register(api, receiver.url, event_types=["message.sent"])
    receiver.secret = created["secret"]
    message = api.post(
        "/api/v1/messages", {"to": "a@example.com", "subject": "s", "text": "t"}, format="json"
    ).json()
    send_messages([message["id"]])
    dispatching.dispatch()
    delivering.deliver(created["id"])
    webhook_id = receiver.received[0].headers["webhook-id"]
    path = f"/api/v1/webhook-endpoints/{created['id']}/replay"
    assert api.post(path, {"webhook_id": webhook_id}, format="json").json() == {"replayed": 1}
    delivering.deliver(created["id"])
    assert [r.headers["webhook-id"] for r in receiver.received] == [webhook_id, webhook_id]
    assert api.post(path, {"webhook_id": "evt_0"}, format="json").status_code == 404
    both = api.post(path, {"webhook_id": webhook_id, "since": "2020-01-01T00:00:00Z"}, format="json")
    assert both.status_code == 400
