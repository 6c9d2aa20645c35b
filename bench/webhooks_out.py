"""Outbound webhooks benchmark (issue 22): a campaign whose every send is an event to an endpoint.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/webhooks_out.py [--recipients 100000] [--runs 1] [--quiet 0.2]

Each run is three campaigns of --recipients recipients, each on emptied tables, a flushed Redis
and freshly started processes, the reference first:

- `reference`: no endpoint registered (no outbound event is written: the interest function
  answers nobody);
- `unbatched`: an endpoint of a `manage` API key (so it hears of campaign mail), registered
  through POST /api/v1/webhook-endpoints, subscribed to `message.sent`: one request per event;
- `batched`: the same with `"batch": true` (up to EMAILHUB_WEBHOOKS_BATCH_SIZE events a request).
The two endpoint modes swap places from one run to the next (reference, unbatched, batched; then
reference, batched, unbatched; ...), so neither always follows the reference.

The processes are scripts/stack.py's commands: web (gunicorn, 2 workers), worker-bulk,
worker-webhooks, beat and the scheduler, with SMTP_PORT at Postfix's smtp-sink
(bench/lib/smtp_sink.py) and EMAILHUB_WEBHOOKS_ALLOW_HTTP/_PRIVATE set: the endpoint is
outbound/testing/receiver.py's Receiver, in this process on 127.0.0.1, which verifies every request
with the `standardwebhooks` library and the endpoint's secret and records when it arrived. All of
them run in every mode (idle where unused), and all are stopped whatever happens (error, Ctrl-C,
SIGTERM). The bench has a database (`emailhub_bench_webhooks_out`, BENCH_DATABASE_SUFFIX) and Redis
database (8, BENCH_WEBHOOKS_OUT_REDIS_URL) of its own, claimed: each run empties them.

What it measures, per campaign:
- campaign emails/s: messages sent / (the last `sent_at` in PostgreSQL - the instant just before
  lifecycle.schedule(id, "immediate"));
- events/s: events received / (last - first arrival at the receiver);
- lag: each message's `sent_at` (the UPDATE that moved it to `sent`, and wrote its event) to the
  arrival of its event at the receiver, p50/p99/max;
- exactly once: every request verified by `standardwebhooks` and answered 200, one event per
  message sent and no other (distinct message ids == events == messages sent), distinct
  webhook-ids == requests (== messages sent, unbatched); in the database every delivery
  succeeded at its first attempt;
- CPU seconds from the schedule to the campaign's completion of each process group, of the
  bench database's PostgreSQL backends, of the sink, of this process (the receiver) and of the
  machine (/proc/stat); what is left, `others`, is Redis and whatever else runs on this shared
  machine: a run with many seconds there was measured against someone else's work. The webhooks
  worker's and the receiver's CPU per event until the last event arrived; the webhooks worker's
  tasks and the connections urllib3 discarded (its log).
Before each campaign the bench waits (up to --quiet-wait s) for a second in which the machine is
under --quiet busy, and notes the code (HEAD and a hash of uncommitted changes): a run whose code
differs from the others' is flagged, since others may be editing it while the bench runs.
The campaign is checked as bench/campaign.py does: sent_count == messages sent == recipients ==
the sink's count. The last lines are medians across runs, `webhooks_out_<metric>: value unit`;
`webhooks_out_campaign_ratio` (and `_batched_`) is the campaign's emails/s with the endpoint over
the same run's reference (the issue's target: >= 0.9).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
from django.db import connection  # noqa: E402

from bench.lib import audience as bench_audience  # noqa: E402
from bench.lib.audience import bench_template, ensure_audience  # noqa: E402
from bench.lib.common import LOG_DIR as LOGS  # noqa: E402
from bench.lib.common import bench_database, prepare_alone  # noqa: E402
from bench.lib.smtp_sink import PostfixSink, SinkUnavailable, free_port  # noqa: E402
from bench.lib.stats import group_stats, percentile  # noqa: E402
from outbound.testing.receiver import Receiver  # noqa: E402
from scripts.stack import Stack  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_webhooks_out")
# 8: no other bench uses it (9 campaign, 10 scheduler/sto, 11 attachments/fanout/metrics,
# 12 delivery, 13 webhooks/accept_inproc, 14 publish, 15 the tests).
REDIS_URL = os.environ.get("BENCH_WEBHOOKS_OUT_REDIS_URL", "redis://127.0.0.1:6379/8")
LOG_DIR = LOGS / "webhooks_out"
WEBHOOK_ENV = {"EMAILHUB_WEBHOOKS_ALLOW_HTTP": "1", "EMAILHUB_WEBHOOKS_ALLOW_PRIVATE": "1"}
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
# The target of the issue: the campaign within 10% of its throughput without an endpoint.
TARGET_RATIO = 0.9


# What the figures depend on; others may be editing them while the bench runs.
CODE_PATHS = ["outbound", "core", "delivery", "campaigns", "emailhub", "scripts/stack.py"]


def code_version() -> str:
    """HEAD, and a hash of the uncommitted changes to CODE_PATHS if any: a campaign of a run
    whose code differs from the first's is flagged."""

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False).stdout

    head = git("rev-parse", "--short", "HEAD").strip() or "?"
    changes = git("diff", "HEAD", "--", *CODE_PATHS)
    return head + (f"+{hashlib.sha1(changes.encode()).hexdigest()[:7]}" if changes else "")


def reset() -> None:
    """Empty messages, outbox, bench campaigns and Redis, and every endpoint with its events,
    deliveries and attempts: the interest function answers nobody until one is registered."""
    bench_audience.reset_state(REDIS_URL)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE core_outboundevent, outbound_endpoint CASCADE")


def register(web_port: int, api_key: str, url: str, batch: bool) -> tuple[int, str]:
    """An endpoint for `message.sent` through the API, as an application registers one."""
    response = requests.post(
        f"http://127.0.0.1:{web_port}/api/v1/webhook-endpoints",
        json={"url": url, "event_types": ["message.sent"], "batch": batch, "description": "bench"},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    if response.status_code != 201:
        raise RuntimeError(f"registering the endpoint: HTTP {response.status_code} {response.text[:500]}")
    found = response.json()
    return int(found["id"]), str(found["secret"])


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_quiet(limit: float, seconds: float) -> float:
    """Wait up to `seconds` for a second in which the machine is less than `limit` busy (the
    stack idle, no peer's tests taking the campaign's cores); the last second's busy share."""
    deadline = time.monotonic() + seconds
    while True:
        busy, total = machine_ticks()
        time.sleep(1.0)
        busy_after, total_after = machine_ticks()
        share = (busy_after - busy) / max(total_after - total, 1)
        if share < limit or time.monotonic() > deadline:
            return share


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


class CpuAccount:
    """CPU seconds used since construction by each process group of the stack, the PostgreSQL
    backends of the bench database, the sink, this process (the receiver's threads, and the
    polling) and the whole machine. `others` is the machine's less all of those: Redis, and
    whatever else runs on this shared machine (a peer's tests), which the campaign competes with.

    Backends are looked up every half second while the bench polls (`watch`): one that closes
    (CONN_MAX_AGE) loses at most its last half second, one that opens counts from zero.
    """

    def __init__(self, stack: Stack, groups: dict[str, int], sink_pid: int) -> None:
        self.stack, self.groups, self.sink_pid = stack, groups, sink_pid
        self._backends: dict[int, float] = {}
        self._sampled = 0.0
        self._sample_backends()
        self._base_backends = dict(self._backends)
        self._base = self._now()

    def _sample_backends(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            pids = [row[0] for row in cursor.fetchall()]
        self._backends.update({pid: pid_cpu(pid) or self._backends.get(pid, 0.0) for pid in pids})
        self._sampled = time.monotonic()

    def _now(self) -> dict[str, float]:
        busy, total = machine_ticks()
        return {
            **{name: group_stats(pgid)[1] for name, pgid in self.groups.items()},
            "postgres": sum(cpu - self._base_backends.get(pid, 0.0) for pid, cpu in self._backends.items()),
            "sink": pid_cpu(self.sink_pid),
            "receiver": time.process_time(),
            "machine": busy / CLOCK_TICK,
            "all cores": total / CLOCK_TICK,
        }

    def watch(self) -> None:
        """What the bench's wait loops call: every process still alive, backends sampled."""
        for process in self.stack.processes.values():
            if not process.alive:
                raise RuntimeError(f"{process.name} exited:\n{process.log()[-3000:]}")
        if time.monotonic() - self._sampled >= 0.5:
            self._sample_backends()

    def used(self) -> dict[str, float]:
        self._sample_backends()
        now = self._now()
        used = {name: now[name] - self._base[name] for name in now}
        used["others"] = used["machine"] - sum(
            v for k, v in used.items() if k not in ("machine", "all cores")
        )
        return used


def wait_completed(campaign_id: int, account: CpuAccount, timeout: float) -> dict[str, Any]:
    from campaigns.models import Campaign

    started = time.monotonic()
    while True:
        row = Campaign.objects.filter(pk=campaign_id).values("status", "sent_count", "total_count").get()
        if row["status"] == "completed":
            return row
        if row["status"] != "sending":
            raise RuntimeError(f"the campaign went {row['status']}: {row}")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not completed after {timeout:.0f}s: {row} (logs in {LOG_DIR})")
        account.watch()
        time.sleep(0.05)


def wait_events(receiver: Receiver, expected: int, account: CpuAccount, stall: float) -> None:
    """Until the receiver has `expected` events; fails if none arrives for `stall` seconds."""
    seen, last_progress = -1, time.monotonic()
    while (count := len(receiver.events())) < expected:
        if count != seen:
            seen, last_progress = count, time.monotonic()
        elif time.monotonic() - last_progress > stall:
            raise RuntimeError(
                f"{count:,} of {expected:,} events after {stall:.0f}s without one (see {LOG_DIR})"
            )
        account.watch()
        time.sleep(0.1)


def wait_deliveries_settled(timeout: float = 30.0) -> dict[str, int]:
    """Delivery statuses once none is pending, in flight or waiting for a retry (or at timeout):
    a duplicate request would have arrived by then."""
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM outbound_delivery GROUP BY status")
            statuses = dict(cursor.fetchall())
        if not set(statuses) & {"pending", "delivering", "retry_wait"} or time.monotonic() > deadline:
            return statuses
        time.sleep(0.1)


def task_counts(log: str) -> dict[str, int]:
    """Celery tasks the webhooks worker finished, by name, from its log; and the connections
    urllib3 dropped because its pool for the endpoint was full (a new connection for the next
    request: keep-alive lost)."""
    counts: dict[str, int] = {}
    for name in re.findall(r"Task ([\w.]+)\[[^\]]+\] succeeded", log):
        counts[name] = counts.get(name, 0) + 1
    counts["connections discarded (pool full)"] = log.count("Connection pool is full, discarding connection")
    return counts


def events_report(receiver: Receiver, sent_at: dict[int, float], batched: bool) -> dict[str, Any]:
    """What arrived: rates, lags and the exactly-once checks, against the messages sent."""
    last_sent = max(sent_at.values())
    statuses = wait_deliveries_settled()  # first: a duplicate would be in what is read below
    received = receiver.received
    arrivals: dict[int, float] = {}
    events = 0
    other_types = 0
    unknown = 0
    per_request = []
    for request in received:
        if not request.passed:
            continue
        items = request.json if isinstance(request.json, list) else [request.json]
        per_request.append(len(items))
        for item in items:
            events += 1
            if item.get("type") != "message.sent":
                other_types += 1
                continue
            message_id = int(item["data"]["message_id"])
            if message_id not in sent_at:
                unknown += 1
            arrivals.setdefault(message_id, request.received_at)
    times = sorted(r.received_at for r in received)
    lags = sorted((at - sent_at[m]) * 1000 for m, at in arrivals.items() if m in sent_at)
    webhook_ids = {r.headers.get("webhook-id") for r in received}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(*) FILTER (WHERE number > 1) FROM outbound_attempt")
        attempts, retries = cursor.fetchone()
        cursor.execute(
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY latency_ms),"
            " percentile_disc(0.99) WITHIN GROUP (ORDER BY latency_ms) FROM outbound_attempt"
        )
        attempt_p50, attempt_p99 = cursor.fetchone()
    deliveries = sum(statuses.values())
    checks = {
        "every request verified by standardwebhooks": all(r.verified for r in received),
        "every request answered 200": all(r.status == 200 for r in received),
        "one event per message sent (distinct == events == sent)": len(arrivals) == events == len(sent_at),
        "no event of another type or message": other_types == unknown == 0,
        "distinct webhook-ids == requests": len(webhook_ids) == len(received),
        "every delivery succeeded at its first attempt": statuses == {"succeeded": deliveries}
        and attempts == deliveries
        and retries == 0,
    }
    if not batched:
        checks["distinct webhook-ids == messages sent"] = len(webhook_ids) == len(sent_at)
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    # Once the campaign has sent its last message the receiver's rate is the webhooks' own, with
    # the cores no longer shared with sending.
    after = sum(1 for at in arrivals.values() if at > last_sent)
    drain = times[-1] - last_sent if times else 0.0
    return {
        "requests": len(received),
        "events": events,
        "distinct_events": len(arrivals),
        "events_per_request": events / max(len(per_request), 1),
        "largest_request": max(per_request, default=0),
        "first_received": times[0] if times else float("nan"),
        "last_received": times[-1] if times else float("nan"),
        "events_per_s": len(arrivals) / span,
        "events_after_last_sent": after,
        "drain_after_last_sent": drain,
        "events_per_s_after_last_sent": after / drain if drain > 0.1 else float("nan"),
        "lag_p50": percentile(lags, 50) if lags else float("nan"),
        "lag_p99": percentile(lags, 99) if lags else float("nan"),
        "lag_max": lags[-1] if lags else float("nan"),
        "attempt_p50": float(attempt_p50 or 0),
        "attempt_p99": float(attempt_p99 or 0),
        "deliveries": deliveries,
        "checks": checks,
    }


def campaign_run(
    mode: str, number: int, args: argparse.Namespace, env: dict[str, str], api_key: str, list_id: int
) -> dict[str, Any]:
    from campaigns import lifecycle
    from campaigns.models import Campaign

    reset()
    campaign_id = Campaign.objects.create(
        name=f"bench webhooks-out {mode} {number}", template=bench_template(), contact_list_id=list_id,
        priority="normal",
    ).pk  # fmt: skip
    sink = PostfixSink()
    stack = Stack(
        env={**env, **WEBHOOK_ENV, "SMTP_PORT": str(sink.port)}, log_dir=LOG_DIR / f"{mode}{number}"
    )
    receiver = Receiver()
    try:
        sink.start()
        web_port = free_port()
        groups = {
            "bulk": stack.start("worker-bulk", timeout=60).popen.pid,
            "webhooks": stack.start("worker-webhooks", timeout=60).popen.pid,
            "web": stack.start_web(web_port, workers=2).popen.pid,
            "beat": stack.start("beat", timeout=60).popen.pid,
            "scheduler": stack.start("scheduler", timeout=60).popen.pid,
        }
        if mode != "reference":
            _, receiver.secret = register(web_port, api_key, receiver.url, batch=mode == "batched")
        quiet = wait_quiet(args.quiet, args.quiet_wait)
        code = code_version()
        load = os.getloadavg()[0]
        account = CpuAccount(stack, groups, sink._popen.pid if sink._popen else 0)  # smtp-sink: no fork
        started = time.time()
        lifecycle.schedule(campaign_id, "immediate")
        done = wait_completed(campaign_id, account, args.timeout)
        cpu = account.used()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, extract(epoch FROM sent_at)::float8 FROM delivery_message"
                " WHERE campaign_id = %s AND status = 'sent'",
                [campaign_id],
            )
            sent_at = dict(cursor.fetchall())
        last_sent = max(sent_at.values())
        events: dict[str, Any] = {}
        if mode != "reference":
            wait_events(receiver, len(sent_at), account, args.stall)
            until_last_event = account.used()
            events = events_report(receiver, sent_at, batched=mode == "batched")
            for name in ("webhooks", "receiver"):
                events[f"{name}_cpu_per_event_ms"] = 1000 * until_last_event[name] / max(len(sent_at), 1)
        rss = {name: group_stats(pgid)[0] / 1024 for name, pgid in groups.items()}
        tasks = task_counts(stack.processes["worker-webhooks"].log())
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM core_outboundevent")
            (written,) = cursor.fetchone()
    finally:
        receiver.close()
        stack.stop_all()
        sink.stop()

    received_by_sink = sink.count()
    expected = args.expected
    problems = []
    if not (done["sent_count"] == len(sent_at) == done["total_count"] == expected):
        problems.append(f"campaign {done}, {len(sent_at)} messages sent, {expected} recipients")
    if received_by_sink != len(sent_at):
        problems.append(f"the sink received {received_by_sink} messages, the database sent {len(sent_at)}")
    if written != (0 if mode == "reference" else len(sent_at)):
        problems.append(f"{written} outbound events written for {len(sent_at)} messages sent")
    if mode == "reference" and receiver.received:
        problems.append(f"the receiver got {len(receiver.received)} requests with no endpoint")
    if problems:
        raise RuntimeError(f"{mode} {number}: " + "; ".join(problems))
    elapsed = last_sent - started
    return {
        "mode": mode,
        "load": load,
        "busy_before": quiet,
        "code": code,
        "sent": len(sent_at),
        "elapsed": elapsed,
        "emails_per_s": len(sent_at) / elapsed,
        "written": written,
        "cpu": cpu,
        **{f"cpu_{name}": seconds for name, seconds in cpu.items()},
        "machine_busy": cpu["machine"] / cpu["all cores"],
        "rss": rss,
        "tasks": tasks,
        **events,
    }


def print_run(number: int, r: dict[str, Any]) -> None:
    shown = {name: seconds for name, seconds in r["cpu"].items() if name not in ("machine", "all cores")}
    cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in shown.items())
    print(
        f"run {number} {r['mode']} (load average {r['load']:.2f}, machine {100 * r['busy_before']:.0f}% busy "
        f"the second before; code {r['code']}): {r['sent']:,} campaign emails "
        f"in {r['elapsed']:.1f} s = {r['emails_per_s']:,.0f} emails/s; {r['written']:,} outbound events "
        f"written\n"
        f"  CPU seconds until the campaign completed: machine {r['cpu']['machine']:.1f} of "
        f"{r['cpu']['all cores']:.1f} ({100 * r['machine_busy']:.0f}% busy): {cpu}",
        flush=True,
    )
    if r["mode"] == "reference":
        return
    tasks = ", ".join(f"{name} {count:,}" for name, count in sorted(r["tasks"].items()))
    print(
        f"  {r['distinct_events']:,} events in {r['requests']:,} requests ({r['events_per_request']:.1f} a "
        f"request, at most {r['largest_request']}) at {r['events_per_s']:,.0f} events/s (first to last "
        f"arrival); the last {r['drain_after_last_sent']:.1f} s after the last send ("
        f"{r['events_after_last_sent']:,} events then, {r['events_per_s_after_last_sent']:,.0f}/s)\n"
        f"  lag sent_at -> received: p50 {r['lag_p50']:,.0f} p99 {r['lag_p99']:,.0f} max "
        f"{r['lag_max']:,.0f} ms; attempt round trip p50 {r['attempt_p50']:.1f} p99 {r['attempt_p99']:.1f} ms\n"
        f"  CPU per event until the last arrived: webhooks worker {r['webhooks_cpu_per_event_ms']:.2f} ms, "
        f"receiver {r['receiver_cpu_per_event_ms']:.2f} ms; webhooks worker peak RSS "
        f"{r['rss']['webhooks']:.0f} MB; its log: {tasks or '-'}",
        flush=True,
    )
    for check, passed in r["checks"].items():
        print(f"  {'ok  ' if passed else 'FAIL'} {check}", flush=True)


# (key, unit, format) of the per-mode figures in the median table.
FIGURES = [
    ("emails_per_s", "emails/s", "{:,.0f}"),
    ("events_per_s", "events/s", "{:,.0f}"),
    ("lag_p50", "ms", "{:,.0f}"),
    ("lag_p99", "ms", "{:,.0f}"),
    ("drain_after_last_sent", "s", "{:.1f}"),
    ("events_per_s_after_last_sent", "events/s", "{:,.0f}"),
    ("webhooks_cpu_per_event_ms", "ms", "{:.2f}"),
    ("receiver_cpu_per_event_ms", "ms", "{:.2f}"),
    # CPU seconds from the schedule to the campaign's completion.
    ("cpu_machine", "s", "{:.1f}"),
    ("cpu_bulk", "s", "{:.1f}"),
    ("cpu_postgres", "s", "{:.1f}"),
    ("cpu_webhooks", "s", "{:.1f}"),
    ("cpu_receiver", "s", "{:.1f}"),
    ("cpu_sink", "s", "{:.1f}"),
    ("cpu_others", "s", "{:.1f}"),
    ("machine_busy", "share", "{:.2f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1, help="runs of the three campaigns")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a campaign may take")
    parser.add_argument(
        "--stall", type=float, default=60.0, help="seconds without an event before the run fails"
    )
    parser.add_argument(
        "--quiet", type=float, default=0.2, help="busy share of the machine under which a campaign starts"
    )
    parser.add_argument(
        "--quiet-wait", type=float, default=180.0, help="seconds to wait for that before starting anyway"
    )
    args = parser.parse_args()
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = prepare_alone(BENCH_DB, REDIS_URL)
    from delivery.authentication import create_api_key

    api_key = create_api_key(f"bench-webhooks-out-{time.time_ns()}", ["manage"])[1]
    try:
        list_id, args.expected, _ = ensure_audience(args.recipients, 0)
        print(
            f"database {BENCH_DB}, redis {REDIS_URL}, sink: postfix smtp-sink, logs in {LOG_DIR}\n"
            f"{args.runs} run(s) of three {args.expected:,}-recipient campaigns: no endpoint, an "
            f"endpoint for message.sent unbatched, and batched; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"reference": [], "unbatched": [], "batched": []}
        for number in range(1, args.runs + 1):
            order = ["unbatched", "batched"] if number % 2 else ["batched", "unbatched"]
            for mode in ["reference", *order]:
                runs[mode].append(campaign_run(mode, number, args, env, api_key, list_id))
                print_run(number, runs[mode][-1])
    except SinkUnavailable as exc:
        print(f"Postfix smtp-sink is not available: {exc}", file=sys.stderr)
        return 2
    finally:
        reset()  # no 100,000 message rows, events nor queued tasks left behind

    ratios = {
        mode: median(
            r["emails_per_s"] / ref["emails_per_s"]
            for r, ref in zip(runs[mode], runs["reference"], strict=True)
        )
        for mode in ("unbatched", "batched")
    }
    ok = all(all(r["checks"].values()) for mode in ("unbatched", "batched") for r in runs[mode])
    codes = sorted({r["code"] for rs in runs.values() for r in rs})
    if len(codes) > 1:
        print(
            f"WARNING: the code changed during this invocation ({', '.join(codes)}): runs differ in more than load"
        )
    print()
    for number, triple in enumerate(zip(*runs.values(), strict=True), 1):
        ref, unbatched, batched = triple
        others = ", ".join(f"{r['cpu_others']:.1f}" for r in triple)
        print(
            f"run {number}: ratio unbatched {unbatched['emails_per_s'] / ref['emails_per_s']:.3f}, batched "
            f"{batched['emails_per_s'] / ref['emails_per_s']:.3f}; CPU s of other processes during the "
            f"campaigns (Redis, a peer's work): {others}"
        )
    print(f"median of {args.runs} run(s){'':<14}{'reference':>12}{'unbatched':>12}{'batched':>12}")
    for key, unit, fmt in FIGURES:
        cells = [fmt.format(median(r[key] for r in runs[m])) if key in runs[m][0] else "-" for m in runs]
        print(f"{key + ' (' + unit + ')':<36}" + "".join(f"{cell:>12}" for cell in cells))
    for mode, ratio in ratios.items():
        verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
        print(f"campaign with a {mode} endpoint {verdict} within 10% of the run without (ratio {ratio:.3f})")
    print(
        f"every event exactly once, verified: {'yes' if ok else 'NO'}; load average now {os.getloadavg()[0]:.2f}"
    )
    med = {
        mode: {key: median(r[key] for r in rs) for key, _, _ in FIGURES if key in rs[0]}
        for mode, rs in runs.items()
    }
    print(f"webhooks_out_reference_emails_per_s: {med['reference']['emails_per_s']:.0f} emails/s")
    print(f"webhooks_out_emails_per_s: {med['unbatched']['emails_per_s']:.0f} emails/s")
    print(f"webhooks_out_batched_emails_per_s: {med['batched']['emails_per_s']:.0f} emails/s")
    for prefix, mode in (("webhooks_out", "unbatched"), ("webhooks_out_batched", "batched")):
        print(f"{prefix}_events_per_s: {med[mode]['events_per_s']:.0f} events/s")
        print(f"{prefix}_lag_p50_ms: {med[mode]['lag_p50']:.0f} ms")
        print(f"{prefix}_lag_p99_ms: {med[mode]['lag_p99']:.0f} ms")
        print(f"{prefix}_cpu_per_event_ms: {med[mode]['webhooks_cpu_per_event_ms']:.2f} ms")
    print(f"webhooks_out_exactly_once: {1 if ok else 0} bool")
    print(f"webhooks_out_campaign_ratio: {ratios['unbatched']:.3f}")
    print(f"webhooks_out_batched_campaign_ratio: {ratios['batched']:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        sys.exit(130)
