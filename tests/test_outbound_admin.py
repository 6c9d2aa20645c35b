"""The operator's outbound webhooks in the admin (issue 22): endpoints added and edited through
the API's checks (the secret shown once), disabled, enabled, rotated and replayed by actions, the
delivery log read-only with what was sent, and the dashboard's endpoints in trouble. Django's test
client against the real PostgreSQL and Redis and a real local receiver that verifies every
request with `standardwebhooks` (tests/test_outbound_webhooks.py's helpers register it and make
events)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator

import pytest
from django.conf import LazySettings
from django.test import Client
from django.urls import reverse

from core.models import OutboxTask
from delivery.models import ApiKey
from outbound.models import Attempt, Delivery, Endpoint
from outbound.services import delivering, endpoints
from outbound.services.registration import DELIVER_KIND
from outbound.testing.receiver import Receiver
from tests import factories
from tests.test_admin_readonly import change_url, form_of
from tests.test_outbound_webhooks import happen, listen

pytestmark = pytest.mark.django_db

ADD = reverse("admin:outbound_endpoint_add")
ENDPOINTS = reverse("admin:outbound_endpoint_changelist")
DELIVERIES = reverse("admin:outbound_delivery_changelist")


@pytest.fixture
def receiver(settings: LazySettings) -> Iterator[Receiver]:
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = True
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True
    with Receiver() as found:
        yield found


@pytest.fixture
def key() -> ApiKey:
    """An application's key (send and read): its endpoints hear of its own messages."""
    return factories.api_key("send", "read")[0]


def field_errors(response: object) -> dict[str, list[str]]:
    form = response.context["adminform"].form  # type: ignore[attr-defined]
    return {name: [str(e) for e in errors] for name, errors in form.errors.items()}


def act(client: Client, url: str, action: str, *objects: object) -> list[str]:
    """Run a changelist action on `objects`; the messages the page it lands on shows."""
    selected = [obj.pk for obj in objects]  # type: ignore[attr-defined]
    response = client.post(url, {"action": action, "_selected_action": selected}, follow=True)
    assert response.status_code == 200 and response.redirect_chain == [(url, 302)]
    return [str(message) for message in response.context["messages"]]


# --- adding and editing an endpoint ----------------------------------------------------------------


def test_adding_an_endpoint_shows_its_secret_once_and_stores_it(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    response = admin_client.post(
        ADD,
        {
            "api_key": key.pk,
            "url": receiver.url,
            "description": "orders",
            "event_types": ["message.sent", "message.bounced"],
            "enabled": "on",
        },
        follow=True,
    )
    assert response.status_code == 200
    endpoint = Endpoint.objects.get()
    [secret] = re.findall(r"shown this once: <code>(whsec_[^<]+)</code>", response.content.decode())
    assert secret == endpoint.secret
    assert (endpoint.api_key, endpoint.url, endpoint.description, endpoint.event_types) == (
        key, receiver.url, "orders", ["message.bounced", "message.sent"],
    )  # fmt: skip
    assert (endpoint.enabled, endpoint.batch, endpoint.all_messages) == (True, False, False)
    # Once: neither the endpoint's page nor the list shows it again.
    for url in (change_url(endpoint), ENDPOINTS):
        page = admin_client.get(url).content.decode()
        assert receiver.url in page and secret not in page and "whsec_" not in page


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.example.com/emailhub", "must be https"),
        ("https://127.0.0.1/hook", "127.0.0.1 is a loopback address"),
        ("http://127.0.0.1:8000/hook", "must be https"),
    ],
)
def test_an_http_or_loopback_url_is_a_form_error_on_the_url_and_stores_nothing(
    admin_client: Client, settings: LazySettings, key: ApiKey, url: str, says: str
) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = False
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = False
    response = admin_client.post(ADD, {"api_key": key.pk, "url": url, "enabled": "on"})
    assert response.status_code == 200
    errors = field_errors(response)
    assert list(errors) == ["url"] and says in " ".join(errors["url"]), errors
    assert "whsec_" not in response.content.decode()
    assert not Endpoint.objects.exists() and not OutboxTask.objects.exists()


def test_a_description_the_api_refuses_is_a_form_error_too(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    response = admin_client.post(
        ADD, {"api_key": key.pk, "url": receiver.url, "description": "orders\r\nX-Evil: 1", "enabled": "on"}
    )
    assert response.status_code == 200
    assert field_errors(response) == {"description": ["must not contain line breaks (CR or LF)"]}
    assert not Endpoint.objects.exists()


def test_saving_an_endpoint_disabled_under_the_open_form_writes_only_what_the_operator_changed(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key, event_types=["message.sent"], description="orders")
    form = form_of(admin_client.get(change_url(endpoint)).content.decode())
    assert form["enabled"] == "on" and form["event_types"] == "message.sent"
    # A 410 disables it while the operator is editing its description.
    assert endpoints.disable(endpoint.pk, "the endpoint answered 410 Gone")
    disabled = Endpoint.objects.get(pk=endpoint.pk)

    response = admin_client.post(change_url(endpoint), {**form, "description": "orders v2", "_save": "Save"})
    assert response.status_code == 302, field_errors(response)
    saved = Endpoint.objects.get(pk=endpoint.pk)
    assert saved.description == "orders v2"
    # The ticked box the page showed is not a change: the endpoint stays disabled, for its reason.
    assert (saved.enabled, saved.disabled_reason, saved.disabled_at) == (
        False, "the endpoint answered 410 Gone", disabled.disabled_at,
    )  # fmt: skip
    assert (saved.url, saved.event_types, saved.secret) == (receiver.url, ["message.sent"], endpoint.secret)
    assert not OutboxTask.objects.filter(kind=DELIVER_KIND).exists()  # nothing was sent for an enable


# --- actions ----------------------------------------------------------------------------------------


def test_disable_holds_what_waits_and_enable_sends_it(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    happen(key)  # a delivery pending for the endpoint
    assert act(admin_client, ENDPOINTS, "disable_endpoints", endpoint) == ["disabled 1 endpoint(s)"]
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.disabled_reason) == (False, "disabled by an operator")
    assert delivering.deliver(endpoint.pk) == 0
    assert receiver.received == [] and Delivery.objects.get().status == "pending"

    OutboxTask.objects.all().delete()
    assert act(admin_client, ENDPOINTS, "enable_endpoints", endpoint) == ["enabled"]
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.disabled_reason, endpoint.disabled_at) == (True, "", None)
    # Enabling records the endpoint's delivery task (the relay publishes it) ...
    assert [t.payload for t in OutboxTask.objects.filter(kind=DELIVER_KIND)] == [{"endpoint": endpoint.pk}]
    # ... which delivers what waited.
    assert delivering.deliver(endpoint.pk) == 1
    [request] = receiver.received
    delivery = Delivery.objects.get()
    assert request.verified and request.headers["webhook-id"] == delivery.webhook_id
    assert delivery.status == "succeeded"


def test_replay_failed_and_the_delivery_replay_send_the_same_webhook_id_again(
    admin_client: Client, receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = [0.0]  # one attempt: a failure is final
    endpoint = listen(receiver, key)
    happen(key, 2)
    receiver.answer_next(500)
    assert delivering.deliver(endpoint.pk) == 2
    failed, succeeded = Delivery.objects.order_by("id")
    assert (failed.status, succeeded.status) == ("failed", "succeeded")

    assert act(admin_client, ENDPOINTS, "replay_failed", endpoint) == ["1 failed delivery(ies) sent again"]
    # Queued again, not yet sent: a replay of it from the delivery log is refused, saying why.
    assert act(admin_client, DELIVERIES, "replay_deliveries", failed) == [
        f"delivery {failed.pk}: event {failed.event_ids[0]} is being delivered to this endpoint right now",
        "0 delivery(ies) sent again",
    ]
    assert delivering.deliver(endpoint.pk) == 1

    assert act(admin_client, DELIVERIES, "replay_deliveries", succeeded) == ["1 delivery(ies) sent again"]
    assert delivering.deliver(endpoint.pk) == 1
    first, second, replayed_failed, replayed = receiver.received
    assert [r.status for r in receiver.received] == [500, 200, 200, 200]
    assert replayed_failed.headers["webhook-id"] == first.headers["webhook-id"] == failed.webhook_id
    assert replayed.headers["webhook-id"] == second.headers["webhook-id"] == succeeded.webhook_id
    assert replayed.body == second.body and all(r.verified for r in receiver.received)
    assert list(Delivery.objects.order_by("id").values_list("status", flat=True)) == ["succeeded"] * 2


def test_the_rotate_action_shows_the_new_secret_once_and_both_secrets_sign_meanwhile(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    old = endpoint.secret
    [said] = act(admin_client, ENDPOINTS, "rotate_secrets", endpoint)
    [new] = re.findall(r"shown this once: <code>(whsec_[^<]+)</code>", said)
    endpoint.refresh_from_db()
    assert (endpoint.secret, endpoint.previous_secret) == (new, old) and new != old
    assert new not in admin_client.get(change_url(endpoint)).content.decode()
    receiver.secrets = [old, new]
    happen(key)
    assert delivering.deliver(endpoint.pk) == 1
    [request] = receiver.received
    assert sorted(request.verified_by) == [0, 1]  # the old secret's signature and the new one's


# --- the delivery log ---------------------------------------------------------------------------------


def test_a_deliverys_page_shows_its_attempts_and_what_was_sent(
    admin_client: Client, receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = [0.0, 0.0]  # the retry is due at once
    endpoint = listen(receiver, key)
    [message_id] = happen(key)
    receiver.answer_next(503, body=b"busy, come back later")
    assert delivering.deliver(endpoint.pk) == 1
    delivery = Delivery.objects.get()
    assert delivering.release([delivery.pk]) == 1
    assert delivering.deliver(endpoint.pk) == 1
    sent = receiver.received[-1]

    page = admin_client.get(change_url(delivery)).content.decode()
    attempts = page.split('id="attempt_log-group"', 1)[1].split("</fieldset>", 1)[0]
    shown_attempts = [
        dict(re.findall(r'<td class="field-(\w+)">\s*<p>(.*?)</p>', row, re.S))
        for row in re.findall(r'<tr class="form-row[^"]*"[^>]*>(.*?)</tr>', attempts, re.S)
    ]
    # The log's order, newest first: number, status, the error and the response's excerpt.
    assert [(a["number"], a["status_code"], a["error"], a["response"]) for a in shown_attempts] == [
        ("2", "200", "-", "-"),
        ("1", "503", "HTTP 503", "busy, come back later"),
    ]
    assert ['alt="True"' in a["succeeded"] for a in shown_attempts] == [True, False]
    [shown] = re.findall(r'class="form-row field-payload".*?<pre>(.*?)</pre>', page, re.S)
    # What was sent, as JSON: the event the receiver got.
    assert json.loads(html.unescape(shown)) == [sent.json]
    assert sent.json["data"]["message_id"] == message_id


def test_delivery_and_attempt_pages_are_read_only(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    assert delivering.deliver(endpoint.pk) == 1
    delivery, attempt = Delivery.objects.get(), Attempt.objects.get()
    for obj in (delivery, attempt):
        meta = obj._meta
        add = reverse(f"admin:{meta.app_label}_{meta.model_name}_add")
        listing = admin_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        assert listing.status_code == 200 and f'href="{add}"' not in listing.content.decode()
        assert admin_client.get(add).status_code == 403
        page = admin_client.get(change_url(obj))
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
        form = form_of(page.content.decode())
        changed = {**form, "status": "pending", "succeeded": "", "status_code": "500", "_save": "Save"}
        assert admin_client.post(change_url(obj), changed).status_code == 403
    assert Delivery.objects.get().status == "succeeded"
    assert (Attempt.objects.get().succeeded, Attempt.objects.get().status_code) == (True, 200)


# --- the dashboard ------------------------------------------------------------------------------------


def test_the_dashboard_shows_an_endpoint_a_410_disabled_and_not_one_disabled_by_hand(
    admin_client: Client, receiver: Receiver, key: ApiKey
) -> None:
    gone = listen(receiver, key)
    by_hand = endpoints.create(key, receiver.url_for("/other"))[0]
    happen(key)
    receiver.answer(410)
    assert delivering.deliver(gone.pk) == 1
    assert act(admin_client, ENDPOINTS, "disable_endpoints", by_hand) == ["disabled 1 endpoint(s)"]
    assert not Endpoint.objects.filter(enabled=True).exists()

    page = admin_client.get("/admin/dashboard/").content.decode()
    section = page.split('id="dashboard-webhooks"', 1)[1].split("</section>", 1)[0]
    assert re.findall(r'class="webhook-row" data-endpoint-id="(\d+)"', section) == [str(gone.pk)]
    assert "the endpoint answered 410 Gone" in section and f'href="{change_url(gone)}"' in section
    assert receiver.url_for("/other") not in section
    data = admin_client.get("/admin/dashboard/data/").json()
    assert [(e["id"], e["enabled"], e["reason"]) for e in data["webhook_endpoints"]] == [
        (gone.pk, False, "the endpoint answered 410 Gone")
    ]
