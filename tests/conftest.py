"""Fixtures over real services: PostgreSQL, Redis, an SMTP server and emailhub's own processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_lib
from django.conf import settings
from rest_framework.test import APIClient

from delivery.models import ApiKey, Message
from delivery.providers import Guard, close_all
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer, free_port
from scripts.stack import Stack
from tests import factories


@pytest.fixture(scope="session")
def smtp_server() -> Iterator[SMTPTestServer]:
    with SMTPTestServer() as server:
        yield server


@pytest.fixture(scope="module")
def ses_server() -> Iterator[SESTestServer]:
    """A local Amazon SES (moto in server mode behind a fault proxy), one per test module."""
    with SESTestServer() as server:
        yield server


@pytest.fixture(scope="module")
def sendgrid_server() -> Iterator[SendGridTestServer]:
    """A local server with SendGrid's v3 mail/send contract, one per test module."""
    with SendGridTestServer() as server:
        yield server


@pytest.fixture
def smtp(smtp_server: SMTPTestServer, settings) -> Iterator[SMTPTestServer]:  # noqa: ANN001
    """The session's SMTP server, emptied, with this process's SMTP provider pointed at it."""
    from delivery.providers import close_all

    smtp_server.clear()
    settings.SMTP_PORT = smtp_server.port
    close_all()
    yield smtp_server
    close_all()
    smtp_server.clear()


@pytest.fixture(autouse=True)
def redis() -> Iterator[redis_lib.Redis]:
    """The test Redis database, empty: no queued task, breaker or bucket leaks between tests."""
    from core import redis_clients
    from delivery import breakers

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    breakers.reset_process_state()
    redis_clients.reset()
    yield client
    client.flushdb()
    breakers.reset_process_state()
    redis_clients.reset()
    client.close()


@pytest.fixture
def far_horizon(settings) -> None:  # noqa: ANN001
    """Some cases use fixed dates years ahead (a DST change, a zone's offset on a given day);
    the scheduling horizon (EMAILHUB_SCHEDULE_HORIZON_DAYS, tests/test_api_limits.py) is not
    what they test."""
    settings.EMAILHUB_SCHEDULE_HORIZON_DAYS = 36500


@pytest.fixture
def api_key(db) -> tuple[ApiKey, str]:  # noqa: ANN001
    # Every scope: the suite's tests exercise every endpoint with this one key.
    return factories.api_key()


@pytest.fixture
def api(api_key: tuple[ApiKey, str]) -> APIClient:
    return factories.authenticated(api_key[1])


def process_env(smtp_port: int, **extra: str) -> dict[str, str]:
    """The environment of an emailhub process a test starts: the test database and Redis
    database, the test SMTP server, plus `extra`."""
    db = settings.DATABASES["default"]
    return {
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SMTP_PORT": str(smtp_port),
        # The processes run the fast paths this test runs (the `fast_paths` fixture).
        "EMAILHUB_FAST_PATHS": ",".join(settings.EMAILHUB_FAST_PATHS) or "none",
        **extra,
    }


@pytest.fixture(params=["fast", "plain"])
def fast_paths(request: pytest.FixtureRequest, settings) -> str:  # noqa: ANN001
    """Run the test twice: with every fast path of fastpaths/ switched on, and with every one off
    (the plain send_task, DRF serializers and Django connection checks). A module asks for it with
    `pytest.mark.usefixtures("fast_paths")`, before any stack it starts (process_env passes it on)."""
    settings.EMAILHUB_FAST_PATHS = list(settings.FAST_PATH_NAMES) if request.param == "fast" else []
    settings.EMAILHUB_OUTBOX_PUBLISHER = settings.OUTBOX_PUBLISHERS[request.param]
    return str(request.param)


@pytest.fixture
def stack(
    transactional_db,
    smtp: SMTPTestServer,
    redis: redis_lib.Redis,
    tmp_path: Path,  # noqa: ANN001
) -> Iterator[Stack]:
    """emailhub processes (started by the test) on the test database; all stopped afterwards."""
    env = process_env(smtp.port, EMAILHUB_OUTBOX_GRACE_SECONDS=str(settings.EMAILHUB_OUTBOX_GRACE_SECONDS))
    stack = Stack(env=env, log_dir=tmp_path / "logs")
    try:
        yield stack
    finally:
        # The test is over: nothing a warm shutdown would finish is looked at any more.
        stack.stop_all(graceful=False)


@pytest.fixture
def web_port() -> int:
    return free_port()


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (a Celery worker's prefork children, gunicorn's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class CountedGuard(Guard):
    """Allows message `id` `allowed[id]` times and then never again (ids not named: always): a
    claim lost at a chosen step of a provider's send. `asked` lists every question, in order."""

    def __init__(self, allowed: dict[int, int]) -> None:
        self.left = dict(allowed)
        self.asked: list[int] = []

    def allows(self, message_id: int) -> bool:
        self.asked.append(message_id)
        if message_id not in self.left:
            return True
        if self.left[message_id] <= 0:
            return False
        self.left[message_id] -= 1
        return True


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def wait_for_status(message_id: int, status: str, timeout: float = 20.0) -> Message:
    wait_until(
        lambda: Message.objects.filter(pk=message_id, status=status).exists(),
        timeout,
        f"message {message_id} to be {status} (is {Message.objects.filter(pk=message_id).values_list('status', flat=True).first()})",
    )
    return Message.objects.get(pk=message_id)


@pytest.fixture
def through(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
    ses_server: SESTestServer,
    sendgrid_server: SendGridTestServer,
) -> Iterator[Callable[..., None]]:
    """`through(name)` makes the transactional pool send through that one provider, each
    pointed at its local server (`through("smtp", port)`: another SMTP test server's port)."""
    ses_server.reset()
    sendgrid_server.clear()
    settings.SES_ENDPOINT_URL = ses_server.endpoint_url
    settings.SES_ACCESS_KEY_ID = settings.SES_SECRET_ACCESS_KEY = "test"
    settings.SENDGRID_API_KEY = sendgrid_server.api_key
    settings.SENDGRID_HOST = sendgrid_server.url

    def choose(name: str, port: int | None = None) -> None:
        settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = [name]
        if port is not None:
            settings.SMTP_PORT = port
        close_all()

    yield choose
    close_all()
    ses_server.reset()
    sendgrid_server.clear()
