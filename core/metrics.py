"""emailhub's Prometheus metrics: what every process records, and `GET /metrics`, which shows them.

Web (gunicorn workers) and Celery (prefork children) processes each count in their own files
under `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode); `/metrics` sums them
with `MultiProcessCollector` into a fresh registry, whichever gunicorn worker answers. Without
that variable (runserver, the test process) a process counts in memory and `/metrics` shows that
one process.

Some gauges are computed at scrape time from the state every process shares, not from any one
process's memory: an app registers them from its AppConfig.ready (`register_scrape_gauge`), so
this module reads no app. Today: `emailhub_circuit_state{provider,endpoint}` (delivery) and
`emailhub_queue_depth{priority,state}` (scheduling). A source that fails (the database down) is
left out and `emailhub_scrape_source_up{source}` says so: the scrape still answers 200 with
everything else.

Access to `/metrics`: an address in EMAILHUB_METRICS_ALLOW (default loopback) or the bearer token
EMAILHUB_METRICS_TOKEN; anyone else gets a 403 with an empty body. The address is the client's
(core/client_ip.py): behind a proxy in EMAILHUB_TRUSTED_PROXIES, the one it forwarded, so a proxy
on loopback does not open /metrics to everyone it serves.

Label values are bounded sets: provider names from settings, priorities, outcomes, event kinds
and classes. No label ever carries an address, a message id or anything else per recipient.

Recording is cheap on purpose: counters are incremented once per batch by the batch's count
(never once per message in a loop), histograms observed once per provider call and once per
sent message (about 2 µs each in multiprocess mode, measured in docs/performance.md).
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core import client_ip
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

# Outbound webhooks (the outbound app): attempts by endpoint id (a bounded set: the endpoints
# registered) and outcome (succeeded, retry_wait, failed), and how long each took.
WEBHOOK_DELIVERIES = Counter(
    "emailhub_webhook_deliveries_total",
    "Attempts to deliver outbound webhooks, by endpoint and what came of the delivery",
    ["endpoint", "outcome"],
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "emailhub_webhook_attempt_seconds",
    "Seconds an outbound webhook request took, answer or not",
    buckets=CALL_BUCKETS,
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


def count_webhook_attempts(endpoint: str, outcomes: Iterable[tuple[str, float]]) -> None:
    """Count a round of attempts at one endpoint: (outcome, seconds) each."""
    counts: dict[str, int] = {}
    for outcome, seconds in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
        WEBHOOK_ATTEMPT_SECONDS.observe(seconds)
    for outcome, count in counts.items():
        WEBHOOK_DELIVERIES.labels(endpoint, outcome).inc(count)


def count_webhook_request(provider: str, outcome: str) -> None:
    WEBHOOK_REQUESTS.labels(provider, outcome).inc()


def count_webhook_skips(provider: str, skipped: Mapping[str, int]) -> None:
    """reason → events of one webhook request left out."""
    for reason, n in skipped.items():
        if n:
            WEBHOOK_EVENTS_SKIPPED.labels(provider, reason).inc(n)


def count_tracking_request(kind: str, outcome: str) -> None:
    TRACKING_REQUESTS.labels(kind, outcome).inc()


# Scrape-time gauges.

Rows = Iterable[tuple[Sequence[str], float]]  # (label values, value)


@dataclass
class ScrapeGauge:
    source: str  # the `source` label of emailhub_scrape_source_up
    name: str
    documentation: str
    labels: tuple[str, ...]
    read: Callable[[], Rows]
    # A read this young is reused: a source that scans a table (the queue snapshot) costs one
    # scan per process per interval, however many scrapers (or retries) ask.
    max_age_seconds: float = 0.0
    _last: tuple[float, list[tuple[Sequence[str], float]]] | None = field(default=None, repr=False)

    def rows(self) -> list[tuple[Sequence[str], float]]:
        now = time.monotonic()
        if self._last is None or now - self._last[0] > self.max_age_seconds:
            self._last = (now, list(self.read()))
        return self._last[1]


_scrape_gauges: dict[str, ScrapeGauge] = {}


def register_scrape_gauge(
    source: str,
    name: str,
    documentation: str,
    labels: Sequence[str],
    read: Callable[[], Rows],
    *,
    max_age_seconds: float = 0.0,
) -> None:
    """Show `name` on /metrics, read from `read()` when scraped (an AppConfig.ready calls this)."""
    _scrape_gauges[name] = ScrapeGauge(source, name, documentation, tuple(labels), read, max_age_seconds)


class ScrapeTimeCollector(Collector):
    """The registered scrape-time gauges, each source's failure reported instead of raised."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "emailhub_scrape_source_up", "1 if the source of scrape-time metrics answered", labels=["source"]
        )
        for gauge in _scrape_gauges.values():
            try:
                rows = gauge.rows()
            except Exception as exc:  # noqa: BLE001 - the rest of the scrape must still answer
                logger.warning("metrics: %s unavailable: %s", gauge.source, exc)
                up.add_metric([gauge.source], 0)
                continue
            family = GaugeMetricFamily(gauge.name, gauge.documentation, labels=list(gauge.labels))
            for label_values, value in rows:
                family.add_metric(list(label_values), value)
            up.add_metric([gauge.source], 1)
            yield family
        yield up


# GET /metrics.

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def allowed(request: HttpRequest) -> bool:
    """The client's address (behind a trusted proxy, the one it forwarded) is allowed, or the
    request carries the metrics token."""
    address = client_ip.parse_address(client_ip.request_client_address(request))
    if address is not None and address in client_ip.networks(settings.EMAILHUB_METRICS_ALLOW):
        return True
    token = settings.EMAILHUB_METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    return False


def exposition() -> bytes:
    shared = CollectorRegistry()
    shared.register(ScrapeTimeCollector())
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry) + generate_latest(shared)
    # One process (runserver, a test): its own metrics, as they are in memory.
    return generate_latest(REGISTRY) + generate_latest(shared)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponse(status=403, content=b"", content_type="text/plain")
    response = HttpResponse(exposition(), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
