"""Settings for the test run: the real services, on a Redis database of their own."""

import os

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
os.environ.setdefault("EMAILHUB_OUTBOX_GRACE_SECONDS", "0.5")

from emailhub.settings import *  # noqa: E402,F403
