"""The Prometheus metrics every process records, and the process identity they are kept under.

Web (gunicorn workers) and Celery (prefork children) processes each count in their own files
under `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode); `/metrics`
(emailhub/metrics.py) sums them. Without that variable (runserver, the test process) a process
counts in memory and `/metrics` shows that one process.

Label values are bounded sets: provider names from settings, priorities, outcomes, event kinds
and classes. No label ever carries an address, a message id or anything else per recipient.

Recording is cheap on purpose: counters are incremented once per batch by the batch's count
(never once per message in a loop), histograms observed once per provider call and once per
sent message (about 2 µs each in multiprocess mode, measured in docs/performance.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Histogram, values

from core.metrics_dir import MULTIPROC_ENV, process_identifier

logger = logging.getLogger(__name__)

if os.environ.get(MULTIPROC_ENV):
    try:
        # A command run with the deployment's environment but not its volume (a one-off
        # `manage.py`) must not fail on its first count: the directory is made if missing.
        os.makedirs(os.environ[MULTIPROC_ENV], exist_ok=True)
    except OSError as exc:
        logger.warning("%s unusable (%s): this process counts in memory only", MULTIPROC_ENV, exc)
        values.ValueClass = values.MutexValue
    else:
        # Before any metric is created: each value is stored under this identifier's files.
        values.ValueClass = values.MultiProcessValue(process_identifier)  # type: ignore[no-untyped-call]


# Accept → provider acceptance spans a critical message's milliseconds and a campaign slot's
# minutes; provider calls span one SMTP message and a 1,000-recipient SendGrid request.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

EMAILS = Counter(
    "emailhub_emails_sent",
    "Messages leaving `sending`, by outcome: sent (provider accepted), failed, suppressed, "
    "retried (retry_wait after a provider error), deferred (no provider could be tried), "
    "cancelled (campaign cancelled meanwhile), requeued (its worker died mid-send). provider is "
    "the accepting provider, else none.",
    ["provider", "priority", "outcome"],
)
PROVIDER_SEND_SECONDS = Histogram(
    "emailhub_provider_send_seconds",
    "Duration of one provider call (one batch: one message for transactional sends).",
    ["provider"],
    buckets=CALL_BUCKETS,
)
QUEUE_LATENCY_SECONDS = Histogram(
    "emailhub_queue_latency_seconds",
    "Accept (queued, or due for a scheduled message) to provider acceptance, per sent message.",
    ["priority"],
    buckets=LATENCY_BUCKETS,
)
PROVIDER_EVENTS = Counter(
    "emailhub_provider_events",
    "Events recorded from providers and recipients (webhooks, DSNs, tracking, unsubscribe), "
    "by provider, kind and outcome (new, duplicate).",
    ["provider", "kind", "outcome"],
)
WEBHOOK_REQUESTS = Counter(
    "emailhub_webhook_requests",
    "Provider webhook requests by provider and outcome (accepted, forged, invalid, too_large, "
    "unavailable, unknown_provider).",
    ["provider", "outcome"],
)
WEBHOOK_EVENTS_SKIPPED = Counter(
    "emailhub_webhook_events_skipped",
    "Events of authentic provider webhook requests left out (each logged with its place and "
    "why) while the rest of the request was recorded, by provider and reason: not_an_object, "
    "missing_field, bad_recipient (missing or not an address), recipient_too_long, unstorable "
    "(U+0000, a lone surrogate, NaN or nesting PostgreSQL cannot store).",
    ["provider", "reason"],
)
ENGAGEMENT = Counter(
    "emailhub_tracking_hits_recorded",
    "Opens and clicks recorded (new events), by provider (emailhub = our pixel and links), kind "
    "and class (human, machine, proxy, bot, scanner).",
    ["provider", "kind", "class"],
)
TRACKING_REQUESTS = Counter(
    "emailhub_tracking_requests",
    "Open pixel and tracked link requests answered, by kind (open, click) and outcome (queued, "
    "unknown_token, not_queued when Redis was unavailable).",
    ["kind", "outcome"],
)

NO_PROVIDER = "none"


def count_emails(counts: Mapping[tuple[str, str, str], int]) -> None:
    """Add a recorded batch's (provider, priority, outcome) → count."""
    for (provider, priority, outcome), n in counts.items():
        if n:
            EMAILS.labels(provider, priority, outcome).inc(n)


def observe_latencies(latencies: Mapping[str, Iterable[float]]) -> None:
    """priority → seconds from accept to provider acceptance of each sent message."""
    for priority, seconds in latencies.items():
        child = QUEUE_LATENCY_SECONDS.labels(priority)
        for value in seconds:
            child.observe(max(value, 0.0))


def observe_provider_call(provider: str, seconds: float) -> None:
    PROVIDER_SEND_SECONDS.labels(provider).observe(seconds)


def count_events(
    events: Mapping[tuple[str, str, str], int], engagement: Mapping[tuple[str, str, str], int]
) -> None:
    """(provider, kind, new|duplicate) → count, and (provider, kind, class) → count."""
    for (provider, kind, outcome), n in events.items():
        if n:
            PROVIDER_EVENTS.labels(provider, kind, outcome).inc(n)
    for (provider, kind, cls), n in engagement.items():
        if n:
            ENGAGEMENT.labels(provider, kind, cls).inc(n)


def count_webhook_request(provider: str, outcome: str) -> None:
    WEBHOOK_REQUESTS.labels(provider, outcome).inc()


def count_webhook_skips(provider: str, skipped: Mapping[str, int]) -> None:
    """reason → events of one webhook request left out."""
    for reason, n in skipped.items():
        if n:
            WEBHOOK_EVENTS_SKIPPED.labels(provider, reason).inc(n)


def count_tracking_request(kind: str, outcome: str) -> None:
    TRACKING_REQUESTS.labels(kind, outcome).inc()
