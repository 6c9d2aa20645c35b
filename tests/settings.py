"""Settings for the test run: the real services, on a Redis database of their own."""

import os

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
os.environ.setdefault("EMAILHUB_OUTBOX_GRACE_SECONDS", "0.5")
# In-process tests dispatch outbound events step by step: no wait between steps.
os.environ.setdefault("EMAILHUB_WEBHOOKS_DISPATCH_GATHER_SECONDS", "0")

from emailhub.settings import *  # noqa: E402,F403

# The test client renders admin pages in this process without serving /static/: plain names,
# no manifest needed. The gunicorn processes the tests start use emailhub.settings (hashed names,
# WhiteNoise), and scripts/stack.py collects the static files before it starts one.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
