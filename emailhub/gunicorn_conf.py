"""gunicorn's configuration file for the web process (`gunicorn -c emailhub/gunicorn_conf.py …`).

Only the Prometheus multiprocess hooks (core/metrics_dir.py): the directory prepared before the
first worker forks, each exited worker marked dead. Everything else stays on the command line
(scripts/stack.py PROCESSES, README, docker-compose.yml), where it is visible.

gunicorn reads this file by path, before the application is imported: it imports nothing of
Django.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.metrics_dir import MULTIPROC_ENV, mark_dead, prepare  # noqa: E402


def on_starting(server: Any) -> None:
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        # Several workers without a shared directory would each show their own counts. A
        # private one keeps /metrics right for the web; the Celery workers' counts need the
        # variable set, to the same directory, for them too (README "Metrics").
        directory = tempfile.mkdtemp(prefix="emailhub-metrics-")
        os.environ[MULTIPROC_ENV] = directory
        server.log.warning(
            "%s not set: web metrics in %s; set it (shared with the Celery workers) to see theirs",
            MULTIPROC_ENV,
            directory,
        )
    wiped = prepare(directory)
    server.log.info("metrics directory %s (%s)", directory, "wiped" if wiped else "kept: in use")


def child_exit(server: Any, worker: Any) -> None:
    mark_dead(worker.pid)
