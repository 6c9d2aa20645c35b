"""A redis-server of a test's own, on a port of its own, that the test can restart: the process
goes away and comes back empty (no persistence), as a restart, an upgrade or an OOM kill does.
The machine's Redis, which other tests and runs share, is never touched."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from types import TracebackType

import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry

from delivery.testing.smtp_server import free_port
from tests.conftest import wait_until


class RedisServer:
    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="emailhub-redis-")
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis_lib.Redis:
        # No retries: redis-py's default retries a command whose connection closed, with backoff,
        # which made every SHUTDOWN (the server closes the connection) wait 4.5 s.
        return redis_lib.Redis(
            port=self.port, socket_connect_timeout=1, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self) -> None:
        subprocess.run(
            [
                self.binary or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "yes", "--dir", self.dir,
                "--logfile", f"{self.dir}/redis.log",
            ],
            check=True,
            timeout=10,
        )  # fmt: skip
        wait_until(self._answers, 10, f"redis-server on port {self.port} to answer")

    def stop(self) -> None:
        """`SHUTDOWN NOSAVE`: the server exits and its data is gone."""
        try:
            self.client().shutdown(nosave=True)
        except redis_lib.ConnectionError:
            pass  # the connection closes as the server exits (or it was not running)
        wait_until(lambda: not self._answers(), 10, f"redis-server on port {self.port} to exit")

    def restart(self) -> None:
        self.stop()
        self.start()
        self.restarts += 1

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis_lib.ConnectionError:
            return False
