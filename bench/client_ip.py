"""What reading the client address behind trusted proxies (core/client_ip.py) costs an open hit.

    .venv/bin/python bench/client_ip.py [--hits 3000] [--rounds 5]

In this process, no gunicorn:

- `client_address` alone, for each case the fast path meets: the default (no trusted proxies),
  trusted proxies but no header, a trusted peer with one forwarded client seen before (the
  decisions are cached) or never seen (a cache miss), four entries with two trusted hops, an
  untrusted peer sending a header; and `environ.get("REMOTE_ADDR")`, what the fast path did before.
  Best of 7 repeats, µs per call.
- the whole open hit through `TrackingFastPath` (token check, RPUSH onto Redis, the answer): the
  default against a trusted proxy forwarding a new client each time, alternated for --rounds,
  medians, µs per hit. Redis: BENCH_REDIS_URL (db 11 by default), a list of its own, deleted after.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import sys
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")
os.environ["REDIS_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ["EMAILHUB_TRACKING_QUEUE"] = "emailhub:bench:client_ip"

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402

from core import redis_clients  # noqa: E402
from core.client_ip import client_address, networks  # noqa: E402
from delivery.tracking.serve import HITS  # noqa: E402
from delivery.tracking.tokens import open_token  # noqa: E402
from fastpaths.tracking import TrackingFastPath  # noqa: E402

TRUSTED = ["127.0.0.1/32", "10.0.0.0/8"]


def per_call_us(call: Callable[[], object], number: int = 100_000) -> float:
    return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6


def fresh_clients() -> Iterator[str]:
    for a, b, c in itertools.product(range(1, 224), range(256), range(256)):
        yield f"{a}.{b}.{c}.7"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hits", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")

    none, trusted = networks([]), networks(TRUSTED)
    new = fresh_clients()
    calls: dict[str, Callable[[], object]] = {
        "before_environ_get": lambda: {"REMOTE_ADDR": "127.0.0.1"}.get("REMOTE_ADDR", ""),
        "default_no_trusted_proxies": lambda: client_address("127.0.0.1", "17.58.1.2", none),
        "trusted_no_header": lambda: client_address("127.0.0.1", "", trusted),
        "trusted_peer_seen_client": lambda: client_address("127.0.0.1", "17.58.1.2", trusted),
        "trusted_peer_new_client": lambda: client_address("127.0.0.1", next(new), trusted),
        "four_entries_two_trusted_hops": lambda: client_address(
            "127.0.0.1", "17.1.1.1, 198.51.100.7, 10.0.0.2, 10.0.0.3", trusted
        ),
        "untrusted_peer_with_header": lambda: client_address("203.0.113.9", "17.58.1.2", trusted),
    }
    for name, call in calls.items():
        print(f"{name}_us: {per_call_us(call):.3f} us")

    token = open_token(5)

    def environ(forwarded_for: str | None) -> dict[str, Any]:
        env = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": f"/t/o/{token}",
            "HTTP_HOST": "127.0.0.1",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "HTTP_USER_AGENT": "Mozilla/5.0",
            "REMOTE_ADDR": "127.0.0.1",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.url_scheme": "http",
        }
        if forwarded_for is not None:
            env["HTTP_X_FORWARDED_FOR"] = forwarded_for
        return env

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        pass

    default = TrackingFastPath(lambda e, s: [b""], HITS)
    with override_settings(EMAILHUB_TRUSTED_PROXIES=TRUSTED):
        proxied = TrackingFastPath(lambda e, s: [b""], HITS)
        proxied(environ(None), start_response)  # reads its settings now, inside the override
    default(environ(None), start_response)
    plain_env = environ(None)
    forwarded_envs = [environ(next(new)) for _ in range(args.hits * args.rounds)]
    plain, forwarded = [], []
    for round_ in range(args.rounds):
        batch = forwarded_envs[round_ * args.hits : (round_ + 1) * args.hits]
        started = timeit.default_timer()
        for _ in range(args.hits):
            default(plain_env, start_response)
        plain.append((timeit.default_timer() - started) / args.hits * 1e6)
        started = timeit.default_timer()
        for env in batch:
            proxied(env, start_response)
        forwarded.append((timeit.default_timer() - started) / args.hits * 1e6)
    redis_clients.send_path().delete(os.environ["EMAILHUB_TRACKING_QUEUE"])
    print(f"open_hit_default_us: {median(plain):.1f} us (rounds {', '.join(f'{v:.0f}' for v in plain)})")
    print(
        f"open_hit_trusted_proxy_new_client_us: {median(forwarded):.1f} us "
        f"(rounds {', '.join(f'{v:.0f}' for v in forwarded)})"
    )


if __name__ == "__main__":
    main()
