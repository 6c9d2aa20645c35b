"""A Celery worker's liveness, for Docker's and Kubernetes' health checks.

A worker's main process can be running and still do nothing: reconnecting to a broker that is not
coming back, or stuck. So a worker proves it is alive by touching a file of its own from its
consumer's event loop, every EMAILHUB_WORKER_LIVENESS_SECONDS, and only while it is connected and
consuming: the step starts after the task consumer and is stopped, with every other consumer
step, while the consumer reconnects. The check reads the file's age:

    python -m core.liveness transactional@%h            # exit 0: alive, 1: not
    python -m core.liveness bulk@%h --max-age 60

The node name is the worker's `-n` (Celery's `%h`, `%n` and `%d` expand as they do there). No
Django set-up, no broker round trip: the check is cheap enough to run every few seconds. A worker
that exits (Celery gives up reconnecting after `broker_connection_max_retries`, or crashes) is
restarted by what runs it: compose's `restart: unless-stopped`, systemd's `Restart=always`
(deploy/systemd/), Kubernetes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import bootsteps
from celery.utils.nodenames import host_format
from django.conf import settings

# Defaults shared by the worker (settings) and the check (which reads the environment itself).
MAX_AGE_SECONDS = 60.0
DIR_ENV = "EMAILHUB_WORKER_LIVENESS_DIR"


def liveness_file(nodename: str, directory: str | None = None) -> Path:
    """Where the worker called `nodename` (expanded, e.g. transactional@host1) keeps its file."""
    folder = directory or os.environ.get(DIR_ENV) or tempfile.gettempdir()
    safe = "".join(c if c.isalnum() or c in "@.-_" else "_" for c in nodename)
    return Path(folder) / f"emailhub-worker-{safe}.alive"


class Heartbeat(bootsteps.StartStopStep):
    """A consumer step: touch the worker's liveness file while the consumer is connected."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.path = liveness_file(parent.hostname, settings.EMAILHUB_WORKER_LIVENESS_DIR)
        self.interval = settings.EMAILHUB_WORKER_LIVENESS_SECONDS
        self.tref: Any = None

    def start(self, parent: Any) -> None:
        self._touch()
        self.tref = parent.timer.call_repeatedly(self.interval, self._touch)

    def stop(self, parent: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)
        self.path.unlink(missing_ok=True)

    def _touch(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()


def check(nodename: str, max_age: float, directory: str | None = None) -> tuple[bool, str]:
    """(alive, why) for the worker called `nodename` (with Celery's %h/%n/%d)."""
    path = liveness_file(host_format(nodename), directory)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False, f"{path} does not exist: the worker is not running or not connected yet"
    if age > max_age:
        return False, f"{path} is {age:.0f} s old (more than {max_age:.0f} s): the worker is not consuming"
    return True, f"{path} is {age:.1f} s old"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.liveness", description=__doc__.split("\n")[0])
    parser.add_argument("nodename", help="the worker's -n, e.g. transactional@%%h")
    parser.add_argument(
        "--max-age", type=float, default=MAX_AGE_SECONDS, help="seconds (default %(default)s)"
    )
    options = parser.parse_args(argv)
    if options.max_age <= 0:
        parser.error("--max-age must be a positive number of seconds")
    alive, why = check(options.nodename, options.max_age)
    print(("alive: " if alive else "not alive: ") + why, file=sys.stdout if alive else sys.stderr)
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
