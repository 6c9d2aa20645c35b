"""Publish micro-benchmark: CPU per task published after a web request's commit.

    .venv/bin/python bench/publish.py [--tasks 2000] [--rounds 5]

Publishes `delivery.send_messages([id])` tasks through core.outbox's publish path (one event
per call, as a web request does) to a queue of its own (`bench_publish`) in BENCH_REDIS_URL
(default Redis database 14), with each publisher in turn:
- `celery`: the plain publisher, Celery's send_task over a producer from Celery's pool per call
  (core.outbox.CeleryPublisher; EMAILHUB_FAST_PATHS without `publish`): the reference;
- `pool`: the fast publisher's own messages (fastpaths/publish.py) over a producer from the pool
  (what the workers do);
- `kept`: the fast publisher over the producer the calling thread keeps (the web's).
Rounds rotate the order so all see the same machine; the last lines are the medians of CPU
(process time) and wall time per task, and the ratios to `celery`. It deletes its queue at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ["CELERY_BROKER_URL"] = os.environ.get("CELERY_BROKER_URL") or REDIS_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402

from core import outbox  # noqa: E402
from fastpaths import publish  # noqa: E402

KIND = "bench_publish"
QUEUE = "bench_publish"


def one_round(tasks: int) -> tuple[float, float]:
    events = [(0, KIND, {"ids": [1]})]
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(tasks):
        published: list[int] = []
        outbox._publish_all(events, published)
        assert published == [0]
    return (time.process_time() - cpu) / tasks * 1e6, (time.perf_counter() - wall) / tasks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fast-only", action="store_true", help="only `pool` and `kept` (no reference)")
    args = parser.parse_args()
    outbox.register_kind(KIND, "delivery.send_messages", args=lambda p: [p["ids"]], queue=lambda p: QUEUE)
    modes = ["pool", "kept"] if args.fast_only else ["celery", "pool", "kept"]
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    try:
        for round_no in range(args.rounds):
            for mode in modes[round_no % len(modes) :] + modes[: round_no % len(modes)]:
                settings.EMAILHUB_OUTBOX_PUBLISHER = settings.OUTBOX_PUBLISHERS[
                    "plain" if mode == "celery" else "fast"
                ]
                publish._keep_per_thread = mode == "kept"
                one_round(50)  # warm-up: connections, declarations
                cpu, wall = one_round(args.tasks)
                results[mode].append((cpu, wall))
                print(
                    f"round {round_no + 1} {mode}: {cpu:.0f} µs CPU, {wall:.0f} µs wall per task", flush=True
                )
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        published = client.llen(QUEUE)
        client.delete(QUEUE, f"_kombu.binding.{QUEUE}", f"_kombu.binding_permanent.{QUEUE}")
        print(f"{published} tasks were in {QUEUE} (deleted)")
    for mode in modes:
        print(f"publish_{mode}_cpu_us: {median(c for c, _ in results[mode]):.0f} us")
        print(f"publish_{mode}_wall_us: {median(w for _, w in results[mode]):.0f} us")
    if args.fast_only:
        return
    celery_cpu = median(c for c, _ in results["celery"])
    for mode in ("pool", "kept"):
        print(f"publish_{mode}_cpu_ratio: {median(c for c, _ in results[mode]) / celery_cpu:.2f}")


if __name__ == "__main__":
    main()
