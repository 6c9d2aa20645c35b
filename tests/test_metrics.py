"""/metrics (Prometheus, multiprocess), /readyz and /healthz.

The counting test runs the real thing: gunicorn with 2 workers and a Celery prefork worker with 2
children sharing the stack's metrics directory, messages sent through the API to the SMTP test
server, and the scraped counters compared with the database, before and after a Celery child
and a gunicorn worker are SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from campaigns.models import Suppression
from core import metrics
from core.metrics_dir import files_in_use, prepare, process_identifier
from delivery.models import Message
from delivery.services.events import ProviderEvent, record_events
from delivery.services.sending import send_messages
from delivery.services.sweeps import requeue_stale_sending
from delivery.testing.smtp_server import SMTPTestServer, free_port
from emailhub.env import env_networks
from scripts.stack import Stack
from tests.conftest import children, wait_until

# --- access ---------------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(EMAILHUB_METRICS_ALLOW=[], EMAILHUB_METRICS_TOKEN="s3cret-token")
def test_metrics_refused_without_the_token_when_no_address_is_allowed(client: Client) -> None:
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "s3cret-token"}):
        refused = client.get("/metrics", **headers)
        assert refused.status_code == 403 and refused.content == b""
    allowed = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert allowed.status_code == 200
    assert allowed["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"# TYPE emailhub_emails_sent_total counter" in allowed.content


@pytest.mark.django_db
def test_metrics_allowed_from_loopback_by_default_and_refused_elsewhere(client: Client) -> None:
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    far = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert far.status_code == 403 and far.content == b""
    with override_settings(EMAILHUB_METRICS_ALLOW=["203.0.113.0/24"]):
        assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 200
        assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    # No token configured: no Authorization header opens it.
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer ").status_code == 403


@pytest.mark.django_db
@override_settings(EMAILHUB_TRUSTED_PROXIES=["127.0.0.1/32"])
def test_behind_a_trusted_proxy_the_allow_list_decides_on_the_forwarded_client(client: Client) -> None:
    # The proxy is on loopback, like the default allow-list: its clients are not.
    refused = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert refused.status_code == 403 and refused.content == b""
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200  # a scraper beside it
    with override_settings(EMAILHUB_METRICS_ALLOW=["203.0.113.0/24"]):
        forwarded = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
        assert forwarded.status_code == 200
        # The same header from a peer we do not trust is the client's own claim: ignored.
        spoofed = client.get("/metrics", REMOTE_ADDR="198.51.100.3", HTTP_X_FORWARDED_FOR="203.0.113.9")
        assert spoofed.status_code == 403


def test_metrics_allow_list_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMAILHUB_METRICS_ALLOW", "10.0.0.0/8, 192.168.1.7")
    assert env_networks("EMAILHUB_METRICS_ALLOW", []) == ["10.0.0.0/8", "192.168.1.7/32"]
    monkeypatch.setenv("EMAILHUB_METRICS_ALLOW", "none")
    assert env_networks("EMAILHUB_METRICS_ALLOW", ["127.0.0.0/8"]) == []
    monkeypatch.setenv("EMAILHUB_METRICS_ALLOW", "10.0.0.0/33")
    with pytest.raises(ImproperlyConfigured, match="EMAILHUB_METRICS_ALLOW"):
        env_networks("EMAILHUB_METRICS_ALLOW", [])


# --- /healthz and /readyz -------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_checks_no_dependency(client: Client, django_assert_num_queries) -> None:  # noqa: ANN001
    with django_assert_num_queries(0), override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ok_when_postgres_redis_and_the_broker_answer(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert {name: check["status"] for name, check in body["checks"].items()} == {
        "postgres": "ok",
        "redis": "ok",
        "broker": "ok",
    }


@pytest.mark.django_db
def test_readyz_checks_a_rabbitmq_broker_too(client: Client) -> None:
    with override_settings(CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//"):
        assert client.get("/readyz").json()["checks"]["broker"]["status"] == "ok"
    with override_settings(CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}//"):
        response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["broker"]


@pytest.mark.django_db
def test_readyz_is_503_naming_redis_when_redis_is_unreachable(client: Client) -> None:
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["failed"] == ["redis"]
    assert body["checks"]["redis"] == {"status": "failed", "error": "ConnectionError"}
    assert body["checks"]["postgres"]["status"] == body["checks"]["broker"]["status"] == "ok"


@pytest.mark.django_db
def test_readyz_is_503_naming_the_broker_when_its_url_is_closed(client: Client) -> None:
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0"):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]
    assert response.json()["checks"]["redis"]["status"] == "ok"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.django_db
def test_readyz_answers_within_its_timeout_when_redis_hangs(client: Client, silent_server: int) -> None:
    with override_settings(
        REDIS_URL=f"redis://127.0.0.1:{silent_server}/0", EMAILHUB_READYZ_TIMEOUT_SECONDS=0.3
    ):
        response = client.get("/readyz")
    # Given up at its own timeout (the socket's 0.3 s, or the check's future at 0.3 s), never the
    # socket's default: either way the error names a timeout, not a refused or reset connection.
    assert response.status_code == 503 and response.json()["failed"] == ["redis"]
    assert response.json()["checks"]["redis"]["error"] in {"TimeoutError", "timeout"}


# --- the multiprocess directory -----------------------------------------------------------------


def test_directory_is_wiped_at_start_only_when_no_running_process_uses_it(tmp_path: Path) -> None:
    dead_pid = 2**22 + 17  # above any pid_max default: never alive
    host = process_identifier().rsplit("-", 1)[0]
    stale = tmp_path / f"counter_{host}-{dead_pid}.db"
    stale.write_bytes(b"x")
    assert files_in_use(tmp_path) == []
    assert prepare(tmp_path) is True and not stale.exists()

    stale.write_bytes(b"x")
    live = tmp_path / f"counter_{host}-{os.getppid()}.db"  # pytest's parent: alive
    live.write_bytes(b"x")
    assert prepare(tmp_path) is False and stale.exists() and live.exists()
    live.unlink()
    other_host = tmp_path / f"histogram_elsewhere-{dead_pid}.db"  # cannot be checked from here
    other_host.write_bytes(b"x")
    assert prepare(tmp_path) is False and other_host.exists()


def test_each_stack_gets_a_fresh_metrics_directory_of_its_own(tmp_path: Path) -> None:
    first, second = Stack(env={}, log_dir=tmp_path / "a"), Stack(env={}, log_dir=tmp_path / "b")
    try:
        assert first.metrics_dir != second.metrics_dir
        assert first.env["PROMETHEUS_MULTIPROC_DIR"] == str(first.metrics_dir)
        assert list(first.metrics_dir.iterdir()) == []
    finally:
        first.stop_all()
        second.stop_all()
    assert not first.metrics_dir.exists()
    named = Stack(env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "m")}, log_dir=tmp_path / "c")
    named.stop_all()
    assert named.metrics_dir == tmp_path / "m"


# --- counting across processes --------------------------------------------------------------


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200, response.text[:500]
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def counted_by(metrics_dir: Path, pids: list[int]) -> list[int]:
    """The pids that have a counter file: processes that counted something."""
    return [pid for pid in pids if (metrics_dir / f"counter_{process_identifier(pid)}.db").exists()]


def send(port: int, key: str, n: int, priority: str) -> None:
    for i in range(n):
        # A connection per request (no session): the two gunicorn workers share the requests.
        response = requests.post(
            f"http://127.0.0.1:{port}/api/v1/messages",
            json={"to": f"reader{i}@example.com", "subject": "code", "text": "1234", "priority": priority},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert response.status_code == 202, response.text


def db_sent() -> Counter[str]:
    return Counter(Message.objects.filter(status="sent").values_list("priority", flat=True))


@pytest.mark.processes
def test_sent_counter_summed_across_processes_equals_the_database_and_survives_killed_workers(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,  # noqa: ANN001
    web_port: int,
) -> None:
    web = stack.start_web(web_port, workers=2)
    worker = stack.start("worker-transactional")  # prefork, --concurrency 2
    key = api_key[1]
    send(web_port, key, 12, "critical")
    send(web_port, key, 8, "high")
    wait_until(lambda: sum(db_sent().values()) == 20, 60, "20 messages sent")
    for _ in range(10):
        requests.get(f"http://127.0.0.1:{web_port}/t/o/not-a-token", timeout=10)

    samples = scrape(web_port)
    sent = db_sent()
    assert total(samples, "emailhub_emails_sent_total", outcome="sent") == sum(sent.values()) == 20
    for priority in ("critical", "high"):
        assert (
            total(samples, "emailhub_emails_sent_total", outcome="sent", priority=priority) == sent[priority]
        )
        assert total(samples, "emailhub_queue_latency_seconds_count", priority=priority) == sent[priority]
    assert total(samples, "emailhub_emails_sent_total", outcome="sent", provider="smtp") == 20
    assert total(samples, "emailhub_provider_send_seconds_count", provider="smtp") >= 1
    assert total(samples, "emailhub_tracking_requests_total", kind="open", outcome="unknown_token") == 10
    assert total(samples, "emailhub_queue_depth", priority="critical", state="pending") == 0
    assert total(samples, "emailhub_circuit_state", provider="smtp") == 0
    labels = [value for series in samples.values() for lab, _ in series for value in lab.values()]
    assert labels and not [value for value in labels if "@" in value]

    # SIGKILL a Celery child and a gunicorn worker that have counted: no goodbye, no cleanup.
    celery_children = counted_by(stack.metrics_dir, children(worker.popen.pid))
    web_workers = counted_by(stack.metrics_dir, children(web.popen.pid))
    assert celery_children and web_workers
    os.kill(celery_children[0], signal.SIGKILL)
    os.kill(web_workers[0], signal.SIGKILL)
    wait_until(
        lambda: len(children(web.popen.pid)) == 2 and len(children(worker.popen.pid)) == 2, 30, "respawn"
    )
    wait_until(lambda: _answers(web_port), 30, "web answering")

    send(web_port, key, 6, "critical")
    wait_until(lambda: sum(db_sent().values()) == 26, 60, "26 messages sent")
    samples = scrape(web_port)
    assert total(samples, "emailhub_emails_sent_total", outcome="sent") == sum(db_sent().values()) == 26
    assert total(samples, "emailhub_tracking_requests_total", kind="open", outcome="unknown_token") == 10


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


# --- where the pipeline records (in this process: prometheus_client's in-memory values) ------


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db(transaction=True)
def test_a_batch_counts_each_outcome_once_by_provider_priority_and_outcome(smtp: SMTPTestServer) -> None:
    Suppression.objects.create(email="gone@example.com", reason="manual")
    smtp.reply_for("bounce@example.com", "550 5.1.1 no such user")
    smtp.reply_for("busy@example.com", "451 4.3.0 mailbox busy")
    ids = [
        Message.objects.create(to_email=to, subject="Hi", text="x", priority="high", status="queued").pk
        for to in (
            "a@example.com",
            "b@example.com",
            "gone@example.com",
            "bounce@example.com",
            "busy@example.com",
        )
    ]
    names = [
        "emailhub_emails_sent_total",
        "emailhub_queue_latency_seconds_count",
        "emailhub_provider_send_seconds_count",
    ]
    before = {
        "sent": value(names[0], provider="smtp", priority="high", outcome="sent"),
        "failed": value(names[0], provider="none", priority="high", outcome="failed"),
        "suppressed": value(names[0], provider="none", priority="high", outcome="suppressed"),
        "retried": value(names[0], provider="none", priority="high", outcome="retried"),
        "latency": value(names[1], priority="high"),
        "calls": value(names[2], provider="smtp"),
    }
    report = send_messages(ids)
    assert (report.sent, report.failed, report.suppressed, report.retrying) == (2, 1, 1, 1)
    assert value(names[0], provider="smtp", priority="high", outcome="sent") - before["sent"] == 2
    assert value(names[0], provider="none", priority="high", outcome="failed") - before["failed"] == 1
    assert value(names[0], provider="none", priority="high", outcome="suppressed") - before["suppressed"] == 1
    assert value(names[0], provider="none", priority="high", outcome="retried") - before["retried"] == 1
    assert value(names[1], priority="high") - before["latency"] == 2  # one observation per sent message
    assert value(names[2], provider="smtp") - before["calls"] == 1  # one provider call for the batch

    # A redelivered task moves no row: it counts nothing.
    Message.objects.filter(pk=ids[0]).update(status="queued")  # as if requeued, then raced:
    Message.objects.filter(pk=ids[0]).update(status="sent")
    send_messages(ids)
    assert value(names[0], provider="smtp", priority="high", outcome="sent") - before["sent"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_message_a_dead_worker_left_in_sending_counts_as_requeued() -> None:
    before = value("emailhub_emails_sent_total", provider="none", priority="low", outcome="requeued")
    Message.objects.create(
        to_email="ann@example.com",
        subject="Hi",
        priority="low",
        status="sending",
        attempts=1,
        claimed_at=timezone.now() - timedelta(hours=1),
    )
    assert requeue_stale_sending() == 1
    assert (
        value("emailhub_emails_sent_total", provider="none", priority="low", outcome="requeued") - before == 1
    )


@pytest.mark.django_db(transaction=True)
def test_recorded_events_count_new_and_duplicates_and_engagement_by_class() -> None:
    message = Message.objects.create(to_email="ann@example.com", subject="Hi", status="sent", provider="ses")
    at = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def event(event_id: str, kind: str, **fields: object) -> ProviderEvent:
        return ProviderEvent(
            provider="ses", event_id=event_id, kind=kind, occurred_at=at, message_id=message.pk, **fields
        )

    keys = {
        "delivered_new": (
            "emailhub_provider_events_total",
            {"provider": "ses", "kind": "delivered", "outcome": "new"},
        ),
        "delivered_dup": (
            "emailhub_provider_events_total",
            {"provider": "ses", "kind": "delivered", "outcome": "duplicate"},
        ),
        "human": (
            "emailhub_tracking_hits_recorded_total",
            {"provider": "ses", "kind": "opened", "class": "human"},
        ),
        "machine": (
            "emailhub_tracking_hits_recorded_total",
            {"provider": "ses", "kind": "opened", "class": "machine"},
        ),
    }
    before = {k: value(n, **lab) for k, (n, lab) in keys.items()}
    batch = [
        event("d1", "delivered"),
        event(
            "o1", "opened", user_agent="Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15"
        ),
        event("o2", "opened", classification="machine"),
    ]
    record_events(batch)
    record_events(batch[:1])  # the provider retried: a duplicate
    after = {k: value(n, **lab) - before[k] for k, (n, lab) in keys.items()}
    assert after == {"delivered_new": 1, "delivered_dup": 1, "human": 1, "machine": 1}


@pytest.mark.django_db
def test_tracking_requests_are_counted_by_kind_and_outcome(client: Client) -> None:
    before = value("emailhub_tracking_requests_total", kind="open", outcome="unknown_token")
    clicks = value("emailhub_tracking_requests_total", kind="click", outcome="unknown_token")
    assert client.get("/t/o/forged").status_code == 200
    assert client.get("/t/c/forged").status_code == 404
    assert value("emailhub_tracking_requests_total", kind="open", outcome="unknown_token") - before == 1
    assert value("emailhub_tracking_requests_total", kind="click", outcome="unknown_token") - clicks == 1


@pytest.mark.django_db
def test_webhook_requests_are_counted_by_provider_and_outcome_never_by_a_path_of_anyones(
    client: Client,
) -> None:
    # No verification key configured in the tests' settings: SendGrid's webhook answers 503.
    unavailable = value("emailhub_webhook_requests_total", provider="sendgrid", outcome="unavailable")
    unknown = value("emailhub_webhook_requests_total", provider="unknown", outcome="unknown_provider")
    client.post("/api/v1/webhooks/sendgrid", data="[]", content_type="application/json")
    client.post("/api/v1/webhooks/someone@example.com", data="[]", content_type="application/json")
    assert (
        value("emailhub_webhook_requests_total", provider="sendgrid", outcome="unavailable") - unavailable
        == 1
    )
    assert (
        value("emailhub_webhook_requests_total", provider="unknown", outcome="unknown_provider") - unknown
        == 1
    )


def test_skipped_webhook_events_are_counted_by_provider_and_a_reason_from_a_bounded_set() -> None:
    from delivery.webhooks.base import SKIP_REASONS, EventBatch

    batch = EventBatch("sendgrid")
    before = value("emailhub_webhook_events_skipped_total", provider="sendgrid", reason="bad_recipient")
    batch.skip("bad_recipient", "event 1 of 1", "no email address")
    metrics.count_webhook_skips("sendgrid", batch.skipped)
    assert (
        value("emailhub_webhook_events_skipped_total", provider="sendgrid", reason="bad_recipient") - before
        == 1
    )
    # A reason is one of a few words, never something taken from the request.
    assert SKIP_REASONS == {
        "not_an_object",
        "missing_field",
        "bad_recipient",
        "recipient_too_long",
        "unstorable",
    }
    with pytest.raises(ValueError, match="unknown skip reason"):
        batch.skip("someone@example.com", "event 1 of 1", "")
