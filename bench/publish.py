"""Publish micro-benchmark: CPU per task published after a web request's commit.

    .venv/bin/python bench/publish.py [--tasks 2000] [--rounds 5]

Publishes `delivery.send_messages([id])` tasks with core.outbox's own publish path (one event
per call, as a web request does; the task message built by core.outbox._publish, not by
Celery's send_task since de656eb) to a queue of its own (`bench_publish`) in BENCH_REDIS_URL
(default Redis database 14), alternately:
- `pool`: a producer acquired from Celery's pool per call (what the workers do, and the web did);
- `kept`: the producer the calling thread keeps (`outbox.keep_producer_per_thread()`, the web's).
Rounds alternate the two so both see the same machine; the last lines are the medians of CPU
(process time) and wall time per task, and their ratio. It deletes its queue at the end.
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

from core import outbox  # noqa: E402

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
    args = parser.parse_args()
    outbox.register_kind(KIND, "delivery.send_messages", args=lambda p: [p["ids"]], queue=lambda p: QUEUE)
    results: dict[str, list[tuple[float, float]]] = {"pool": [], "kept": []}
    try:
        for round_no in range(args.rounds):
            for mode in ("pool", "kept") if round_no % 2 == 0 else ("kept", "pool"):
                outbox._keep_per_thread = mode == "kept"
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
    for mode in ("pool", "kept"):
        print(f"publish_{mode}_cpu_us: {median(c for c, _ in results[mode]):.0f} us")
        print(f"publish_{mode}_wall_us: {median(w for _, w in results[mode]):.0f} us")
    pool_cpu = median(c for c, _ in results["pool"])
    kept_cpu = median(c for c, _ in results["kept"])
    print(f"publish_kept_cpu_ratio: {kept_cpu / pool_cpu:.2f}")


if __name__ == "__main__":
    main()
