"""PostgreSQL briefly unreachable, for real: the processes reach the test database through a TCP
proxy (tests/tcp_proxy.py) that the test cuts (every open connection reset, new ones refused)
and restores, as a restart or a failover looks to them. The test process itself keeps its own
direct connection, so it can accept messages and read the truth meanwhile."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from django.conf import settings
from django.db import connection

from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import Stack
from tests.conftest import wait_for_status, wait_until
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.processes

BODY = {"to": "ann@example.com", "subject": "Your code", "text": "123456", "priority": "critical"}


@pytest.fixture
def db_proxy(transactional_db) -> Iterator[TcpProxy]:  # noqa: ANN001
    db = settings.DATABASES["default"]
    with TcpProxy(int(db["PORT"] or 5432), db["HOST"] or "127.0.0.1") as proxy:
        yield proxy
    # The sessions the proxy carried end once PostgreSQL has read the reset; wait for that, or
    # dropping the test database at the end of the run would find them still there.
    wait_until(lambda: not _other_sessions(), 10, "the proxied sessions to end")


def _other_sessions() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, client_port, backend_start FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


def through(proxy: TcpProxy) -> dict[str, str]:
    """The environment that sends a process's database connections through `proxy`."""
    db = settings.DATABASES["default"]
    return {"DATABASE_URL": f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"}


def test_the_api_answers_503_with_retry_after_while_postgresql_is_unreachable_and_stores_nothing(
    stack: Stack,
    db_proxy: TcpProxy,
    api_key,  # noqa: ANN001
    web_port: int,
) -> None:
    stack.start_web(web_port, workers=1, extra_env=through(db_proxy))
    base, headers = f"http://127.0.0.1:{web_port}/api/v1", {"Authorization": f"Bearer {api_key[1]}"}
    first = requests.post(f"{base}/messages", json=BODY, headers=headers, timeout=10)
    assert first.status_code == 202
    assert db_proxy.connections >= 1  # the web process really goes through the proxy

    db_proxy.cut()
    refused = [
        requests.post(f"{base}/messages", json=BODY, headers=headers, timeout=10),
        requests.post(f"{base}/messages/batch", json={"messages": [BODY, BODY]}, headers=headers, timeout=10),
        requests.get(f"{base}/messages/{first.json()['id']}", headers=headers, timeout=10),
        requests.get(f"{base}/contacts", headers=headers, timeout=10),
    ]
    for response in refused:
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "5"
        assert response.headers["Content-Type"] == "application/json"
        error = response.json()["error"]
        assert error["status"] == 503 and error["code"] == "unavailable" and error["fields"] == {}

    db_proxy.restore()
    again = requests.post(f"{base}/messages", json=BODY, headers=headers, timeout=10)
    assert again.status_code == 202
    # The refused requests stored nothing: the two accepted messages and no more.
    assert sorted(Message.objects.values_list("pk", flat=True)) == sorted(
        [first.json()["id"], again.json()["id"]]
    )


def test_a_send_task_that_meets_an_unreachable_database_is_retried_within_seconds(
    stack: Stack,
    smtp: SMTPTestServer,
    db_proxy: TcpProxy,
    api,  # noqa: ANN001
) -> None:
    # No beat runs: nothing but the task's own retry can send these (before, the failed task was
    # acknowledged and the messages waited for the stranded-task probe, minutes later).
    worker = stack.start("worker-transactional", extra_env=through(db_proxy))
    db_proxy.cut()
    ids = [
        api.post("/api/v1/messages", {**BODY, "to": f"r{n}@example.com"}, format="json").json()["id"]
        for n in range(3)
    ]
    wait_until(lambda: worker.log().count("Retry in") >= 3, 30, "each send task to be retried")
    assert Message.objects.filter(pk__in=ids, status="queued").count() == 3

    db_proxy.restore()
    for message_id in ids:
        assert wait_for_status(message_id, "sent", timeout=40).attempts == 1
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == [
        "r0@example.com",
        "r1@example.com",
        "r2@example.com",
    ]


def test_a_batch_the_provider_accepted_is_recorded_once_postgresql_is_back_and_sent_once(
    stack: Stack,
    smtp: SMTPTestServer,
    db_proxy: TcpProxy,
    api,  # noqa: ANN001
) -> None:
    worker = stack.start("worker-transactional", extra_env=through(db_proxy))
    smtp.hold_data_replies()
    message_id = api.post("/api/v1/messages", BODY, format="json").json()["id"]
    wait_until(lambda: smtp.held == 1, 20, "the message to be at the SMTP server, unanswered")
    db_proxy.cut()  # PostgreSQL goes away while the provider has the message
    smtp.hold_data_replies(False)
    wait_until(lambda: "recording a batch: PostgreSQL unreachable" in worker.log(), 20, "a failed record")
    assert Message.objects.get(pk=message_id).status == "sending"

    db_proxy.restore()
    message = wait_for_status(message_id, "sent", timeout=30)
    assert message.attempts == 1 and smtp.count == 1
