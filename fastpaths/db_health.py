"""A persistent database connection is checked at most once a second, not per request or task.

With CONN_HEALTH_CHECKS Django runs `SELECT 1` before the first query of every request: one of
the accept path's round trips (7% of POST /api/v1/messages in issue 13's profile), and, since the
workers re-arm it before every task as Django does before every request (emailhub/celery.py),
one of a send task's (a fifth of its PostgreSQL round trips, issue 20). Here a connection that
passed a check less than `INTERVAL` seconds ago skips it. What that risks: a connection the
server dropped within that second fails one request (a JSON 503, nothing accepted) or one task
(retried within seconds: core/outages.py TASK_RETRY, a claim that failed claimed nothing);
Django then closes it (errors_occurred) and the next request or task connects afresh.
Installed by emailhub/wsgi.py (web) and emailhub/celery.py (workers, `install_worker`).

Replaces: Django's CONN_HEALTH_CHECKS before each request's and task's first query (it sets the
connection's undocumented `health_check_done` flag). Gain: one round trip of POST
/api/v1/messages' 3-4 (docs/performance.md "The accept path") and of a send task's 5 (issue 20).
Pinned by tests/test_db_health.py. Off switch: leave
`db_health` out of EMAILHUB_FAST_PATHS (emailhub/wsgi.py then does not install it).
"""

from __future__ import annotations

import time
from typing import Any

from celery.signals import task_prerun
from django.core.signals import request_started
from django.db import connections

INTERVAL = 1.0


def _skip_recent_check(**_: Any) -> None:
    # Runs after Django's close_old_connections (connected first), which re-arms the check.
    now = time.monotonic()
    conn: Any  # django-stubs does not declare the health-check attributes
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.health_check_done:
            continue
        if now - getattr(conn, "emailhub_checked_at", -INTERVAL) < INTERVAL:
            conn.health_check_done = True
        else:
            conn.emailhub_checked_at = now  # this request's first query runs the check


def install() -> None:
    request_started.connect(_skip_recent_check, dispatch_uid="fastpaths.db_health")


def install_worker() -> None:
    """The same before every Celery task, after emailhub.celery's close_old_connections (which
    re-arms the check): task_prerun's receivers run in the order they were connected."""
    task_prerun.connect(_skip_recent_check, dispatch_uid="fastpaths.db_health.worker", weak=False)
