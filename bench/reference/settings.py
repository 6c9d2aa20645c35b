"""Settings of the reference app: Django's defaults, no middleware, no apps, its own database.

The database connection persists like emailhub's (CONN_MAX_AGE 60); everything else is what
`django-admin startproject` would give a JSON endpoint, minus what it does not use.
"""

from __future__ import annotations

import os

SECRET_KEY = "bench-reference-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "bench.reference.app"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("REFERENCE_DATABASE", "emailhub_bench_reference"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "CONN_MAX_AGE": 60,
    }
}
