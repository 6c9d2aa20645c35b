"""One signed POST to an endpoint, over a connection to the address that was checked.

urllib3 directly: a pool per (address, port, host) kept by the process, so an endpoint's next
request reuses its keep-alive connection; the Host header, TLS SNI and the certificate check
name the URL's host while the socket goes to the checked address (addresses.py: no second DNS
lookup between the check and the call). No redirect is followed (a 3xx is a failed attempt: the
application said where to send), no retry inside the call (retries are the delivery's, on its
schedule), one timeout for the whole request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import urllib3
from django.conf import settings

from core.retry_after import parse_retry_after
from outbound.services.addresses import Target

RESPONSE_EXCERPT_BYTES = 1024
_POOLS_MAX = 256

_pools: dict[tuple[str, str, int, str], urllib3.HTTPConnectionPool] = {}
_pools_lock = threading.Lock()


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (refused, timed out, reset)
    latency_ms: float
    excerpt: str = ""  # the body's first KiB, as text
    error: str = ""
    retry_after: float | None = None  # seconds, from a 429's or 503's Retry-After

    @property
    def succeeded(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def _pool(target: Target, timeout: float) -> urllib3.HTTPConnectionPool:
    key = (target.scheme, target.address, target.port, target.host)
    with _pools_lock:
        return _pools.get(key) or _new_pool(key, target, timeout)


def _new_pool(key: tuple[str, str, int, str], target: Target, timeout: float) -> urllib3.HTTPConnectionPool:
    if len(_pools) >= _POOLS_MAX:  # many endpoints: drop the oldest pool
        _pools.pop(next(iter(_pools))).close()
    # As many kept connections as the endpoint may have tasks: the worker's threads share a pool
    # (with one, a second thread's connection was thrown away after each request).
    size = settings.EMAILHUB_WEBHOOKS_ENDPOINT_CONCURRENCY
    limit = urllib3.Timeout(total=timeout)
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            maxsize=size,
            timeout=limit,
            retries=False,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
        )
    else:
        pool = urllib3.HTTPConnectionPool(
            target.address, target.port, maxsize=size, timeout=limit, retries=False
        )
    _pools[key] = pool
    return pool


def close_pools() -> None:
    """Close and forget every kept connection (tests; a process may call it after a fork)."""
    with _pools_lock:
        while _pools:
            _pools.pop(next(iter(_pools))).close()


def post(target: Target, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    default_port = 443 if target.scheme == "https" else 80
    host = target.host if target.port == default_port else f"{target.host}:{target.port}"
    if ":" in target.host and not target.host.startswith("["):
        host = f"[{target.host}]" + ("" if target.port == default_port else f":{target.port}")
    all_headers = {
        **headers,
        "Host": host,
        "Content-Type": "application/json",
        "User-Agent": "emailhub-webhooks/1",
    }
    started = time.perf_counter()
    try:
        response = _pool(target, timeout).urlopen(
            "POST",
            target.path,
            body=body,
            headers=all_headers,
            redirect=False,
            retries=False,
            preload_content=False,
            timeout=urllib3.Timeout(total=timeout),
        )
    except urllib3.exceptions.HTTPError as exc:
        return Answer(
            None, (time.perf_counter() - started) * 1000, error=f"{type(exc).__name__}: {exc}"[:1000]
        )
    try:
        excerpt = response.read(RESPONSE_EXCERPT_BYTES + 1, decode_content=False)
        complete = len(excerpt) <= RESPONSE_EXCERPT_BYTES
    except urllib3.exceptions.HTTPError as exc:
        excerpt, complete = f"(reading the answer failed: {exc})".encode(), False
    latency = (time.perf_counter() - started) * 1000
    if complete:
        response.release_conn()  # whole: the connection goes back to the pool
    else:
        response.close()  # a larger body is not read: this connection is dropped
    status = response.status
    error = ""
    if 300 <= status < 400:
        error = f"redirect to {response.headers.get('Location', '?')} not followed"
    retry_after = parse_retry_after(response.headers.get("Retry-After")) if status in (429, 503) else None
    return Answer(
        status,
        latency,
        excerpt[:RESPONSE_EXCERPT_BYTES].decode("utf-8", "replace"),
        error=error,
        retry_after=retry_after,
    )
