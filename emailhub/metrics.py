"""`GET /metrics`: the Prometheus exposition of every process of this deployment.

The counters and histograms are recorded where the pipeline records outcomes (core/metrics.py);
in multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, set for gunicorn and the Celery workers) each
process writes its own files and this view sums them with `MultiProcessCollector` into a fresh
registry, whichever gunicorn worker answers. Two gauges are computed here, at scrape time, from
the state every process shares instead of from any one process's memory:

- `emailhub_queue_depth{priority,state}`: the queue snapshot of GET /api/v1/schedules
  (scheduling.selectors.queue_snapshot; one scan of delivery_message, see docs/scheduling.md;
  reused for QUEUE_DEPTH_MAX_AGE_SECONDS);
- `emailhub_circuit_state{provider,endpoint}`: 0 closed, 1 half-open, 2 open, from the breakers'
  Redis state, one series per circuit (delivery.selectors.provider_health; endpoint "" for a
  provider with one endpoint).

A source that fails (the database down) is left out and `emailhub_scrape_source_up{source}` says
so: the scrape itself still answers 200 with everything else.

Access: an address in EMAILHUB_METRICS_ALLOW (default loopback) or the bearer token
EMAILHUB_METRICS_TOKEN; anyone else gets a 403 with an empty body. The address is the client's
(core/client_ip.py): behind a proxy in EMAILHUB_TRUSTED_PROXIES, the one it forwarded, so a proxy
on loopback does not open /metrics to everyone it serves.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core import client_ip
from core.metrics_dir import MULTIPROC_ENV
from delivery.selectors import provider_health
from scheduling.selectors import queue_snapshot

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CIRCUIT_STATES = {"closed": 0, "half-open": 1, "open": 2}
# The queue snapshot is a sequential scan of delivery_message (~1 s per 10M rows, see
# docs/scheduling.md): a gunicorn worker reuses its last one this long, so several scrapers (or
# a scraper retrying) cost one scan per worker per interval, not one each.
QUEUE_DEPTH_MAX_AGE_SECONDS = 10.0
_last_snapshot: tuple[float, dict[str, dict[str, int]]] | None = None


def _queue_snapshot() -> dict[str, dict[str, int]]:
    global _last_snapshot
    now = time.monotonic()
    if _last_snapshot is None or now - _last_snapshot[0] > QUEUE_DEPTH_MAX_AGE_SECONDS:
        _last_snapshot = (now, queue_snapshot())
    return _last_snapshot[1]


class SharedStateCollector(Collector):
    """Queue depth and circuit states, read when scraped."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "emailhub_scrape_source_up", "1 if the source of scrape-time metrics answered", labels=["source"]
        )
        try:
            snapshot = _queue_snapshot()
        except Exception as exc:  # noqa: BLE001 - the rest of the scrape must still answer
            logger.warning("metrics: queue snapshot unavailable: %s", exc)
            up.add_metric(["queue"], 0)
        else:
            depth = GaugeMetricFamily(
                "emailhub_queue_depth",
                "Messages pending (queued or due) and processing (sending), per priority",
                labels=["priority", "state"],
            )
            for priority, counts in snapshot.items():
                for state, count in counts.items():
                    depth.add_metric([priority, state], count)
            up.add_metric(["queue"], 1)
            yield depth
        try:
            health = provider_health()
        except Exception as exc:  # noqa: BLE001
            logger.warning("metrics: provider health unavailable: %s", exc)
            up.add_metric(["circuits"], 0)
        else:
            circuit = GaugeMetricFamily(
                "emailhub_circuit_state",
                "Provider circuit breaker, per provider endpoint: 0 closed, 1 half-open, 2 open",
                labels=["provider", "endpoint"],
            )
            for provider in health:
                state = str(provider["circuit"]["state"])
                circuit.add_metric([provider["name"], provider["endpoint"]], CIRCUIT_STATES.get(state, 2))
            up.add_metric(["circuits"], 1)
            yield circuit
        yield up


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
    shared.register(SharedStateCollector())
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
