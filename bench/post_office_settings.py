"""Minimal Django settings for the django-post_office reference of `bench/campaign.py --compare`.

Its own database (`DATABASE_URL`, set by bench/post_office_ref.py to emailhub_bench_post_office)
and the same SMTP sink as emailhub (`SMTP_PORT`). POST_OFFICE as the issue measured it:
batches of 1000, everything else post_office's defaults (5 threads per process, one log row
per email).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emailhub.env import env_database_url  # noqa: E402

SECRET_KEY = "bench-post-office-reference"  # noqa: S105 - a local benchmark, never deployed
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "post_office"]
DATABASES = {
    "default": {
        **env_database_url("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/emailhub_bench_post_office"),
        "CONN_MAX_AGE": 60,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = os.environ.get("SMTP_HOST", "127.0.0.1")
EMAIL_PORT = int(os.environ.get("SMTP_PORT", "1025"))
POST_OFFICE = {"BATCH_SIZE": 1000}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
