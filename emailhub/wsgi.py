from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")
django_application = get_wsgi_application()

# Imported after Django is set up (get_wsgi_application), as the tracking modules read settings.
import fastpaths  # noqa: E402
from core import outbox  # noqa: E402
from delivery.tracking import serve  # noqa: E402
from fastpaths import db_health, publish  # noqa: E402
from fastpaths.tracking import TrackingFastPath, WsgiApp  # noqa: E402

# A request that published its tasks does not wait for their outbox rows' DELETE (core/outbox.py).
outbox.delete_in_background()

application: WsgiApp = django_application
if fastpaths.enabled("tracking"):
    # Open pixels and tracked links answered before Django's middleware (fastpaths/tracking.py:
    # the same functions as the views, no session, no database); everything else is Django's.
    application = TrackingFastPath(django_application, serve.HITS)
if fastpaths.enabled("db_health"):
    # A connection health check at most once a second per connection (fastpaths/db_health.py).
    db_health.install()
if fastpaths.enabled("publish"):
    # Each web thread publishes its requests' tasks through a producer it keeps.
    publish.keep_producer_per_thread()
