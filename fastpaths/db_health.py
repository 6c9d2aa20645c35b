"""The web process checks a persistent database connection at most once a second, not per request.

With CONN_HEALTH_CHECKS Django runs `SELECT 1` before the first query of every request: one of
the accept path's round trips (7% of POST /api/v1/messages in issue 13's profile). Here a
connection that passed a check less than `INTERVAL` seconds ago skips it. What that risks: a
connection the server dropped within that second fails one request (a JSON 500, nothing
accepted); Django then closes it at the request's end (errors_occurred) and the next request
connects afresh. Workers keep Django's check before every task. Installed by emailhub/wsgi.py.

Replaces: Django's CONN_HEALTH_CHECKS before each request's first query (it sets the connection's
undocumented `health_check_done` flag). Gain: one round trip of POST /api/v1/messages' 3-4
(docs/performance.md "The accept path"). Pinned by tests/test_db_health.py. Off switch: leave
`db_health` out of EMAILHUB_FAST_PATHS (emailhub/wsgi.py then does not install it).
"""

from __future__ import annotations

import time
from typing import Any

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
