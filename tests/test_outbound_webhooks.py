"""Outbound event webhooks (issue 22), in process against a real local receiver
(outbound/testing/receiver.py) that verifies every request with the `standardwebhooks` library.

Delivery, retries, the circuit and the concurrency limit per endpoint, disabling, SSRF refusals,
secret rotation, batches, replays and recovery after a crash. The clock is time-machine's
wherever the code reads it (the delivery code reads Python's clock only, and so does the
library's timestamp check in the receiver): "six hours" pass without waiting. Which changes
write which events: tests/test_outbound_events.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
import redis as redis_lib
import time_machine
from django.conf import LazySettings
from django.db import connection
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import OutboundEvent, OutboxTask
from core.schedule_index import DUE, Unit, webhook_unit
from delivery.authentication import revoke_api_key
from delivery.models import ApiKey
from delivery.services import transitions
from delivery.services.events import DETAIL_MAX_CHARS, ProviderEvent, record_events
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from outbound import selectors
from outbound.exceptions import NotReplayable, UnsafeUrl
from outbound.models import Attempt, Delivery, Endpoint
from outbound.services import addresses, delivering, dispatching, endpoints
from outbound.services.registration import DELIVER_KIND
from outbound.testing.receiver import Received, Receiver
from scheduling.dispatch import dispatch as scheduler_dispatch
from tests import factories
from tests.broker import queued_tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def local(settings: LazySettings) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = True
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True


@pytest.fixture(scope="module")
def running_receiver() -> Iterator[Receiver]:
    """One receiver for the module: closing one waits for its server's half-second poll."""
    with Receiver() as found:
        yield found


@pytest.fixture
def receiver(local: None, running_receiver: Receiver) -> Iterator[Receiver]:
    """The module's receiver with nothing received and no answer programmed (`listen` gives it
    the endpoint's secret)."""
    running_receiver.clear()
    yield running_receiver
    running_receiver.clear()


@pytest.fixture
def key() -> ApiKey:
    """An application's key (send and read): its endpoints hear of its own messages."""
    return factories.api_key("send", "read")[0]


# The instant the `clock` fixture stops time at (whole seconds: Retry-After dates have no finer).
START = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    """Python's clock held at START; a test moves it (`shift`), it never runs by itself."""
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def listen(receiver: Receiver, key: ApiKey, **options: Any) -> Endpoint:
    """An endpoint of `key` at the receiver, which verifies with the endpoint's secret."""
    endpoint, secret = endpoints.create(key, receiver.url, **options)
    receiver.secret = secret
    return endpoint


def happen(key: ApiKey, count: int = 1, *, prefix: str = "user") -> list[int]:
    """`count` messages of `key` cancelled (a message.cancelled event each, written by the
    cancel's statement) and the events dispatched; returns the messages' ids, in event order."""
    batch = factories.messages(count, prefix=prefix, api_key=key)
    ids = [m.pk for m in batch]
    transitions.cancel(ids, "cancelled by the test")
    dispatching.dispatch()
    return ids


def message_ids(requests: list[Received]) -> list[int]:
    """The message of each event of these requests, in order."""
    found = []
    for request in requests:
        for event in request.json if isinstance(request.json, list) else [request.json]:
            found.append(event["data"]["message_id"])
    return found


def statuses() -> list[str]:
    return list(Delivery.objects.order_by("id").values_list("status", flat=True))


# --- a delivery, signed ------------------------------------------------------------------------------


def test_a_sent_message_reaches_the_endpoint_signed_with_its_tags_and_metadata(
    api: APIClient, api_key: tuple[ApiKey, str], receiver: Receiver, smtp: SMTPTestServer
) -> None:
    endpoint = listen(receiver, api_key[0], event_types=["message.sent"])
    response = api.post(
        "/api/v1/messages",
        {"to": "a@example.com", "subject": "s", "text": "t", "tags": ["otp"], "metadata": {"order": "1"}},
        format="json",
    )
    assert response.status_code == 202, response.content
    send_messages([response.json()["id"]])
    dispatching.dispatch()
    assert delivering.deliver(endpoint.pk) == 1
    [request] = receiver.received
    assert request.verified, request.error
    assert request.headers["content-type"] == "application/json"
    assert request.json["type"] == "message.sent"
    data = request.json["data"]
    assert data["message_id"] == response.json()["id"]
    assert data["tags"] == ["otp"] and data["metadata"] == {"order": "1"}
    assert request.headers["webhook-id"] == f"evt_{OutboundEvent.objects.get().pk}"
    # The body signed and sent is the event as written.
    assert json.loads(request.body) == OutboundEvent.objects.get().payload
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("succeeded", 1, 200)
    [attempt] = Attempt.objects.all()
    assert (attempt.number, attempt.status_code, attempt.succeeded, attempt.error) == (1, 200, True, "")


def test_dispatch_records_as_many_delivery_tasks_as_the_endpoint_may_run_at_once(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY = 3
    settings.EMAILHUB_WEBHOOKS_CLAIM = 20
    few, many = listen(receiver, key, event_types=["message.queued"]), listen(receiver, key)
    happen(key, 1)  # cancelled: for `many` only
    assert list(OutboxTask.objects.filter(kind=DELIVER_KIND).values_list("payload", flat=True)) == [
        {"endpoint": many.pk}
    ]
    OutboxTask.objects.all().delete()
    happen(key, 41)  # three claims' worth
    assert OutboxTask.objects.filter(kind=DELIVER_KIND, payload={"endpoint": many.pk}).count() == 3
    assert not OutboxTask.objects.filter(payload={"endpoint": few.pk}).exists()


def test_a_task_out_of_budget_hands_the_endpoint_over_to_a_fresh_task(
    receiver: Receiver,
    key: ApiKey,
    settings: LazySettings,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_WEBHOOKS_CLAIM = 1
    endpoint = listen(receiver, key)
    happen(key, 3)
    with django_capture_on_commit_callbacks(execute=True):
        assert delivering.deliver(endpoint.pk, budget_seconds=0) == 1
    assert queued_tasks(redis, "webhooks") == [("outbound.deliver", [endpoint.pk])]
    assert statuses() == ["succeeded", "pending", "pending"]


# --- failed attempts -----------------------------------------------------------------------------------


def test_a_500_waits_for_each_step_of_the_schedule_and_every_attempt_is_logged(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = [0.0, 5.0, 300.0]
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer(500, body=b"x" * 5000)
    assert delivering.deliver(endpoint.pk) == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("retry_wait", 1, 500)
    assert delivery.due_at == START + timedelta(seconds=5)
    [attempt] = Attempt.objects.all()
    assert (attempt.number, attempt.status_code, attempt.succeeded) == (1, 500, False)
    assert attempt.attempted_at == START and attempt.latency_ms > 0
    assert attempt.response == "x" * 1024 and attempt.error == "HTTP 500"

    # Not due yet: nothing moves, nothing is sent.
    clock.shift(4)
    assert delivering.release([delivery.pk]) == 0
    assert delivering.deliver(endpoint.pk) == 0
    clock.shift(1)
    assert delivering.release([delivery.pk]) == 1
    assert delivering.deliver(endpoint.pk) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("retry_wait", 2)
    assert delivery.due_at == START + timedelta(seconds=5 + 300)

    # The last step used: failed for good (replayable), every attempt in the log.
    clock.shift(300)
    assert delivering.release([delivery.pk]) == 1
    assert delivering.deliver(endpoint.pk) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("failed", 3, "HTTP 500")
    assert delivery.finished_at == START + timedelta(seconds=305)
    assert list(Attempt.objects.values_list("number", "status_code")) == [(3, 500), (2, 500), (1, 500)]
    # One webhook-id for every attempt, each request verified at the moved clock.
    assert {r.headers["webhook-id"] for r in receiver.received} == {delivery.webhook_id}
    assert [r.verified for r in receiver.received] == [True] * 3
    assert [int(r.headers["webhook-timestamp"]) for r in receiver.received] == [
        int(START.timestamp()), int(START.timestamp()) + 5, int(START.timestamp()) + 305
    ]  # fmt: skip


def test_a_failed_attempt_is_indexed_for_its_retry_and_the_scheduler_releases_it(
    receiver: Receiver,
    key: ApiKey,
    clock: time_machine.Traveller,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer_next(500)
    with django_capture_on_commit_callbacks(execute=True):
        delivering.deliver(endpoint.pk)
    delivery = Delivery.objects.get()
    assert redis.zscore(DUE, webhook_unit(delivery.pk)) == (START + timedelta(seconds=5)).timestamp()
    clock.shift(5)
    scheduler_dispatch([Unit("w", delivery.pk)])  # what the scheduler does with the due unit
    delivery.refresh_from_db()
    assert delivery.status == "pending"
    assert delivering.deliver(endpoint.pk) == 1
    assert statuses() == ["succeeded"]


@pytest.mark.parametrize(
    ("status", "retry_after", "waits"),
    [
        (429, "120", 120),
        (503, "120", 120),
        (503, format_datetime(START + timedelta(hours=1), usegmt=True), 3600),
        (429, "0", 1),
        (500, "120", 5),  # only a 429's or a 503's Retry-After is read
    ],
)
def test_retry_after_is_honoured_on_429_and_503(
    receiver: Receiver,
    key: ApiKey,
    clock: time_machine.Traveller,
    status: int,
    retry_after: str,
    waits: int,
) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer_next(status, headers={"Retry-After": retry_after})
    assert delivering.deliver(endpoint.pk) == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.last_status_code) == ("retry_wait", status)
    assert delivery.due_at == START + timedelta(seconds=waits)
    clock.shift(waits)
    assert delivering.release([delivery.pk]) == 1
    assert delivering.deliver(endpoint.pk) == 1
    assert statuses() == ["succeeded"]


def test_410_disables_the_endpoint_and_fails_the_delivery(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller
) -> None:
    endpoint = listen(receiver, key)
    happen(key, 3)
    receiver.answer(410)
    assert delivering.deliver(endpoint.pk) == 1
    assert statuses() == ["failed", "pending", "pending"]
    # The two not tried spent no attempt.
    assert list(Delivery.objects.order_by("id").values_list("attempts", flat=True)) == [1, 0, 0]
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason == "the endpoint answered 410 Gone"
    assert endpoint.disabled_at == START
    assert selectors.troubled_endpoints() == [endpoint]  # the operator's dashboard shows it
    assert delivering.deliver(endpoint.pk) == 0
    assert len(receiver.received) == 1
    # Enabled again (the application fixed it): what waited goes; the gone one waits for a replay.
    receiver.answer(200)
    endpoints.update(endpoint, enabled=True)
    assert delivering.deliver(endpoint.pk) == 2
    assert statuses() == ["failed", "succeeded", "succeeded"]


def test_a_redirect_is_a_failed_attempt_and_is_not_followed(receiver: Receiver, key: ApiKey) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    elsewhere = receiver.url_for("/elsewhere")
    receiver.answer(307, headers={"Location": elsewhere})
    assert delivering.deliver(endpoint.pk) == 1
    assert [r.path for r in receiver.received] == ["/hook"]
    [attempt] = Attempt.objects.all()
    assert (attempt.status_code, attempt.succeeded) == (307, False)
    assert attempt.error == f"redirect to {elsewhere} not followed"
    assert statuses() == ["retry_wait"]


@pytest.mark.parametrize(("how", "error"), [("drop", "Connection aborted"), ("hang", "timed out")])
def test_no_answer_is_a_failed_attempt_with_its_error(
    receiver: Receiver, key: ApiKey, settings: LazySettings, how: str, error: str
) -> None:
    settings.EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS = 0.3
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer(**{how: True})
    assert delivering.deliver(endpoint.pk) == 1
    assert len(receiver.received) == 1
    [attempt] = Attempt.objects.all()
    assert (attempt.status_code, attempt.succeeded) == (None, False)
    assert error in attempt.error, attempt.error
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.last_status_code, delivery.last_error) == (
        "retry_wait",
        None,
        attempt.error,
    )


# --- an outage of the receiver ---------------------------------------------------------------------


def test_a_receiver_down_for_six_hours_gets_every_event_after_it_recovers_with_its_original_id(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller
) -> None:
    endpoint = listen(receiver, key)
    sent = happen(key, 8)
    receiver.answer(503)

    def tick(step: timedelta) -> None:
        """What beat and the delivery tasks do meanwhile: the sweep releases the retries that
        are due and kicks the endpoint's task, which delivers what is due."""
        delivering.sweep()
        delivering.deliver(endpoint.pk)
        clock.shift(step)

    for n in range(36):  # six hours, ten minutes at a time; more events an hour in
        if n == 6:
            sent += happen(key, 4)
        tick(timedelta(minutes=10))
    assert {r.status for r in receiver.received} == {503}
    assert Delivery.objects.filter(status="succeeded").count() == 0
    assert Delivery.objects.filter(status="failed").count() == 0  # attempts were left

    receiver.answer(200)
    for _ in range(12):  # the longest wait left on the schedule is five hours
        tick(timedelta(hours=1))

    assert set(statuses()) == {"succeeded"}
    delivered = [r for r in receiver.received if r.status == 200]
    assert sorted(message_ids(delivered)) == sorted(sent)  # every event, once
    assert all(r.verified for r in receiver.received)  # signed afresh at each attempt's time
    for message_id in sent:
        carrying = [r for r in receiver.received if message_ids([r]) == [message_id]]
        assert len(carrying) >= 2  # it failed before it arrived
        assert {r.headers["webhook-id"] for r in carrying} == {carrying[0].headers["webhook-id"]}
    assert Attempt.objects.count() == len(receiver.received)


# --- the circuit per endpoint --------------------------------------------------------------------------


def test_an_open_circuit_holds_deliveries_without_spending_attempts_until_one_probe_passes(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES = 3
    settings.EMAILHUB_WEBHOOKS_CIRCUIT_SECONDS = 60.0
    endpoint = listen(receiver, key)
    happen(key, 6)
    receiver.answer(500)
    assert delivering.deliver(endpoint.pk) == 3
    assert delivering.circuit_state(endpoint.pk) == "open"
    assert statuses() == ["retry_wait"] * 3 + ["pending"] * 3
    assert list(Delivery.objects.order_by("id").values_list("attempts", flat=True)) == [1, 1, 1, 0, 0, 0]

    clock.shift(40)  # the retries are due, the circuit still open
    assert delivering.sweep().released == 3
    assert delivering.deliver(endpoint.pk) == 0
    assert len(receiver.received) == 3 and statuses() == ["pending"] * 6
    assert sum(Delivery.objects.values_list("attempts", flat=True)) == 3

    clock.shift(21)  # 61 s after it opened: one probe may go
    assert delivering.circuit_state(endpoint.pk) == "half-open"
    assert delivering.deliver(endpoint.pk) == 1  # the probe fails: open again
    assert len(receiver.received) == 4 and delivering.circuit_state(endpoint.pk) == "open"
    assert delivering.deliver(endpoint.pk) == 0

    receiver.answer(200)
    clock.shift(61)
    delivering.sweep()  # the probe's own retry is due
    assert delivering.deliver(endpoint.pk) == 6  # the probe passes, closes it, the rest go
    assert delivering.circuit_state(endpoint.pk) == "closed"
    assert statuses() == ["succeeded"] * 6
    assert len(receiver.received) == 10


def test_one_endpoints_open_circuit_does_not_hold_another_endpoints_deliveries(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES = 3
    up = receiver
    with Receiver() as down:
        failing, working = listen(down, key), listen(up, key)
        down.answer(500)
        happen(key, 4)
        assert delivering.deliver(failing.pk) == 3
        assert delivering.circuit_state(failing.pk) == "open"
        assert delivering.deliver(working.pk) == 4
        assert delivering.circuit_state(working.pk) == "closed"
        assert len(up.events(answered_2xx=True)) == 4
    assert set(Delivery.objects.filter(endpoint=working).values_list("status", flat=True)) == {"succeeded"}


# --- an endpoint failing for days ----------------------------------------------------------------------


def test_an_endpoint_failing_every_attempt_for_the_set_time_is_disabled_with_its_reason(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS = 3600.0
    settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = [0.0, 1000.0, 3000.0, 3000.0]
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer(500)
    delivering.deliver(endpoint.pk)
    endpoint.refresh_from_db()
    assert endpoint.failing_since == START
    clock.shift(1000)
    delivering.sweep(now=START + timedelta(seconds=1030))
    delivering.deliver(endpoint.pk)
    endpoint.refresh_from_db()
    assert endpoint.enabled  # failing for 1,000 s only
    clock.shift(3000)
    delivering.sweep(now=START + timedelta(seconds=4030))
    delivering.deliver(endpoint.pk)
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_at == START + timedelta(seconds=4000)
    assert endpoint.disabled_reason.startswith("every attempt failed for 1:00:00 (since ")
    assert endpoint.disabled_reason.endswith("last: HTTP 500")
    assert selectors.troubled_endpoints() == [endpoint]
    assert len(receiver.received) == 3


def test_an_endpoint_that_took_an_event_since_it_began_failing_is_not_disabled(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS = 3600.0
    endpoint = listen(receiver, key)
    happen(key)
    receiver.answer(500)
    delivering.deliver(endpoint.pk)
    clock.shift(timedelta(hours=2))
    happen(key)
    delivering.sweep()  # the first event's retry is due: both go in one round
    receiver.answer_next(200)  # the first is taken, the second refused
    assert delivering.deliver(endpoint.pk) == 2
    assert statuses() == ["succeeded", "retry_wait"]
    endpoint.refresh_from_db()
    # Not "failing every attempt for an hour": it is failing since the second attempt of this round.
    assert endpoint.enabled, endpoint.disabled_reason
    assert endpoint.failing_since == START + timedelta(hours=2)


# --- which URLs may be called ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://127.0.0.1/hook", "loopback"),
        ("https://localhost:8443/hook", "loopback"),  # a name resolving to 127.0.0.1
        ("https://10.1.2.3/hook", "private"),
        ("https://192.168.0.10/hook", "private"),
        ("https://169.254.169.254/latest/meta-data/", "link-local or cloud metadata"),
        ("https://[::1]/hook", "loopback"),
        ("https://[::ffff:127.0.0.1]/hook", "loopback"),
        ("https://[fd00::1]/hook", "private"),
        ("https://2130706433/hook", "loopback"),  # 127.0.0.1 as one number, resolved as such
        ("https://0177.0.0.1/hook", "loopback"),  # and in octal
    ],
)
def test_an_endpoint_on_a_private_address_is_refused_unless_allowed(
    key: ApiKey, settings: LazySettings, url: str, kind: str
) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = False
    with pytest.raises(UnsafeUrl, match=f"is a {kind} address; endpoints must be public"):
        endpoints.create(key, url)
    assert Endpoint.objects.count() == 0
    public = endpoints.create(key, "https://93.184.216.34/hook")[0]
    with pytest.raises(UnsafeUrl):
        endpoints.update(public, url=url)
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True  # development and tests
    assert endpoints.create(key, url)[0].url == url


@pytest.mark.parametrize("url", ["https://0.0.0.0/hook", "https://224.0.0.1/hook"])
def test_an_unspecified_or_multicast_address_is_refused_even_when_private_ones_are_allowed(
    key: ApiKey, settings: LazySettings, url: str
) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True
    with pytest.raises(UnsafeUrl):
        endpoints.create(key, url)


def test_http_is_refused_unless_allowed(key: ApiKey, settings: LazySettings) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = True
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = False
    with pytest.raises(UnsafeUrl, match="must be https"):
        endpoints.create(key, "http://127.0.0.1:8000/hook")
    with pytest.raises(UnsafeUrl, match="credentials in the URL"):
        endpoints.create(key, "https://user:pw@127.0.0.1/hook")
    assert Endpoint.objects.count() == 0
    settings.EMAILHUB_WEBHOOKS_ALLOW_HTTP = True
    assert endpoints.create(key, "http://127.0.0.1:8000/hook")[0].pk


def test_an_address_allowed_at_registration_is_checked_again_at_every_delivery(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    endpoint = listen(receiver, key)
    happen(key, 2)
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = False
    assert delivering.deliver(endpoint.pk) == 2
    assert receiver.received == []
    errors = set(Attempt.objects.values_list("error", flat=True))
    assert errors == {"refused: 127.0.0.1 is a loopback address; endpoints must be public"}
    assert set(Attempt.objects.values_list("status_code", flat=True)) == {None}
    assert statuses() == ["retry_wait", "retry_wait"]


# --- secrets ------------------------------------------------------------------------------------------


def test_during_the_grace_period_requests_carry_both_signatures_and_then_only_the_new(
    receiver: Receiver, key: ApiKey, clock: time_machine.Traveller, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS = 3600.0
    endpoint = listen(receiver, key)
    old = receiver.secret
    assert old is not None and old.startswith("whsec_")
    new = endpoints.rotate_secret(endpoint)
    assert new != old and endpoint.previous_secret_until == START + timedelta(hours=1)
    receiver.secrets = [old, new]

    happen(key)
    delivering.deliver(endpoint.pk)
    [during] = receiver.received
    assert during.verified_by == [0, 1]
    assert len(during.headers["webhook-signature"].split(" ")) == 2

    clock.shift(3601)
    happen(key)
    delivering.deliver(endpoint.pk)
    after = receiver.received[1]
    assert after.verified_by == [1] and len(after.headers["webhook-signature"].split(" ")) == 1
    # A receiver that still knows only the old secret refuses it now.
    receiver.secrets = [old]
    happen(key)
    delivering.deliver(endpoint.pk)
    assert not receiver.received[2].verified and receiver.received[2].status == 400
    assert statuses() == ["succeeded", "succeeded", "retry_wait"]


# --- batches and size ------------------------------------------------------------------------------


def test_a_batch_endpoint_gets_up_to_100_events_a_request_as_one_signed_array(
    receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key, batch=True)
    sent = happen(key, 250)
    assert delivering.deliver(endpoint.pk) == 3
    requests = receiver.received
    assert [len(r.json) for r in requests] == [100, 100, 50]
    assert all(r.verified and len(r.headers["webhook-signature"].split(" ")) == 1 for r in requests)
    assert all(r.headers["webhook-id"].startswith("batch_") for r in requests)
    assert len({r.headers["webhook-id"] for r in requests}) == 3
    assert message_ids(requests) == sent  # every event once, in order
    # A request of one event is an array too, with the event's own id.
    happen(key)
    assert delivering.deliver(endpoint.pk) == 1
    last = receiver.received[-1]
    assert isinstance(last.json, list) and len(last.json) == 1
    assert last.headers["webhook-id"] == f"evt_{OutboundEvent.objects.order_by('id').last().pk}"


def test_an_event_of_a_message_with_the_most_tags_and_metadata_is_under_20_kb(
    receiver: Receiver, api_key: tuple[ApiKey, str], settings: LazySettings
) -> None:
    length, count = settings.EMAILHUB_TAG_MAX_LENGTH, settings.EMAILHUB_MESSAGE_MAX_TAGS
    tags = [f"t{n:02d}".ljust(length, ":") for n in range(count)]
    keys = settings.EMAILHUB_METADATA_MAX_KEYS
    # Values that JSON escapes, to the byte limit as compact JSON.
    metadata = {f"k{n:02d}": '"\\' for n in range(keys)}
    room = settings.EMAILHUB_METADATA_MAX_BYTES - len(json.dumps(metadata, separators=(",", ":")))
    metadata["k00"] += "é" * (room // 2)
    assert (
        len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
        <= settings.EMAILHUB_METADATA_MAX_BYTES
    )
    endpoint = listen(receiver, api_key[0])
    client = factories.authenticated(api_key[1])
    to = ("a" * 64) + "@" + ("b" * 60) + ".example.com"
    response = client.post(
        "/api/v1/messages", {"to": to, "subject": "s", "text": "t", "tags": tags, "metadata": metadata},
        format="json",
    )  # fmt: skip
    assert response.status_code == 202, response.content
    message_id = response.json()["id"]
    # Its longest events: a bounce and a click with the longest detail a provider may give.
    detail = "d" * DETAIL_MAX_CHARS
    record_events(
        [
            ProviderEvent("ses", "b-1", "bounced", timezone.now(), message_id=message_id, bounce="permanent", detail=detail),
            ProviderEvent("ses", "c-1", "clicked", timezone.now(), message_id=message_id, classification="human", detail="https://x.example/" + detail),
        ]
    )  # fmt: skip
    dispatching.dispatch()
    assert delivering.deliver(endpoint.pk) == 3
    for request in receiver.received:
        assert request.verified and len(request.body) <= 20_000, len(request.body)
        assert request.json["data"]["tags"] == tags and request.json["data"]["metadata"] == metadata


# --- replays ---------------------------------------------------------------------------------------------


def test_replaying_an_event_sends_it_again_with_its_webhook_id(receiver: Receiver, key: ApiKey) -> None:
    endpoint = listen(receiver, key)
    happen(key, 2)
    assert delivering.deliver(endpoint.pk) == 2
    first = OutboundEvent.objects.order_by("id").first()
    assert endpoints.replay_event(endpoint, first.pk) == 1
    assert delivering.deliver(endpoint.pk) == 1
    original, _, again = receiver.received
    assert again.headers["webhook-id"] == original.headers["webhook-id"] == f"evt_{first.pk}"
    assert again.body == original.body and again.verified
    assert statuses() == ["succeeded", "succeeded"]
    with pytest.raises(NotReplayable, match="never delivered"):
        endpoints.replay_event(endpoint, first.pk + 1000)
    happen(key)  # pending: being delivered
    with pytest.raises(NotReplayable, match="right now"):
        endpoints.replay_event(endpoint, OutboundEvent.objects.order_by("id").last().pk)


def test_replaying_failures_since_a_time_resends_those_and_no_others(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = [0.0]  # one attempt: a failure is final
    endpoint = listen(receiver, key)
    happen(key, 3)
    receiver.answer_next(500, times=2)
    assert delivering.deliver(endpoint.pk) == 3
    assert statuses() == ["failed", "failed", "succeeded"]
    old, recent, _ = Delivery.objects.order_by("id")
    # The first failed two days ago, before the outage being replayed.
    Delivery.objects.filter(pk=old.pk).update(created_at=F("created_at") - timedelta(days=2))
    assert endpoints.replay_failed(endpoint, recent.created_at - timedelta(hours=1)) == 1
    assert delivering.deliver(endpoint.pk) == 1
    assert receiver.received[-1].headers["webhook-id"] == recent.webhook_id
    assert statuses() == ["failed", "succeeded", "succeeded"]
    assert endpoints.replay_failed(endpoint, recent.created_at - timedelta(hours=1)) == 0


def test_an_endpoint_of_a_revoked_key_is_disabled_at_its_next_delivery(
    receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    revoke_api_key(key)
    assert delivering.deliver(endpoint.pk) == 0
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason == "its API key was revoked"
    assert receiver.received == [] and statuses() == ["pending"]


# --- several tasks, and tasks that die (real threads: committed data) ----------------------------------


def _in_thread(target: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `target` in a thread with its own database connection, as another worker would;
    the result (or the exception) lands in the returned dict."""
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            found["pid"] = _backend_pid()
            found["result"] = target(*args)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            found["error"] = exc
        finally:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - a connection killed by the test
                pass

    thread = threading.Thread(target=run)
    thread.start()
    return thread, found


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_task_finding_the_endpoints_concurrency_taken_ends_at_once_and_the_holder_does_its_work(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY = 1
    endpoint = listen(receiver, key)
    happen(key)
    held = threading.Event()
    receiver.answer_next(hang=held)  # the first request is held in flight
    thread, first = _in_thread(delivering.deliver, endpoint.pk)
    try:
        assert receiver.wait_for(1)
        happen(key)  # another event meanwhile
        assert delivering.deliver(endpoint.pk) == 0  # the one slot is taken
        assert len(receiver.received) == 1
    finally:
        held.set()
        thread.join()
    assert first.get("result") == 2, first
    assert statuses() == ["succeeded", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_task_in_a_long_round_keeps_its_endpoints_slot(
    receiver: Receiver, key: ApiKey, settings: LazySettings
) -> None:
    """A round may last a claim's worth of timeouts (EMAILHUB_WEBHOOKS_CLAIM × _TIMEOUT_SECONDS,
    5 minutes by default) against a slow receiver: its task is not taken for dead meanwhile."""
    settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY = 1
    endpoint = listen(receiver, key)
    happen(key)
    held = threading.Event()
    receiver.answer_next(hang=held)
    thread, first = _in_thread(delivering.deliver, endpoint.pk)
    try:
        assert receiver.wait_for(1)
        happen(key)
        with time_machine.travel(timezone.now() + timedelta(seconds=200), tick=False):
            assert delivering.deliver(endpoint.pk) == 0
        assert len(receiver.received) == 1
    finally:
        held.set()
        thread.join()
    assert first.get("result") == 2, first
    assert statuses() == ["succeeded", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_delivery_held_by_a_task_that_died_is_delivered_after_its_lease_with_the_same_id(
    receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    happen(key)
    held = threading.Event()
    receiver.answer_next(hang=held)
    thread, task = _in_thread(delivering.deliver, endpoint.pk)
    try:
        assert receiver.wait_for(1)
        # The task's worker dies with the request in flight: its connection is gone.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [task["pid"]])
    finally:
        held.set()
        thread.join()
    assert "error" in task, task
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivering", 1)
    assert Attempt.objects.count() == 0
    assert delivering.sweep(lease_seconds=300).requeued == 0  # within its lease: still its task's
    with time_machine.travel(timezone.now() + timedelta(seconds=301), tick=False):
        swept = delivering.sweep(lease_seconds=300)
        assert (swept.requeued, swept.kicked) == (1, 1)
        assert delivering.deliver(endpoint.pk) == 1
    first, again = receiver.received
    assert again.headers["webhook-id"] == first.headers["webhook-id"] and again.verified
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("succeeded", 2)


def test_events_whose_doorbell_was_lost_are_delivered_once_the_tick_dispatches_them(
    receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key)
    batch = factories.messages(3, api_key=key)
    transitions.cancel([m.pk for m in batch], "cancelled")  # committed with the test; no ring heard
    assert delivering.deliver(endpoint.pk) == 0 and Delivery.objects.count() == 0
    assert dispatching.dispatch() == 3
    assert delivering.deliver(endpoint.pk) == 3
    assert sorted(message_ids(receiver.received)) == [m.pk for m in batch]


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a00:1",
        "64:ff9b::7f00:1",
        "2002:a00:1::1",
        "::7f00:1",
        "::ffff:0:7f00:1",
        "fec0::1",
        "64:ff9b:1::1",
    ],
)
def test_ipv6_forms_that_reach_a_private_ipv4_or_a_site_are_refused(
    address: str, settings: LazySettings
) -> None:
    settings.EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = False
    with pytest.raises(UnsafeUrl):
        addresses.check(f"https://[{address}]/hook")


def test_a_batch_delivery_keeps_its_form_when_the_endpoint_stops_batching(
    receiver: Receiver, key: ApiKey
) -> None:
    endpoint = listen(receiver, key, batch=True)
    receiver.answer_next(status=500)
    happen(key, 3)
    delivering.deliver(endpoint.pk)
    endpoints.update(endpoint, batch=False)
    Delivery.objects.update(status=Delivery.Status.PENDING, due_at=timezone.now())
    delivering.deliver(endpoint.pk)
    first, again = receiver.received
    assert isinstance(again.json, list) and len(again.json) == 3 == len(first.json)
    assert again.headers["webhook-id"] == first.headers["webhook-id"] and again.body == first.body
