"""Settings of the storm reference (bench/reference/storm.py): Django's defaults, no database.

The SMTP sink's port comes from SMTP_PORT and the broker from CELERY_BROKER_URL, as for
emailhub's processes in the same bench run.
"""

from __future__ import annotations

import os

SECRET_KEY = "bench-reference-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "bench.reference.storm"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
USE_TZ = True
DATABASES: dict[str, dict[str, str]] = {}
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = "127.0.0.1"
EMAIL_PORT = int(os.environ.get("SMTP_PORT", "1025"))
DEFAULT_FROM_EMAIL = "noreply@example.com"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
