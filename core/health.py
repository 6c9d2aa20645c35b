"""`GET /healthz` (liveness) and `GET /readyz` (readiness).

- /healthz says the process answers requests, nothing more: no dependency is checked, so a
  database outage does not make an orchestrator restart every healthy web process.
- /readyz checks what a request needs: PostgreSQL (a fresh connection and `SELECT 1`), Redis
  (`PING`) and the Celery broker (kombu `ensure_connection`, Redis or RabbitMQ alike), all three
  at once, each within EMAILHUB_READYZ_TIMEOUT_SECONDS. 200 `{"status": "ok", "checks": {...}}`,
  or 503 with `"status": "unavailable"` and the failed checks named. Error details (which carry
  host names) go to the log, not to the unauthenticated answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from kombu import Connection

from core import redis_clients

logger = logging.getLogger(__name__)


def check_postgres(timeout: float) -> None:
    # Run in a thread of its own, so on a connection of its own: it proves a new connection can
    # be made (what a restarted worker needs), and is closed afterwards.
    connection = connections["default"]
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = %s", [int(timeout * 1000)])
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        connection.close()


def check_redis(timeout: float) -> None:
    client = redis_clients.fresh(timeout)
    try:
        client.ping()
    finally:
        client.close()


def check_broker(timeout: float) -> None:
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=timeout) as connection:
        connection.ensure_connection(max_retries=0)  # one attempt, no 2 s retry pause


CHECKS: dict[str, Callable[[float], None]] = {
    "postgres": check_postgres,
    "redis": check_redis,
    "broker": check_broker,
}


def _timed(check: Callable[[float], None], timeout: float) -> dict[str, Any]:
    started = time.perf_counter()
    check(timeout)
    return {"status": "ok", "seconds": round(time.perf_counter() - started, 4)}


def readiness() -> tuple[bool, dict[str, dict[str, Any]]]:
    timeout = settings.EMAILHUB_READYZ_TIMEOUT_SECONDS
    pool = ThreadPoolExecutor(max_workers=len(CHECKS), thread_name_prefix="readyz")
    try:
        futures = {name: pool.submit(_timed, check, timeout) for name, check in CHECKS.items()}
        deadline = time.monotonic() + timeout + 0.5
        results: dict[str, dict[str, Any]] = {}
        for name, future in futures.items():
            try:
                results[name] = future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                logger.warning("readyz: %s did not answer within %.1f s", name, timeout)
                results[name] = {"status": "failed", "error": "timeout"}
            except Exception as exc:  # noqa: BLE001 - every failure is an answer here
                logger.warning("readyz: %s failed: %r", name, exc)
                results[name] = {"status": "failed", "error": type(exc).__name__}
    finally:
        pool.shutdown(wait=False)  # a hung check must not hold the answer
    return all(r["status"] == "ok" for r in results.values()), results


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    ready, checks = readiness()
    body: dict[str, Any] = {"status": "ok" if ready else "unavailable", "checks": checks}
    if not ready:
        body["failed"] = sorted(name for name, r in checks.items() if r["status"] != "ok")
    response = JsonResponse(body, status=200 if ready else 503)
    response["Cache-Control"] = "no-store"
    return response
