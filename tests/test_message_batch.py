"""POST /api/v1/messages/batch: one transaction, per-item results, bad items by index (both
behaviours), per-item idempotency, and a 1,000-message batch that survives SIGKILL of the web."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.models import Template
from core.models import OutboxTask
from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import Stack
from tests import factories
from tests.broker import queued_tasks
from tests.conftest import wait_until
from tests.factories import message_body as item  # one message of a batch

# With the fast paths on (kept serializers, the fast publisher) and with every one off.
pytestmark = pytest.mark.usefixtures("fast_paths")

URL = "/api/v1/messages/batch"


def post(api: APIClient, body: Any) -> Any:
    return api.post(URL, body, format="json")


def test_a_batch_is_one_insert_with_one_send_task_per_chunk_and_per_pool(
    api: APIClient,
    redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    Template.objects.create(name="receipt", subject="Receipt {{ n }}", text="Order {{ n }}")
    messages = [item(i, priority="normal") for i in range(250)]
    messages += [item(250, priority="critical"), item(251, priority="critical")]
    messages += [{"to": "tpl@example.com", "template": "receipt", "context": {"n": 7}, "priority": "high"}]
    later = (timezone.now() + timedelta(days=30)).replace(microsecond=0)  # within the horizon
    messages += [item(253, priority="normal", send_at=later.isoformat())]
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api, {"messages": messages})
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["accepted"] == len(messages) and body["rejected"] == 0
    results = body["results"]
    assert [r["index"] for r in results] == list(range(len(messages)))
    assert [r["status"] for r in results] == ["queued"] * 253 + ["scheduled"]
    assert not any(r["replayed"] for r in results)
    ids = [r["id"] for r in results]
    rows = {m.pk: m for m in Message.objects.filter(pk__in=ids)}
    assert len(rows) == len(messages)
    # Each result is its own item's message, in order.
    assert [rows[i].to_email for i in ids] == [m["to"] for m in messages]
    assert rows[ids[252]].template is not None and rows[ids[252]].context == {"n": 7}
    assert rows[ids[253]].due_at is not None and rows[ids[253]].queued_at is None
    # normal: 100 ids per task (EMAILHUB_BATCH_SIZES). Critical and high: one task, the first
    # critical one's, which rang the transactional pool's doorbell; its claim takes the other
    # two (tests/test_pool_claim.py), so theirs were not published.
    normal = queued_tasks(redis, "normal")
    assert [len(args[0]) for _, args in normal] == [100, 100, 50]
    assert sorted(i for _, args in normal for i in args[0]) == sorted(ids[:250])
    assert queued_tasks(redis, "critical") == [("delivery.send_messages", [[ids[250]]])]
    assert queued_tasks(redis, "high") == []
    assert OutboxTask.objects.count() == 0  # published after commit, then deleted
    assert redis.zscore("emailhub:schedule:due", f"m:{ids[253]}") is not None


def test_bad_items_reject_the_whole_batch_by_default_naming_every_index(api: APIClient) -> None:
    messages = [item(0), item(1, to="not-an-address"), item(2), {"to": "x@example.com"}, "nope"]
    response = post(api, {"messages": messages})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert "3 of 5 messages are invalid (index 1, 3, 4)" in error["message"]
    by_index = error["fields"]["messages"]
    assert set(by_index) == {"1", "3", "4"}
    assert "to" in by_index["1"] and "subject" in by_index["3"] and "text" in by_index["3"]
    assert Message.objects.count() == 0 and OutboxTask.objects.count() == 0


def test_partial_accepts_the_good_items_and_reports_each_bad_one(api: APIClient) -> None:
    messages = [item(0), item(1, to="not-an-address"), item(2, priority="urgent"), item(3)]
    response = post(api, {"messages": messages, "partial": True})
    assert response.status_code == 202
    body = response.json()
    assert body["accepted"] == 2 and body["rejected"] == 2
    good, bad_to, bad_priority, last = body["results"]
    assert bad_to == {"index": 1, "error": bad_to["error"]} and "to" in bad_to["error"]["fields"]
    assert bad_to["error"]["status"] == 400 and bad_priority["error"]["fields"].keys() == {"priority"}
    stored = Message.objects.order_by("id")
    assert [m.pk for m in stored] == [good["id"], last["id"]]
    assert [m.to_email for m in stored] == ["user0@example.com", "user3@example.com"]
    assert OutboxTask.objects.count() == 1  # their send task (critical would be one each)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (["not", "an", "object"], None),
        ({"messages": []}, "messages"),
        ({"messages": "x"}, "messages"),
        ({"messages": [item(0)], "partial": "yes"}, "partial"),
        ({"messages": [item(0)], "extra": 1}, "extra"),
    ],
)
def test_a_bad_envelope_is_a_400_and_writes_nothing(api: APIClient, body: Any, field: str | None) -> None:
    response = post(api, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (field in error["fields"]) if field else "messages" in error["message"]
    assert Message.objects.count() == 0


def test_more_messages_than_the_limit_is_a_413_naming_it(api: APIClient) -> None:
    response = post(api, {"messages": [{"to": "a@example.com"}] * 1001})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["limit"] == {"name": "EMAILHUB_API_BATCH_MAX_MESSAGES", "value": 1000}
    assert "at most 1000 messages" in error["message"]
    assert Message.objects.count() == 0


def test_a_key_without_the_send_scope_is_refused(db) -> None:  # noqa: ANN001
    client, _ = factories.api_client("read", name="reader")
    response = post(client, {"messages": [item(0)]})
    assert response.status_code == 403 and Message.objects.count() == 0


def test_an_item_key_replays_its_first_message_and_is_shared_with_the_header(api: APIClient) -> None:
    first = post(api, {"messages": [item(0, idempotency_key="k0"), item(1)]}).json()["results"]
    # The single endpoint's Idempotency-Key is the same key space (the body without the key).
    single = api.post("/api/v1/messages", item(2), format="json", HTTP_IDEMPOTENCY_KEY="k2").json()
    again = post(api, {"messages": [item(0, idempotency_key="k0"), item(2, idempotency_key="k2"), item(3)]})
    assert again.status_code == 202
    results = again.json()["results"]
    assert results[0] == {"index": 0, "id": first[0]["id"], "status": "queued", "replayed": True}
    assert results[1]["id"] == single["id"] and results[1]["replayed"] is True
    assert results[2]["replayed"] is False
    assert Message.objects.count() == 4  # 0, 1, 2 and 3: nothing twice
    assert OutboxTask.objects.filter(payload__ids__contains=first[0]["id"]).count() == 1  # one task


def test_an_item_key_reused_with_another_body_is_a_422_for_the_batch_or_for_that_item(api: APIClient) -> None:
    original = post(api, {"messages": [item(0, idempotency_key="k")]}).json()["results"][0]["id"]
    changed = [item(5), item(0, idempotency_key="k", subject="Another subject"), item(6)]
    response = post(api, {"messages": changed})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_conflict" and "index 1" in error["message"]
    assert error["fields"]["messages"] == {
        "1": {"idempotency_key": [error["fields"]["messages"]["1"]["idempotency_key"][0]]}
    }
    assert list(Message.objects.values_list("id", flat=True)) == [original]  # all or nothing

    response = post(api, {"messages": changed, "partial": True})
    assert response.status_code == 202
    body = response.json()
    assert body["accepted"] == 2 and body["rejected"] == 1
    assert body["results"][1]["error"]["status"] == 422
    assert "idempotency_key" in body["results"][1]["error"]["fields"]
    assert Message.objects.count() == 3
    assert Message.objects.get(pk=original).subject == "Receipt #0"  # the first message is untouched


def test_a_key_repeated_inside_one_batch_makes_one_message(api: APIClient) -> None:
    same = post(api, {"messages": [item(0, idempotency_key="d"), item(0, idempotency_key="d")]})
    assert same.status_code == 202
    first, second = same.json()["results"]
    assert first["id"] == second["id"] and (first["replayed"], second["replayed"]) == (False, True)
    other = post(api, {"messages": [item(1, idempotency_key="e"), item(2, idempotency_key="e")]})
    assert other.status_code == 422 and "index 1" in other.json()["error"]["message"]
    assert Message.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_with_the_same_keys_store_each_message_once(api_key) -> None:  # noqa: ANN001
    batch = {"messages": [item(i, idempotency_key=f"c{i}") for i in range(50)]}

    def send(_: int) -> list[int]:
        client = factories.authenticated(api_key[1])
        try:
            response = post(client, batch)
            assert response.status_code == 202, response.json()
            return [r["id"] for r in response.json()["results"]]
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(send, range(4)))
    assert all(ids == answers[0] for ids in answers)
    assert Message.objects.count() == 50
    assert OutboxTask.objects.count() == 0


@pytest.mark.processes
def test_a_1000_message_batch_whose_web_is_killed_after_the_202_is_sent_exactly_once(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,
    web_port: int,  # noqa: ANN001
) -> None:
    stack.start_web(web_port)
    messages = [item(i, priority="normal") for i in range(1000)]
    response = requests.post(
        f"http://127.0.0.1:{web_port}{URL}",
        json={"messages": messages},
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=60,
    )
    stack.kill("web")  # SIGKILL right after the 202: the tasks may or may not have gone out
    assert response.status_code == 202, response.text
    ids = [r["id"] for r in response.json()["results"]]
    assert len(set(ids)) == 1000
    stack.start("worker-bulk")
    stack.start("beat")  # the outbox relay, for whatever the killed web had not published
    wait_until(lambda: Message.objects.filter(pk__in=ids, status="sent").count() == 1000, 90, "all 1000 sent")
    wait_until(lambda: not OutboxTask.objects.exists(), 20, "the outbox to be empty")
    received = Counter(rcpt for m in smtp.messages for rcpt in m.rcpt_tos)
    assert received == Counter(m["to"] for m in messages)  # every recipient once, none twice
