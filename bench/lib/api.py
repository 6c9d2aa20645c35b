"""Driving emailhub's HTTP API as the benches' clients do: message bodies, keep-alive clients
posting them from threads, and waiting until the database says they were sent."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import requests
from django.db import connection

from bench.lib.common import LOG_DIR, run_clients


def message_body(i: int, tag: str, priority: str = "critical") -> dict[str, str]:
    code = f"{i:06d}"
    return {
        "to": f"user{i}@example.com",
        "subject": f"Your sign-in code ({tag} #{i})",
        "text": f"Use {code} to sign in. It expires in 10 minutes.",
        "html": f"<html><body><p>Use <b>{code}</b> to sign in. It expires in 10 minutes.</p></body></html>",
        "priority": priority,
    }


def drive(
    url: str, api_key: str, count: int, concurrency: int, body: Callable[[int], dict[str, Any]]
) -> tuple[list[Any], float, list[float]]:
    """POST `count` bodies from `concurrency` threads, each a keep-alive `requests.Session`;
    return the parsed 202 responses in order, wall seconds, sorted per-request ms."""
    results: list[Any] = [None] * count
    api_ms, errors = [0.0] * count, []
    indexes = itertools.count()  # next() on it is atomic under the GIL: each index goes out once

    def client() -> None:
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {api_key}"
            while not errors and (i := next(indexes)) < count:
                started = time.perf_counter()
                try:
                    response = session.post(url, json=body(i), timeout=60)
                except requests.RequestException as exc:  # e.g. the stack is stopping after Ctrl-C
                    errors.append(f"request failed: {exc}")
                    return
                api_ms[i] = (time.perf_counter() - started) * 1000
                if response.status_code != 202:
                    errors.append(f"HTTP {response.status_code}: {response.text[:300]}")
                    return
                results[i] = response.json()

    elapsed = run_clients(client, concurrency)
    if errors:
        raise RuntimeError(f"the API refused a request: {errors[0]}")
    return results, elapsed, sorted(api_ms)


def post_messages(
    url: str, api_key: str, count: int, concurrency: int, tag: str
) -> tuple[list[int], float, list[float]]:
    """POST `count` critical messages one per request; return ids, wall seconds, per-request ms."""
    results, elapsed, api_ms = drive(url, api_key, count, concurrency, lambda i: message_body(i, tag))
    return [r["id"] for r in results], elapsed, api_ms


def wait_until_sent(ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT status, count(*) FROM delivery_message WHERE id = ANY(%s) GROUP BY status", [ids]
            )
            by_status = dict(cursor.fetchall())
            if by_status.get("sent", 0) == len(ids):
                return
            if set(by_status) & {"failed", "suppressed", "cancelled", "retry_wait"}:
                raise RuntimeError(f"some messages were not sent: {by_status} (see {LOG_DIR})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all sent after {timeout:.0f}s: {by_status} (see {LOG_DIR})")
            time.sleep(0.05)  # 20 cheap queries a second: negligible next to the measured load
