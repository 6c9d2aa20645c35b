"""Redis restarting under emailhub: the process goes away and comes back empty (no persistence),
on a redis-server of the test's own (tests/redis_server.py). Nothing is lost, every message goes
once, no worker dies of it, and recovery does not need any one worker pool."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks
from kombu import Connection, Exchange, Queue
from kombu.transport.redis import Transport as KombusRedisTransport

from delivery.models import Message
from delivery.testing.smtp_server import SMTPTestServer
from emailhub import broker as emailhub_broker
from emailhub.periodic import ensure_periodic_tasks
from scripts.stack import ROOT, Stack
from tests.conftest import wait_until
from tests.factories import make_audience, make_campaign
from tests.redis_server import RedisServer

QUEUE = Queue("t", Exchange("t", type="direct"), routing_key="t")


def channel_with_an_unacked_task(url: str, transport: type) -> tuple[Connection, object]:
    """A connection whose channel has taken one task and not acknowledged it (as a worker's
    channel has while the task runs)."""
    connection = Connection(url, transport=transport)
    with connection.Producer() as producer:
        producer.publish({"n": 1}, exchange=QUEUE.exchange, routing_key="t", declare=[QUEUE])
    taken: list[object] = []
    channel = connection.channel()
    connection.Consumer(
        [QUEUE], channel=channel, callbacks=[lambda _, m: taken.append(m)], prefetch_count=2
    ).consume()
    connection.drain_events(timeout=2)
    assert len(taken) == 1
    return connection, channel


def test_a_channel_closed_after_its_transport_was_detached_restores_its_unacked_task() -> None:
    # The state in which a Redis restart killed workers: Celery's recovery had already collected
    # the connection (kombu sets `transport.client = None`) when the task channel was closed.
    with RedisServer() as redis_server:
        connection, channel = channel_with_an_unacked_task(redis_server.url, emailhub_broker.Transport)
        connection.transport.client = None
        channel.close()  # kombu's own: AttributeError, and Celery's "Unrecoverable error"
        assert redis_server.client().llen("t") == 1  # the task is back in its queue


def test_kombus_own_redis_transport_still_fails_that_way_so_emailhubs_mend_is_still_needed() -> None:
    # When a kombu release fixes this, this test fails: delete emailhub/broker.py then.
    with RedisServer() as redis_server:
        connection, channel = channel_with_an_unacked_task(redis_server.url, KombusRedisTransport)
        connection.transport.client = None
        with pytest.raises(AttributeError, match="hostname"):
            channel.close()


def test_every_redis_url_uses_emailhubs_transport() -> None:
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0"):
        assert isinstance(Connection(url).transport, emailhub_broker.Transport)
    assert not isinstance(Connection("amqp://guest@127.0.0.1//").transport, emailhub_broker.Transport)


def alive(nodename: str, max_age: float, directory: Path) -> bool:
    """The worker health check, as compose and Kubernetes run it (in the worker's environment)."""
    check = [sys.executable, "-m", "core.liveness", nodename, "--max-age", str(max_age)]
    env = {**os.environ, "EMAILHUB_WORKER_LIVENESS_DIR": str(directory)}
    return subprocess.run(check, cwd=ROOT, env=env, capture_output=True, timeout=30).returncode == 0


def reconcile_every(seconds: int) -> None:
    """Beat's reconcile tick this often (an operator's edit, as in the admin)."""
    ensure_periodic_tasks()
    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    PeriodicTask.objects.filter(task="scheduling.reconcile").update(interval=interval)
    PeriodicTasks.update_changed()


@pytest.mark.processes
def test_redis_restarts_under_a_running_stack_lose_nothing_kill_no_worker_and_need_no_one_pool(
    stack: Stack,
    smtp: SMTPTestServer,
    api_key,  # noqa: ANN001
    web_port: int,
    tmp_path: Path,
) -> None:
    size = 800
    with RedisServer() as redis_server:
        env = {
            "REDIS_URL": redis_server.url,
            "CELERY_BROKER_URL": redis_server.url,
            "EMAILHUB_WORKER_LIVENESS_SECONDS": "0.5",
            "EMAILHUB_WORKER_LIVENESS_DIR": str(tmp_path),
            # Slow enough (64/s for the campaign) that it is still sending at the second restart.
            "SMTP_MAX_SEND_RATE": "80",
        }
        reconcile_every(2)
        campaign = make_campaign(make_audience(size, prefix="c"))
        stack.start_web(web_port, workers=1, extra_env=env)
        for name in ("worker-transactional", "worker-bulk", "beat", "scheduler"):
            stack.start(name, extra_env=env, timeout=60)
        api, headers = f"http://127.0.0.1:{web_port}/api/v1", {"Authorization": f"Bearer {api_key[1]}"}

        def post(n: int, **extra: str) -> int:
            body = {
                "to": f"t{n}@example.com",
                "subject": "code",
                "text": "1",
                "priority": "critical",
                **extra,
            }
            response = requests.post(f"{api}/messages", json=body, headers=headers, timeout=30)
            assert response.status_code == 202, response.text
            return int(response.json()["id"])

        scheduled = requests.post(
            f"{api}/campaigns/{campaign.pk}/schedule", json={"type": "immediate"}, headers=headers, timeout=30
        )
        assert scheduled.status_code == 200, scheduled.text
        for n in range(20):
            post(n)
        due = (timezone.now() + timedelta(seconds=8)).isoformat()
        for n in range(20, 30):
            post(n, send_at=due)  # due after the first restart: its index entry is lost with Redis
        wait_until(
            lambda: Message.objects.filter(campaign=campaign, status="sent").count() >= 200,
            60,
            "the campaign to be under way",
        )

        # 1. Redis goes away with the campaign in flight. A worker away from its broker is
        # reported not alive, and alive again once it has reconnected.
        redis_server.stop()
        wait_until(lambda: not alive("bulk@%h", 2, tmp_path), 30, "the bulk worker's health check to fail")
        for n in range(30, 33):
            post(n)  # accepted while Redis is away: the relay publishes them later
        redis_server.start()
        wait_until(
            lambda: alive("bulk@%h", 2, tmp_path) and alive("transactional@%h", 2, tmp_path),
            60,
            "both workers to reconnect",
        )

        # 2. Again, with the transactional pool dead: the bulk pool alone does the housekeeping
        # (the reconciler's republish of every queued message, the schedule index rebuilt).
        stack.kill("worker-transactional")
        for n in range(33, 38):
            post(n)
        due = (timezone.now() + timedelta(seconds=4)).isoformat()
        late = [post(n, send_at=due) for n in range(38, 43)]
        assert Message.objects.filter(campaign=campaign, status="sent").count() < size  # still sending
        redis_server.restart()
        wait_until(
            lambda: Message.objects.filter(campaign=campaign, status="sent").count() == size,
            120,
            "the whole campaign to be sent by the bulk pool",
        )
        # The scheduled ones were dispatched from the index the bulk pool's reconciler rebuilt;
        # with no transactional worker they wait in their queue.
        wait_until(lambda: Message.objects.filter(pk__in=late, status="queued").count() == 5, 30, "dispatch")
        stack.start("worker-transactional", extra_env=env)  # what compose or systemd would do
        wait_until(
            lambda: not Message.objects.exclude(status="sent").exists(), 90, "every message to be sent"
        )

        dead = [key for key, process in stack.processes.items() if not process.alive]
        assert dead == [], "\n".join(stack.processes[key].log()[-3000:] for key in dead)
        for key in ("worker-transactional", "worker-bulk"):
            assert "Unrecoverable error" not in stack.processes[key].log()
        received = Counter(m.rcpt_tos[0] for m in smtp.messages)
        assert len(received) == size + 43 and set(received.values()) == {1}  # every one, each once
