"""The speed-ups that rely on a framework's private internals, one module each, each switchable.

The code a reader meets first (core, the apps) calls Django, DRF, Celery and kombu the way their
docs show. Where a measured gain needed more than that, the code lives here, and each module
opens with the framework behaviour it replaces, the gain measured (with its docs/performance.md
section), the test that pins it to the plain behaviour, and its switch. The switches are the
names in settings.EMAILHUB_FAST_PATHS (environment `EMAILHUB_FAST_PATHS`, `none` for all off);
with every one off the suite passes (tests/conftest.py runs the outbox, API and crash tests
both ways). A module here imports frameworks and `core`, never an app; nothing outside this
package uses a framework's private API (tests/test_import_rules.py).

- `publish`: the outbox's task messages built without send_task, over a producer kept per web
  thread (fastpaths/publish.py).
- `serializers`: DRF serializers built once per thread (fastpaths/serializers.py).
- `db_health`: the database connection's health check at most once a second per web connection
  (fastpaths/db_health.py).
- `tracking`: open pixels and tracked links answered before Django's stack (fastpaths/tracking.py).
"""

from __future__ import annotations

from django.conf import settings


def enabled(name: str) -> bool:
    """Whether the fast path `name` (one of settings.FAST_PATH_NAMES) is switched on."""
    if name not in settings.FAST_PATH_NAMES:
        raise ValueError(f"no fast path is called {name!r}")
    return name in settings.EMAILHUB_FAST_PATHS
