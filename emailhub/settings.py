"""Django settings for emailhub. Every value comes from the environment (see README, "Settings")."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from emailhub.env import (
    env_bool,
    env_database_url,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_redis_url,
    env_seconds_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("EMAILHUB_DEBUG", False)
SECRET_KEY = env_str("EMAILHUB_SECRET_KEY", "dev-only-insecure-secret-key-change-me")
# Earlier secret keys, comma-separated, newest first: what they signed still verifies (sessions,
# and the unsubscribe and tracking links already in inboxes, core/signing.py); nothing new is
# signed with them. Rotate by moving EMAILHUB_SECRET_KEY here and setting a new one.
SECRET_KEY_FALLBACKS = env_list("EMAILHUB_SECRET_KEY_FALLBACKS", [])
ALLOWED_HOSTS = env_list("EMAILHUB_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

# Served over HTTPS (behind a TLS-terminating proxy that sets X-Forwarded-Proto): secure cookies,
# HSTS and a redirect of plain HTTP, except the probes a load balancer or Prometheus reaches on the
# inside. Off by default (the demo, the tests and a first `gunicorn` run are plain HTTP on
# loopback); `manage.py check --deploy` warns (security.W004/W008/W012/W016) until it is on.
HTTPS = env_bool("EMAILHUB_HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("EMAILHUB_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("EMAILHUB_HSTS_INCLUDE_SUBDOMAINS", False)

# The reverse proxies (nginx, a load balancer) whose X-Forwarded-For is believed, as CIDRs; empty
# by default, so the client address is the socket's peer. From a peer in them the header is read
# right to left past every trusted hop (core/client_ip.py): the tracking hits' IP, django-axes'
# lockout and the /metrics allow-list then see the client, not the proxy.
EMAILHUB_TRUSTED_PROXIES = env_networks("EMAILHUB_TRUSTED_PROXIES", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc as static files: /api/docs/ needs no CDN
    "django_celery_beat",
    "axes",
    "core",
    "campaigns",
    "delivery",
    "outbound",
    "scheduling",
    "operations",
]

MIDDLEWARE = [
    # A collection before a large body frees what the last ones left in cycles (core/large_bodies.py).
    "core.large_bodies.CollectBeforeLargeBodies",
    # First of the rest, so it also turns the pages the other middleware produce into JSON on /api/.
    "core.api_errors.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves /static/ from STATIC_ROOT in every way of running (gunicorn, compose, the image):
    # hashed names cached for a year, gzip, no extra web server. Needs `collectstatic` first.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The operator's own zone for the admin's times (core/operator_zone.py).
    "core.operator_zone.OperatorTimezoneMiddleware",
    # Last, as django-axes requires: turns its lockout signal into the refusal page.
    "axes.middleware.AxesMiddleware",
]

# Failed admin logins are throttled by django-axes: after EMAILHUB_LOGIN_FAILURE_LIMIT wrong
# passwords for one username from one IP address, that pair is refused (even with the right
# password) until EMAILHUB_LOGIN_COOLOFF_MINUTES have passed since the last failure. Locking by
# the pair, not the address alone, keeps one guesser behind a shared NAT or proxy from locking
# every operator out; a successful login clears the pair's failures. The API is unaffected (API
# keys, not passwords). Unlock early: `manage.py axes_reset_username NAME`, or delete the
# attempt in the admin.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: it refuses a locked-out pair before any check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("EMAILHUB_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("EMAILHUB_LOGIN_COOLOFF_MINUTES", 15.0, minimum=0.1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ADMIN = False  # core/admin.py registers its tables read-only instead
AXES_LOCKOUT_TEMPLATE = "admin/lockout.html"  # the admin's frame, answered with a 429
# The address of the pair: the client behind EMAILHUB_TRUSTED_PROXIES, else the socket's peer.
AXES_CLIENT_IP_CALLABLE = "core.client_ip.request_client_address"

ROOT_URLCONF = "emailhub.urls"
WSGI_APPLICATION = "emailhub.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The admin's frame (base_site.html, lockout.html) and the API docs page; the apps' own
        # templates (the dashboard's is operations') are found in each app.
        "DIRS": [BASE_DIR / "emailhub" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        **env_database_url("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/emailhub"),
        # Workers and the web process hold a connection for their lifetime instead of one per task.
        "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": env_str("DATABASE_TEST_NAME", "test_emailhub")},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = False

STATIC_URL = "static/"
# Filled by `manage.py collectstatic` (make setup, the Docker build, scripts/stack.py before it
# starts gunicorn); WhiteNoiseMiddleware serves it.
STATIC_ROOT = Path(env_str("EMAILHUB_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Content-hashed names plus .gz copies. A page naming a file collectstatic did not see is
    # an error (a 500 in the admin), not an unstyled page.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Redis and Celery -------------------------------------------------------------------------

REDIS_URL = env_redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A task is acknowledged after it ran, so a worker killed mid-task gives the task back. Every task
# starts with a conditional claim in PostgreSQL, which makes the redelivery harmless.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "normal"
# Redis redelivers a task that was taken but not acknowledged within visibility_timeout. Our
# longest task (a batch of 500 low-priority sends) takes seconds, so 300 s is far above it and
# still brings back the tasks of a killed worker within five minutes. We never use a Celery
# countdown/ETA (they would be redelivered after this timeout); retries wait in PostgreSQL instead.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 300, minimum=30),
    # Publishing from the web process must not hang a request when Redis is away: the outbox
    # relay publishes whatever the request could not.
    "socket_connect_timeout": 2,
    "socket_timeout": 5,
    # kombu's default is to retry a failed publish connection for ~6 s; one quick retry is
    # enough, since whatever could not be published waits in the outbox.
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Celery's Django fixup closes the database connection before and after every task unless this
# is set: a new connection and a new PostgreSQL backend per message, measured at ~15% of a
# worker's time by bench/transactional.py. Workers keep their connection (recycled every
# 2 × this many tasks) and start each task with Django's close_old_connections(), as a web
# request does (emailhub/celery.py).
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 5000, minimum=0)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# A worker touches its liveness file (core/liveness.py; `python -m core.liveness NODE` is
# the health check) this often while its consumer is connected; the directory holds one file per
# worker node name ("" = the system's temporary directory).
EMAILHUB_WORKER_LIVENESS_SECONDS = env_float("EMAILHUB_WORKER_LIVENESS_SECONDS", 10.0, minimum=0.1)
EMAILHUB_WORKER_LIVENESS_DIR = env_str("EMAILHUB_WORKER_LIVENESS_DIR", "")

# --- emailhub ---------------------------------------------------------------------------------

EMAILHUB_DEFAULT_FROM = env_str("EMAILHUB_DEFAULT_FROM", "emailhub <no-reply@emailhub.local>")
EMAILHUB_MESSAGE_ID_DOMAIN = env_str("EMAILHUB_MESSAGE_ID_DOMAIN", "emailhub.local")
# Where recipients reach this deployment's web process: the unsubscribe links in every campaign
# message are {EMAILHUB_PUBLIC_URL}/u/<token>. RFC 8058 requires HTTPS; `manage.py check --deploy`
# refuses the local default and http (campaigns.E002); a malformed URL is refused always (E001).
EMAILHUB_PUBLIC_URL = env_str("EMAILHUB_PUBLIC_URL", "http://localhost:8000")
# Optional mailbox for a second, mailto: unsubscribe URI (RFC 2369); emailhub does not read it.
EMAILHUB_UNSUBSCRIBE_MAILTO = env_str("EMAILHUB_UNSUBSCRIBE_MAILTO", "")
# How long an unsubscribe link works after it was sent. Gmail and Yahoo expect links to keep
# working; never fewer than 30 days.
EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS = env_int("EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS", 90, minimum=30)
# Open and click tracking (delivery/tracking/, docs/delivery.md "Tracking"). Hits wait in this
# Redis list until the beat task delivery.drain_tracking_hits records them, at most
# EMAILHUB_TRACKING_DRAIN_BATCH per INSERT. A click sooner than EMAILHUB_TRACKING_SCANNER_SECONDS
# after the message was sent is a link scanner's (security gateways fetch links on arrival).
EMAILHUB_TRACKING_QUEUE = env_str("EMAILHUB_TRACKING_QUEUE", "emailhub:tracking:hits")
EMAILHUB_TRACKING_DRAIN_BATCH = env_int("EMAILHUB_TRACKING_DRAIN_BATCH", 500, minimum=1)
EMAILHUB_TRACKING_SCANNER_SECONDS = env_float("EMAILHUB_TRACKING_SCANNER_SECONDS", 10.0, minimum=0.0)
# A worker process caches API key lookups this long; a revoked key stops working in every
# process within this time (at once in the process that revoked it).
EMAILHUB_API_KEY_CACHE_SECONDS = env_float("EMAILHUB_API_KEY_CACHE_SECONDS", 30.0, minimum=0.0)
# Attempts before a message that keeps failing transiently becomes `failed`.
EMAILHUB_MAX_ATTEMPTS = env_int("EMAILHUB_MAX_ATTEMPTS", 8, minimum=1)
# Retry backoff: base * 2**(attempt-1), capped, with full jitter.
EMAILHUB_RETRY_BASE_SECONDS = env_float("EMAILHUB_RETRY_BASE_SECONDS", 30.0, minimum=0.0)
EMAILHUB_RETRY_MAX_SECONDS = env_float("EMAILHUB_RETRY_MAX_SECONDS", 3600.0, minimum=0.0)
# The speed-ups that lean on a framework's private internals (fastpaths/, each module says what it
# replaces, its gain and the test that pins it): the ones switched on, comma-separated. `none`
# switches every one off; the plain code (send_task, DRF's own serializers, Django's per-request
# connection check) then runs and the suite passes the same.
FAST_PATH_NAMES = ("publish", "serializers", "db_health", "tracking")
EMAILHUB_FAST_PATHS = [
    name
    for name in env_list("EMAILHUB_FAST_PATHS", list(FAST_PATH_NAMES), allowed={*FAST_PATH_NAMES, "none"})
    if name != "none"
]
# How the outbox puts tasks on the broker (core/outbox.py): Celery's send_task, or the same
# messages built by fastpaths/publish.py.
OUTBOX_PUBLISHERS = {"fast": "fastpaths.publish.ProtocolPublisher", "plain": "core.outbox.CeleryPublisher"}
EMAILHUB_OUTBOX_PUBLISHER = OUTBOX_PUBLISHERS["fast" if "publish" in EMAILHUB_FAST_PATHS else "plain"]
# Outbox rows older than this that were not published on commit are published by the relay.
# The accept INSERT (with its outbox row and outbound event) is prepared once per database
# connection (core.sql.execute_prepared). Off for a pooler in transaction mode that cannot keep a
# connection's prepared statements (PgBouncer before max_prepared_statements).
EMAILHUB_PREPARED_STATEMENTS = env_bool("EMAILHUB_PREPARED_STATEMENTS", True)
EMAILHUB_OUTBOX_GRACE_SECONDS = env_float("EMAILHUB_OUTBOX_GRACE_SECONDS", 2.0, minimum=0.0)
# A message stuck in `sending` this long (its worker died) is given back to the queue.
EMAILHUB_SENDING_LEASE_SECONDS = env_int("EMAILHUB_SENDING_LEASE_SECONDS", 600, minimum=10)
# How long a worker keeps trying to record a batch the providers have answered while PostgreSQL is
# unreachable (a restart, a failover) before it gives up and leaves the batch to that lease.
EMAILHUB_RECORD_RETRY_SECONDS = env_float("EMAILHUB_RECORD_RETRY_SECONDS", 60.0, minimum=0.0)
# Stranded `queued` messages (delivery/services/probes.py): a queue's probe must have been
# consumed this long before the queue is checked (a task delivered just before the probe has
# claimed its rows by then; with prefetch 1 that takes milliseconds), and the same margin is
# taken off the probe's cutoff (clock skew between web hosts and PostgreSQL).
EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS = env_float("EMAILHUB_QUEUE_PROBE_MARGIN_SECONDS", 60.0, minimum=0.0)
# A probe not consumed this long is replaced: lost with the broker's data, or behind a long
# backlog (then the new one just waits too; only a consumed probe leads to a republish).
EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS = env_float("EMAILHUB_QUEUE_PROBE_TIMEOUT_SECONDS", 600.0, minimum=1.0)

# Provider plug-ins (delivery/providers/): each class declares its name and reads its own
# settings below. Adding a provider is one module plus its path here. The chains name providers
# by that name; `manage.py check` (delivery.E001) and worker start-up refuse an unknown one.
EMAILHUB_PROVIDER_CLASSES = env_list(
    "EMAILHUB_PROVIDER_CLASSES",
    [
        "delivery.providers.smtp.SMTPProvider",
        "delivery.providers.ses.SESProvider",
        "delivery.providers.sendgrid.SendGridProvider",
        "delivery.providers.locmem.LocmemProvider",
    ],
)
EMAILHUB_PROVIDERS_TRANSACTIONAL = env_list("EMAILHUB_PROVIDERS_TRANSACTIONAL", ["smtp"])
EMAILHUB_PROVIDERS_BULK = env_list("EMAILHUB_PROVIDERS_BULK", ["smtp"])

SMTP_HOST = env_str("SMTP_HOST", "127.0.0.1")
SMTP_PORT = env_int("SMTP_PORT", 1025, minimum=1)
SMTP_USERNAME = env_str("SMTP_USERNAME", "")
SMTP_PASSWORD = env_str("SMTP_PASSWORD", "")
SMTP_STARTTLS = env_bool("SMTP_STARTTLS", False)
SMTP_TIMEOUT = env_float("SMTP_TIMEOUT", 10.0, minimum=0.1)
# Connections one worker process spreads a pipelined batch over (delivery/providers/smtp.py), one
# per 20 messages of the batch: their round trips overlap. Transactional batches (1 or 10) use one.
SMTP_CONNECTIONS = env_int("SMTP_CONNECTIONS", 4, minimum=1)
# DKIM keys for mail sent over SMTP (SES and SendGrid sign for us), loaded once per worker
# process by delivery/providers/dkim.py: JSON {"example.com": [{"selector": "rsa2026", "key":
# "/path/rsa.pem"}, {"selector": "ed2026", "key": "/path/ed25519.pem"}]} or a directory of
# <domain>/<selector>.pem. Empty: nothing is signed. A key that cannot be loaded stops the worker.
EMAILHUB_DKIM_KEYS = env_str("EMAILHUB_DKIM_KEYS", "")

SES_REGION = env_str("SES_REGION", "us-east-1")
SES_ENDPOINT_URL = env_str("SES_ENDPOINT_URL", "")
SES_ACCESS_KEY_ID = env_str("SES_ACCESS_KEY_ID", "")
SES_SECRET_ACCESS_KEY = env_str("SES_SECRET_ACCESS_KEY", "")
SES_CONFIGURATION_SET = env_str("SES_CONFIGURATION_SET", "")
SES_TIMEOUT = env_float("SES_TIMEOUT", 10.0, minimum=0.1)

SENDGRID_API_KEY = env_str("SENDGRID_API_KEY", "")
SENDGRID_HOST = env_str("SENDGRID_HOST", "https://api.sendgrid.com")
SENDGRID_TIMEOUT = env_float("SENDGRID_TIMEOUT", 10.0, minimum=0.1)
# The Signed Event Webhook's verification key, base64 DER as SendGrid's Mail Settings show it
# (empty: every SendGrid webhook request is refused), and how far the signed timestamp may be
# from our clock, either side, before a request is refused as a replay.
EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY = env_str("EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY", "")
EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS = env_int(
    "EMAILHUB_SENDGRID_WEBHOOK_TOLERANCE_SECONDS", 300, minimum=1
)

# Provider webhooks (delivery/webhooks/), served at POST /api/v1/webhooks/{name}; adding one is
# one module plus its path here. See docs/delivery.md, "Webhooks".
EMAILHUB_WEBHOOK_CLASSES = env_list(
    "EMAILHUB_WEBHOOK_CLASSES",
    ["delivery.webhooks.ses.SESWebhook", "delivery.webhooks.sendgrid.SendGridWebhook"],
)
# An SNS message is at most 256 KiB; a SendGrid batch of 1,000 events is about 1 MiB.
EMAILHUB_WEBHOOK_MAX_BODY_BYTES = env_int("EMAILHUB_WEBHOOK_MAX_BODY_BYTES", 4 * 1024 * 1024, minimum=1024)
# SNS topics whose notifications are accepted (full ARNs); empty refuses every SNS request.
EMAILHUB_SES_SNS_TOPIC_ARNS = env_list("EMAILHUB_SES_SNS_TOPIC_ARNS", [])
# The SNS API used to confirm subscriptions ("" = AWS's own endpoint for the topic's region).
EMAILHUB_SNS_ENDPOINT_URL = env_str("EMAILHUB_SNS_ENDPOINT_URL", "")
# Tests only: "official-prefix=local-base" pairs; a SigningCertURL that has PASSED the
# SigningCertURL rule (delivery/webhooks/ses.py) is fetched from the local base instead.
# `check --deploy` refuses it (delivery.E002).
EMAILHUB_SNS_CERT_FETCH_OVERRIDE = dict(
    pair.split("=", 1) for pair in env_list("EMAILHUB_SNS_CERT_FETCH_OVERRIDE", []) if "=" in pair
)

# Circuit breakers (one per provider, state shared by every process through Redis). The source
# design's figures: open after 10 consecutive provider failures, probe again after 5 minutes.
EMAILHUB_BREAKER_FAIL_MAX = env_int("EMAILHUB_BREAKER_FAIL_MAX", 10, minimum=1)
EMAILHUB_BREAKER_RESET_TIMEOUT = env_float("EMAILHUB_BREAKER_RESET_TIMEOUT", 300.0, minimum=0.1)

# Send-rate quotas in emails per second, per provider (0: unlimited), e.g. SES's MaxSendRate.
EMAILHUB_RATE_LIMITS = {
    name: env_float(f"{name.upper()}_MAX_SEND_RATE", 0.0, minimum=0.0) for name in ("smtp", "ses", "sendgrid")
}
# The share of each quota that only critical and high sends may use, so a campaign can never
# take the last token an OTP needs.
EMAILHUB_RATE_RESERVED_FRACTION = env_float("EMAILHUB_RATE_RESERVED_FRACTION", 0.2, minimum=0.0)
# The longest a bulk batch waits for tokens before it tries the next provider.
EMAILHUB_RATE_MAX_WAIT_SECONDS = env_float("EMAILHUB_RATE_MAX_WAIT_SECONDS", 30.0, minimum=0.0)
# A provider that rate-limits us (429, SES throttling, SMTP 421/451 "try later") is paused for
# the Retry-After it sent, or this long when it sent none; never longer than the cap, so a
# bogus Retry-After cannot park a provider for a day.
EMAILHUB_THROTTLE_DEFAULT_SECONDS = env_float("EMAILHUB_THROTTLE_DEFAULT_SECONDS", 60.0, minimum=0.1)
EMAILHUB_THROTTLE_MAX_SECONDS = env_float("EMAILHUB_THROTTLE_MAX_SECONDS", 3600.0, minimum=0.1)

# --- Metrics and readiness (core/metrics.py, core/health.py) ---------------------------

# GET /metrics answers a client whose address is in EMAILHUB_METRICS_ALLOW (CIDRs; `none` for
# no address) or that sends `Authorization: Bearer <EMAILHUB_METRICS_TOKEN>` (when set); anyone
# else gets a bare 403. The address is the client's behind EMAILHUB_TRUSTED_PROXIES, so a proxy
# on loopback does not open /metrics to everyone it forwards.
EMAILHUB_METRICS_TOKEN = env_str("EMAILHUB_METRICS_TOKEN", "")
EMAILHUB_METRICS_ALLOW = env_networks("EMAILHUB_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"])
# Each of /readyz's checks (PostgreSQL, Redis, the broker) gets this long; they run at once.
EMAILHUB_READYZ_TIMEOUT_SECONDS = env_float("EMAILHUB_READYZ_TIMEOUT_SECONDS", 1.5, minimum=0.1)

# --- REST API ---------------------------------------------------------------------------------

# The largest JSON body the API reads (a 1,000-message batch with bodies fits, and so does one
# message with EMAILHUB_ATTACHMENTS_MAX_BYTES of attachments: 10 MiB is 13.4 MiB as base64);
# larger is a 413. CSV uploads are files and not counted. Django's limit for form data follows it.
EMAILHUB_API_MAX_BODY_BYTES = env_int("EMAILHUB_API_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = EMAILHUB_API_MAX_BODY_BYTES
# Most messages in one POST /api/v1/messages/batch (one transaction); more is a 413 naming this.
EMAILHUB_API_BATCH_MAX_MESSAGES = env_int("EMAILHUB_API_BATCH_MAX_MESSAGES", 1000, minimum=1)
# Deepest nesting of arrays/objects in a JSON body; deeper is a 400. No field needs more than a
# few levels, and Python's json recursion fails near 1,000.
EMAILHUB_API_MAX_JSON_DEPTH = env_int("EMAILHUB_API_MAX_JSON_DEPTH", 32, minimum=2)
# The furthest ahead a client may schedule anything (a message's send_at, a campaign's at,
# local_date or optimized window_start). Providers that schedule bound it far tighter (SendGrid's
# send_at: 72 hours); a year leaves room for campaigns planned a season ahead. Without it
# `9999-12-31` sat in the schedule index for ever. Beyond it is a 400 naming this (core.limits).
EMAILHUB_SCHEDULE_HORIZON_DAYS = env_int("EMAILHUB_SCHEDULE_HORIZON_DAYS", 365, minimum=1)
# A message's `context` (and a preview's): top-level keys and the size of its compact UTF-8 JSON.
# Templates name a handful of variables; a receipt with 200 line items is about 20 KB. Each
# message row stores its context and a send task holds up to 500 of them (EMAILHUB_BATCH_SIZE_LOW):
# 64 KiB keeps that batch near 32 MB in a worker. Beyond either is a 400 naming the setting.
EMAILHUB_CONTEXT_MAX_KEYS = env_int("EMAILHUB_CONTEXT_MAX_KEYS", 1000, minimum=1)
EMAILHUB_CONTEXT_MAX_BYTES = env_int("EMAILHUB_CONTEXT_MAX_BYTES", 64 * 1024, minimum=1024)
# A contact's `attributes`, likewise (the API, the admin's form, each CSV import row): they are
# merged into every render of that contact, so the same bounds apply; a CSV with more attribute
# columns than the key limit is refused at its header.
EMAILHUB_ATTRIBUTES_MAX_KEYS = env_int("EMAILHUB_ATTRIBUTES_MAX_KEYS", 1000, minimum=1)
EMAILHUB_ATTRIBUTES_MAX_BYTES = env_int("EMAILHUB_ATTRIBUTES_MAX_BYTES", 64 * 1024, minimum=1024)
# A message's `tags` and `metadata` (issue 21): what an application attaches to recognise the
# message in lists, events and a cancel by tag. Postmark allows one tag, SendGrid 10 categories,
# Mailgun 10 tags; Resend's and SES's message tags are string pairs. Tags are short identifiers
# (EMAILHUB_TAG_MAX_LENGTH characters of [A-Za-z0-9_.:-]); metadata a flat object of strings.
EMAILHUB_MESSAGE_MAX_TAGS = env_int("EMAILHUB_MESSAGE_MAX_TAGS", 10, minimum=1)
EMAILHUB_TAG_MAX_LENGTH = env_int("EMAILHUB_TAG_MAX_LENGTH", 128, minimum=16)
EMAILHUB_METADATA_MAX_KEYS = env_int("EMAILHUB_METADATA_MAX_KEYS", 20, minimum=1)
EMAILHUB_METADATA_MAX_BYTES = env_int("EMAILHUB_METADATA_MAX_BYTES", 2048, minimum=256)
# Recipients of one message, `to` with its `cc` and `bcc`: SES takes at most 50 a message
# (SendGrid 1,000 a personalization), so a message any provider of the chain can take.
EMAILHUB_MESSAGE_MAX_RECIPIENTS = env_int("EMAILHUB_MESSAGE_MAX_RECIPIENTS", 50, minimum=1)
# A message's `attachments` (issue 21): the decoded total of its files (beyond it a 413 naming
# this) and how many (beyond it a 400). Postmark and Gmail take 10 MiB and 25 MB, SendGrid 30 MB
# per message with its base64; 10 MiB is the smallest common bound, so a message accepted here
# is not refused by the next provider of the chain. A worker holds a batch's distinct contents
# in memory at once (delivery.services.compose).
EMAILHUB_ATTACHMENTS_MAX_BYTES = env_int("EMAILHUB_ATTACHMENTS_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
EMAILHUB_ATTACHMENTS_MAX_COUNT = env_int("EMAILHUB_ATTACHMENTS_MAX_COUNT", 10, minimum=1)
# A worker composes and sends a claimed batch in parts of at most this many bytes of attachments
# (delivery.services.sending.by_attachment_bytes): its memory per batch stays near this plus
# its base64 (4/3), whatever the batch size (bench/attachments.py measures the peak RSS).
EMAILHUB_SEND_PART_BYTES = env_int("EMAILHUB_SEND_PART_BYTES", 32 * 1024 * 1024, minimum=1024 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["delivery.authentication.ApiKeyAuthentication"],
    # A valid key holding the view's scope for the method; `manage` unless the view says otherwise.
    "DEFAULT_PERMISSION_CLASSES": ["delivery.permissions.ApiKeyScopes"],
    "DEFAULT_PARSER_CLASSES": ["core.api_json.JSONParser"],
    "EXCEPTION_HANDLER": "core.api_errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # drf-spectacular's, with every operation's error responses and security (core/api_schema.py).
    "DEFAULT_SCHEMA_CLASS": "core.api_schema.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "campaigns.api.pagination.IdCursorPagination",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "emailhub API",
    "VERSION": "1.0.0",
    "DESCRIPTION": "Transactional and campaign email with priorities, scheduling and failover.",
    # The schema documents /api/v1/, not itself (nor the docs pages).
    "SERVE_INCLUDE_SCHEMA": False,
    # Request bodies get components of their own (`ContactRequest` beside `Contact`): they state
    # what the API takes (no read-only fields, `minLength: 1` where blank is refused) while the
    # responses describe what is stored (core/api_schema.py).
    "COMPONENT_SPLIT_REQUEST": True,
    # One name per choice set (without them drf-spectacular invents `ScheduleType496Enum`).
    "ENUM_NAME_OVERRIDES": {
        "ScheduleTypeEnum": "campaigns.models.Campaign.ScheduleType",
        "RecurringScheduleTypeEnum": ["immediate"],
    },
    # /api/docs/ (Swagger UI) and /api/redoc/ load their JavaScript, CSS and favicon from our own
    # /static/ (drf-spectacular-sidecar), never from a CDN; Swagger's online validator badge (an
    # image from validator.swagger.io) is off.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "delivery.permissions.document_scopes",  # the API key scope each operation needs
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("EMAILHUB_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Messages per send task, by priority (the source design's figures): a critical message is
# never held back waiting for a batch to fill, a low one amortises the claim and record queries.
EMAILHUB_BATCH_SIZES = {
    "critical": env_int("EMAILHUB_BATCH_SIZE_CRITICAL", 1, minimum=1),
    "high": env_int("EMAILHUB_BATCH_SIZE_HIGH", 10, minimum=1),
    "normal": env_int("EMAILHUB_BATCH_SIZE_NORMAL", 100, minimum=1),
    "low": env_int("EMAILHUB_BATCH_SIZE_LOW", 500, minimum=1),
}

# The adaptive claim of the transactional pool (docs/architecture.md "Adaptive claims"): a task of
# the critical or high queue claims the pool's oldest waiting API messages, every critical one
# before any high one, up to this many per claim (one when one waits: the paced latency does not
# move), and claims again until none waits; while such a task waits on the broker or runs,
# accepted messages publish no task of their own (their doorbell is ringing). 1: one message
# per task, as the source design's batch_size 1.
EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT = env_int("EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT", 20, minimum=1)
# A pooled task that has claimed and sent this long hands what is left to a new task and ends
# (Celery's other queues get their turn; no task nears the broker's visibility timeout).
EMAILHUB_TRANSACTIONAL_TASK_SECONDS = env_float("EMAILHUB_TRANSACTIONAL_TASK_SECONDS", 1.0, minimum=0.0)
# How long a pooled task that found nothing waiting waits for a message to be accepted before it
# ends: a storm's messages are then claimed by a running task, without a Celery task each.
EMAILHUB_TRANSACTIONAL_LINGER_SECONDS = env_float("EMAILHUB_TRANSACTIONAL_LINGER_SECONDS", 0.05, minimum=0.0)
# Under load (the last claim found several messages) a woken pooled task waits this long before it
# claims, so the next claim takes more of them at once: fewer claims and records per message in a
# storm (bench/transactional.py: worker CPU per message 0.93 -> 0.80 ms), a few milliseconds more
# for those messages; a message alone (claims of one) never waits.
EMAILHUB_TRANSACTIONAL_GATHER_SECONDS = env_float("EMAILHUB_TRANSACTIONAL_GATHER_SECONDS", 0.005, minimum=0.0)
# How long a rung doorbell stands in for tasks if its own task is lost (a broker flushed or a
# worker killed holding it unstarted): the delay, at most, before the next accepted message
# publishes again; the queue probes (delivery/services/probes.py) find what none claims.
EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS = env_float(
    "EMAILHUB_TRANSACTIONAL_DOORBELL_SECONDS", 2.0, minimum=0.05
)

# List members per fan-out transaction. Large enough that per-statement overhead vanishes,
# small enough that a step holds the campaign row for well under a second.
EMAILHUB_FANOUT_STEP = env_int("EMAILHUB_FANOUT_STEP", 20_000, minimum=1)
# A sending campaign whose fan-out made no progress this long is handed to a new fan-out task.
EMAILHUB_FANOUT_STALL_SECONDS = env_float("EMAILHUB_FANOUT_STALL_SECONDS", 60.0, minimum=1.0)
# CSV imports (campaigns.import_jobs): the largest file POST /api/v1/contacts/import stores (it
# is a multipart or text/csv upload, spooled to a temporary file, not the JSON body limit), and
# how long a job may go without progress before it is handed to a new run.
EMAILHUB_IMPORT_MAX_BYTES = env_int("EMAILHUB_IMPORT_MAX_BYTES", 512 * 1024 * 1024, minimum=1024)
EMAILHUB_IMPORT_STALL_SECONDS = env_float("EMAILHUB_IMPORT_STALL_SECONDS", 60.0, minimum=1.0)
# Segments (issue 23): a filter's bounds (its JSON, its conditions, how deep its groups nest),
# how long a count or a sample may run before it is refused (a filter is the operator's, the
# database is everyone's), and how many contacts a sample shows at most.
EMAILHUB_SEGMENT_MAX_BYTES = env_int("EMAILHUB_SEGMENT_MAX_BYTES", 16 * 1024, minimum=1024)
EMAILHUB_SEGMENT_MAX_CONDITIONS = env_int("EMAILHUB_SEGMENT_MAX_CONDITIONS", 50, minimum=1)
EMAILHUB_SEGMENT_MAX_DEPTH = env_int("EMAILHUB_SEGMENT_MAX_DEPTH", 5, minimum=1)
EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS = env_float(
    "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS", 15.0, minimum=0.1
)
EMAILHUB_SEGMENT_SAMPLE_MAX = env_int("EMAILHUB_SEGMENT_SAMPLE_MAX", 50, minimum=1)
# Send-time optimization (campaigns/engagement.py, campaigns/besthour.py; docs/scheduling.md).
# Half-life of an open's or click's weight in a contact's hour histogram.
EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS = env_float("EMAILHUB_ENGAGEMENT_HALF_LIFE_DAYS", 30.0, minimum=0.01)
# A click says the message was read at that hour; an open is more often a preview that lands
# right after the send (the send hour leaking into the estimate), so clicks weigh more.
EMAILHUB_ENGAGEMENT_CLICK_WEIGHT = env_float("EMAILHUB_ENGAGEMENT_CLICK_WEIGHT", 2.0, minimum=0.0)
EMAILHUB_ENGAGEMENT_OPEN_WEIGHT = env_float("EMAILHUB_ENGAGEMENT_OPEN_WEIGHT", 1.0, minimum=0.0)
# A hit this soon after its message was sent says more about when we sent than about when the
# reader reads (bench/sto.py: 0.63 → 0.85 of contacts within ±1 h at 10 events), so it counts
# only this fraction of its weight.
EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES = env_float("EMAILHUB_ENGAGEMENT_ARRIVAL_MINUTES", 60.0, minimum=0.0)
EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT = env_float("EMAILHUB_ENGAGEMENT_ARRIVAL_WEIGHT", 0.2, minimum=0.0)
# Events per refresh transaction (one set-based statement each).
EMAILHUB_ENGAGEMENT_REFRESH_STEP = env_int("EMAILHUB_ENGAGEMENT_REFRESH_STEP", 100_000, minimum=1)
# Events younger than this are left for the next refresh: an event committed late with a lower
# id than one already folded would otherwise be skipped by the id watermark.
EMAILHUB_ENGAGEMENT_SETTLE_SECONDS = env_float("EMAILHUB_ENGAGEMENT_SETTLE_SECONDS", 30.0, minimum=0.0)
# Prior strength k: the population's distribution counts as k event weights in every contact's.
EMAILHUB_STO_PRIOR_STRENGTH = env_float("EMAILHUB_STO_PRIOR_STRENGTH", 5.0, minimum=0.0)

# A scheduler that claimed units and died holds them this long before the reaper returns them.
EMAILHUB_SCHEDULER_LEASE_SECONDS = env_float("EMAILHUB_SCHEDULER_LEASE_SECONDS", 30.0, minimum=1.0)

# Outbound event webhooks (outbound/, docs/delivery.md "Telling the application").
# Endpoint URLs must be https on a public address; these two open http and loopback/private
# addresses for development and tests only (never in production: they let an API key make the
# workers call into the private network).
EMAILHUB_WEBHOOKS_ALLOW_HTTP = env_bool("EMAILHUB_WEBHOOKS_ALLOW_HTTP", False)
EMAILHUB_WEBHOOKS_ALLOW_PRIVATE = env_bool("EMAILHUB_WEBHOOKS_ALLOW_PRIVATE", False)
# Seconds before each attempt: the first counted from the event's dispatch (at once), each next
# from the attempt before it failed; Svix's schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h).
# A delivery failing them all is `failed` (replayable); as many attempts as entries.
EMAILHUB_WEBHOOKS_RETRY_SCHEDULE = env_seconds_list(
    "EMAILHUB_WEBHOOKS_RETRY_SCHEDULE", [0, 5, 300, 1800, 7200, 18000, 36000, 36000]
)
EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS = env_float("EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS", 15.0, minimum=0.1)
# An endpoint whose every attempt failed for this long is disabled (the dashboard shows it).
EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS = env_float(
    "EMAILHUB_WEBHOOKS_DISABLE_AFTER_SECONDS", 5 * 86400.0, minimum=60.0
)
# After a rotation the old secret signs too (a second signature) for this long.
EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS = env_float(
    "EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS", 86400.0, minimum=0.0
)
# Delivery tasks running at once per endpoint: the bulkhead between customers' endpoints. Below
# the webhooks worker's concurrency (8 threads), so one slow or dead receiver holds a quarter of
# it at most and the others' deliveries go on.
EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY = env_int("EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY", 2, minimum=1)
# Consecutive failed attempts that open an endpoint's circuit, and how long it stays open before
# one probe is let through.
EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES = env_int("EMAILHUB_WEBHOOKS_CIRCUIT_FAILURES", 5, minimum=1)
EMAILHUB_WEBHOOKS_CIRCUIT_SECONDS = env_float("EMAILHUB_WEBHOOKS_CIRCUIT_SECONDS", 60.0, minimum=1.0)
# Events per batched request (an endpoint with `batch`), and deliveries a task claims at once.
EMAILHUB_WEBHOOKS_BATCH_SIZE = env_int("EMAILHUB_WEBHOOKS_BATCH_SIZE", 100, minimum=1)
EMAILHUB_WEBHOOKS_CLAIM = env_int("EMAILHUB_WEBHOOKS_CLAIM", 20, minimum=1)
# While events keep coming, the dispatcher waits this long between its steps, so that they carry
# more events each (fuller batches, fewer transactions and tasks); the first of a lull goes at once.
EMAILHUB_WEBHOOKS_DISPATCH_GATHER_SECONDS = env_float(
    "EMAILHUB_WEBHOOKS_DISPATCH_GATHER_SECONDS", 0.2, minimum=0.0
)
# A delivery task works an endpoint this long, then hands over to a new task (others' turn).
EMAILHUB_WEBHOOKS_TASK_SECONDS = env_float("EMAILHUB_WEBHOOKS_TASK_SECONDS", 20.0, minimum=1.0)
# A delivery claimed longer ago than this by a task that died (kill -9, a lost machine) goes back
# to pending (its attempt counted) at the next sweep; at least a claim's worth of timeouts.
EMAILHUB_WEBHOOKS_LEASE_SECONDS = env_float(
    "EMAILHUB_WEBHOOKS_LEASE_SECONDS",
    EMAILHUB_WEBHOOKS_TIMEOUT_SECONDS * EMAILHUB_WEBHOOKS_CLAIM + 60.0,
    minimum=1.0,
)
