"""Delivery benchmark: bulk throughput per provider, failover time and outages, on real processes.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/delivery.py [--only throughput,failover,ses-down,outage] [--runs 1]
                                       [--messages 10000] [--outage-seconds 60]

Everything is the real pipeline except the providers' far ends: `queued` rows in PostgreSQL,
`delivery.send_messages` tasks published with send_tasks.record_send onto the Redis broker, the
standard `worker-bulk` command of scripts/stack.py (concurrency 2) started with env overrides,
the `scheduler` and gunicorn where a scenario needs them, and the real provider clients (smtplib,
boto3 sesv2, the sendgrid library) talking to local servers: Postfix `smtp-sink` (C, see
bench/lib/smtp_sink.py) for SMTP throughput; moto's SES in server mode behind SESTestServer's
fault-injecting proxy; SendGridTestServer (`POST /v3/mail/send`); and, where a scenario needs an
SMTP server that refuses on command and names whom it received, the aiosmtpd SMTPTestServer.
The three Python servers run in threads of this process. Both HTTP test servers, as shipped,
stall ~40 ms per request on Nagle + delayed ACK; the bench sets TCP_NODELAY on their sockets
(in this process only; `--keep-nagle` to measure them as shipped).

The bench has a database (`emailhub_bench_delivery`) and Redis database (12) of its own, created
and migrated if missing, like bench/transactional.py but not the same ones: both benches empty
their tables and flush Redis, and must not do it under each other when run at once. Every
scenario starts from emptied tables, a flushed Redis (which also resets the circuit breakers
and rate buckets) and freshly started processes; it always stops them, also on error, Ctrl-C
or SIGTERM. Worker logs stay in bench/.cache/logs/delivery/. A FLUSHALL by anyone else (seen in
Redis's commandstats) wipes this bench's queue and schedule index too: such a scenario's figures
are dropped and reported as invalid.

throughput  For smtp, ses and sendgrid in turn: bulk_create --messages queued normal-priority
            messages (untimed), start worker-bulk with EMAILHUB_PROVIDERS_BULK=<provider>, publish
            the ids in tasks of 100 (EMAILHUB_BATCH_SIZE_NORMAL's default), and time the first
            publish to the last `sent_at` in PostgreSQL. The server's own count must equal what
            the database calls sent. --warmup messages go first, unmeasured (imports, clients,
            connections). The CPU this process spends is shown: it hosts moto and the SendGrid
            server, so when it nears one core (the GIL) the test server is the limit, not emailhub.
failover    Chain ses,sendgrid,smtp, default breaker (fail_max 10). A thread publishes small
            batches at a steady rate; after --failover-lead seconds SES answers 500 to
            everything. Measured: the first `sent_at` via sendgrid minus that instant. Also the
            SES calls refused before its circuit opened, and the circuit as a real gunicorn's
            GET /api/v1/providers shows it.
ses-down    Chain ses,sendgrid,smtp with SES answering 500 throughout; --messages messages. The
            servers list whom they delivered to: lost = messages - unique recipients delivered,
            duplicates = deliveries - unique recipients.
outage      1,000 messages while SES answers 500, SendGrid 503 and SMTP 421 for --outage-seconds,
            with the scheduler re-queueing `retry_wait` messages (retry backoff 1..5 s, 1000
            attempts, breaker reset timeout 5 s). Then all three heal at once; measured: the last
            `sent_at` minus that instant, then lost and duplicates as above.

The last lines are medians across --runs, one `name: value unit` each.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.lib.common import bench_database, prepare  # noqa: E402
from bench.lib.smtp_sink import PostfixSink, free_port  # noqa: E402
from bench.lib.stats import group_stats  # noqa: E402
from delivery.testing import sendgrid_server, ses_server  # noqa: E402
from delivery.testing.sendgrid_server import SendGridTestServer  # noqa: E402
from delivery.testing.ses_server import SESTestServer  # noqa: E402
from delivery.testing.smtp_server import SMTPTestServer  # noqa: E402
from scripts.stack import Stack  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_delivery")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
LOG_DIR = ROOT / "bench" / ".cache" / "logs" / "delivery"
SCENARIOS = ("throughput", "failover", "ses-down", "outage")
PROVIDERS = ("smtp", "ses", "sendgrid")
CHAIN = "ses,sendgrid,smtp"
BATCH = 100  # EMAILHUB_BATCH_SIZE_NORMAL's default: what fan-out and the sweeps publish per task
METRICS = {  # name -> (unit, decimals), in the order they are printed
    "delivery_smtp_emails_per_s": ("emails/s", 0),
    "delivery_ses_emails_per_s": ("emails/s", 0),
    "delivery_sendgrid_emails_per_s": ("emails/s", 0),
    "delivery_failover_ms": ("ms", 0),
    "delivery_ses_refused_before_open": ("calls", 0),
    "delivery_ses_down_emails_per_s": ("emails/s", 0),
    "delivery_ses_down_lost": ("messages", 0),
    "delivery_ses_down_duplicates": ("messages", 0),
    "delivery_outage_recovery_s": ("s", 1),
    "delivery_outage_lost": ("messages", 0),
    "delivery_outage_duplicates": ("messages", 0),
}


class NotAllSent(RuntimeError):
    """The messages did not all reach `sent` (a final failure, or the timeout)."""


@dataclass
class Context:
    args: argparse.Namespace
    env: dict[str, str]  # database and Redis of the bench, for every process
    api_key: str
    ses: SESTestServer
    sendgrid: SendGridTestServer
    smtp: SMTPTestServer  # aiosmtpd: it can refuse on command and records every recipient

    def provider_env(self, chain: str, smtp_port: int | None = None) -> dict[str, str]:
        return {
            "EMAILHUB_PROVIDERS_BULK": chain,
            "SMTP_PORT": str(smtp_port or self.smtp.port),
            "SES_ENDPOINT_URL": self.ses.endpoint_url,
            "SES_ACCESS_KEY_ID": "test",
            "SES_SECRET_ACCESS_KEY": "test",
            "SENDGRID_API_KEY": self.sendgrid.api_key,
            "SENDGRID_HOST": self.sendgrid.url,
        }

    def reset(self) -> None:
        """Empty tables, broker, breakers and every server's record and injected faults."""
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE delivery_message, core_outboxtask, campaigns_suppression CASCADE")
        redis.Redis.from_url(REDIS_URL).flushdb()
        self.ses.reset()
        self.sendgrid.clear()
        self.smtp.clear()

    def deliveries(self) -> Counter[str]:
        """Every delivery the three servers accepted, counted by recipient."""
        received: Counter[str] = Counter()
        received.update(to for tos, _ in self.ses.sent() for to in tos)
        received.update(d.to for d in self.sendgrid.delivered)
        received.update(to for m in self.smtp.messages for to in m.rcpt_tos)
        return received

    def server_counts(self) -> str:
        return f"ses {self.ses.count}, sendgrid {len(self.sendgrid.delivered)}, smtp {self.smtp.count}"


# --- database helpers ---------------------------------------------------------------------------


def new_messages(count: int, tag: str) -> list[int]:
    """Insert `queued` normal-priority messages (one recipient each, personalised body); no task yet."""
    from django.conf import settings
    from django.utils import timezone

    from delivery.models import Message

    now = timezone.now()
    rows = [
        Message(
            to_email=f"{tag}{i}@example.com",
            from_email=settings.EMAILHUB_DEFAULT_FROM,
            subject=f"Your weekly digest #{i}",
            text=f"Hello {tag}{i},\n\nHere is what happened on your account this week.\n",
            html=f"<html><body><p>Hello <b>{tag}{i}</b>,</p><p>Here is what happened this week.</p></body></html>",
            priority="normal",
            status="queued",
            queued_at=now,
        )
        for i in range(count)
    ]
    return [m.pk for m in Message.objects.bulk_create(rows, batch_size=2000)]


def publish(ids: list[int], batch: int = BATCH) -> None:
    """One outbox task per `batch` ids in one transaction, as the sweeps do; published on commit."""
    from delivery.services import send_tasks

    with transaction.atomic():
        for start in range(0, len(ids), batch):
            send_tasks.record_send(ids[start : start + batch], "normal")


def query(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def statuses(ids: list[int]) -> dict[str, int]:
    return dict(
        query("SELECT status, count(*) FROM delivery_message WHERE id = ANY(%s) GROUP BY status", [ids])
    )


def last_sent_at(ids: list[int]) -> float:
    return float(
        query("SELECT EXTRACT(EPOCH FROM max(sent_at)) FROM delivery_message WHERE id = ANY(%s)", [ids])[0][0]
    )


def sent_by_provider(ids: list[int]) -> dict[str, int]:
    rows = query(
        "SELECT provider, count(*) FROM delivery_message WHERE id = ANY(%s) AND status = 'sent' GROUP BY 1",
        [ids],
    )
    return dict(rows)


def wait_sent(ids: list[int], timeout: float, *, retries_expected: bool = False) -> None:
    """Poll until every message is `sent`; raise NotAllSent on a final failure or at the timeout.

    Without a scheduler a `retry_wait` message would wait forever, so it is an error unless the
    scenario runs one (`retries_expected`).
    """
    fatal = {"failed", "suppressed", "cancelled"} | (set() if retries_expected else {"retry_wait"})
    deadline = time.monotonic() + timeout
    while True:
        by_status = statuses(ids)
        if by_status.get("sent", 0) == len(ids):
            return
        if fatal & set(by_status):
            raise NotAllSent(f"messages not sent: {by_status}")
        if time.monotonic() > deadline:
            raise NotAllSent(f"not all sent after {timeout:.0f}s: {by_status}")
        time.sleep(0.1)  # 10 cheap queries a second: negligible next to the load measured


# --- processes ----------------------------------------------------------------------------------


@contextmanager
def processes(ctx: Context, log_name: str, extra_env: dict[str, str], names: list[str]) -> Iterator[Stack]:
    """Start `names` (standard commands from scripts/stack.py) with extra_env; always stop them."""
    stack = Stack(env=ctx.env, log_dir=LOG_DIR / log_name)
    try:
        for name in names:
            stack.start(name, extra_env=extra_env, timeout=60)
        yield stack
    finally:
        stack.stop_all()


def log_excerpt(log_name: str, lines: int = 12) -> str:
    """The last warning/error lines of each process log of a scenario, to show what went wrong."""
    out = []
    for path in sorted((LOG_DIR / log_name).glob("*.log")):
        hits = [
            line for line in path.read_text(errors="replace").splitlines()
            if re.search(r"WARNING|ERROR|CRITICAL|Traceback|Exception", line)
        ]  # fmt: skip
        if hits:
            out.append(f"  --- {path.relative_to(ROOT)}: last {min(lines, len(hits))} of {len(hits)} lines")
            out.extend(f"  {line[:300]}" for line in hits[-lines:])
    return "\n".join(out)


def flushall_calls() -> int:
    """FLUSHALL calls the Redis server has seen, from any client: one wipes this bench's data too."""
    stats = redis.Redis.from_url(REDIS_URL).info("commandstats")
    return int(stats.get("cmdstat_flushall", {}).get("calls", 0))


def check_exactly_once(ctx: Context, tag: str, count: int, label: str) -> tuple[int, int]:
    """Compare what the servers delivered with the recipients expected; print, return (lost, dupes)."""
    received = ctx.deliveries()
    expected = {f"{tag}{i}@example.com" for i in range(count)}
    unique = len(expected & set(received))
    delivered = sum(n for to, n in received.items() if to in expected)
    strangers = sum(n for to, n in received.items() if to not in expected)
    lost, duplicates = count - unique, delivered - unique
    print(
        f"  {label}: servers delivered {delivered} ({ctx.server_counts()}), {unique} unique of {count}: "
        f"lost {lost}, duplicates {duplicates}"
        + (f", {strangers} to unexpected addresses" if strangers else "")
    )
    return lost, duplicates


# --- scenarios ----------------------------------------------------------------------------------


def throughput(ctx: Context, run: int) -> dict[str, float]:
    args, results = ctx.args, {}
    for provider in args.providers:
        ctx.reset()
        log_name = f"run{run}-throughput-{provider}"
        with ExitStack() as cleanup:
            # SMTP throughput against Postfix's smtp-sink (C): the aiosmtpd server would be the limit.
            sink = cleanup.enter_context(PostfixSink()) if provider == "smtp" else None
            env = ctx.provider_env(provider, smtp_port=sink.port if sink else None)
            stack = cleanup.enter_context(processes(ctx, log_name, env, ["worker-bulk"]))
            worker = stack.processes["worker-bulk"]
            warm = new_messages(args.warmup, f"warm-{provider}-")
            publish(warm)
            wait_sent(warm, args.timeout)

            ids = new_messages(args.messages, f"{provider}-")
            cpu_self, cpu_worker = time.process_time(), group_stats(worker.popen.pid)[1]
            started = time.time()  # epoch seconds, comparable with PostgreSQL's clock_timestamp()
            publish(ids)
            try:
                wait_sent(ids, args.timeout)
            except NotAllSent:
                print(log_excerpt(log_name))
                raise
            wall = last_sent_at(ids) - started
            # Timed up to when the poll saw the last one, a little past `wall`: fine for a CPU share.
            polled = time.time() - started
            cpu_self = (time.process_time() - cpu_self) / polled
            rss_kb, cpu_after = group_stats(worker.popen.pid)  # peak RSS: sum of VmHWM, an upper bound
            cpu_worker = (cpu_after - cpu_worker) / polled
            if sink is not None:
                received, server = sink.count(), sink.name
            elif provider == "ses":
                received, server = ctx.ses.count, "moto SES (via proxy)"
            else:
                received, server = len(ctx.sendgrid.delivered), "SendGridTestServer"
        expected = args.warmup + args.messages
        if received != expected:
            raise RuntimeError(f"{server} received {received} message(s); the database says {expected} sent")
        rate = args.messages / wall
        results[f"delivery_{provider}_emails_per_s"] = rate
        print(
            f"  {provider}: {args.messages} in {wall:.2f} s = {rate:.0f} emails/s; {server} received "
            f"{received} (= {args.warmup} warm-up + {args.messages}, as the database says)\n"
            f"    CPU: worker-bulk {cpu_worker * 100:.0f}% of a core, this process (servers, polling) "
            f"{cpu_self * 100:.0f}%; worker-bulk peak RSS {rss_kb / 1024:.0f} MB",
            flush=True,
        )
        # This process hosts the Python test servers, one core at most (the GIL). When it works
        # harder than the worker, the worker mostly waits on it: the server limits the rate.
        server_bound = provider != "smtp" and cpu_self > max(cpu_worker, 0.5)
        if provider == "ses":
            print(
                "    note: moto is pure Python, in this process, behind a Python proxy (two HTTP hops per email)"
                + ("; it is the bottleneck here: this is moto's rate, not emailhub's" if server_bound else "")
            )
        elif server_bound:
            print("    note: the in-process SendGrid server is the bottleneck here, not emailhub")
    return results


class Feeder(threading.Thread):
    """Publishes `batch` ids every batch/rate seconds from pre-inserted messages: a steady stream."""

    def __init__(self, pool: list[int], batch: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.pool, self.batch, self.interval = pool, batch, batch / rate
        self.published: list[tuple[float, list[int]]] = []  # (epoch after publish, ids)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from delivery.services import send_tasks

        next_at = time.monotonic()
        try:
            for start in range(0, len(self.pool), self.batch):
                if self.stopping.is_set():
                    break
                ids = self.pool[start : start + self.batch]
                with transaction.atomic():
                    send_tasks.record_send(ids, "normal")
                self.published.append((time.time(), ids))
                next_at += self.interval  # a fixed schedule, so slow publishes do not lower the rate
                self.stopping.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - handed to the main thread, which reports it
            self.error = exc
        finally:
            connection.close()  # this thread's own database connection

    @property
    def ids(self) -> list[int]:
        return [i for _, ids in self.published for i in ids]


def failover(ctx: Context, run: int) -> dict[str, float]:
    args = ctx.args
    ctx.reset()
    log_name = f"run{run}-failover"
    env = ctx.provider_env(CHAIN)  # EMAILHUB_BREAKER_FAIL_MAX left at its default (10)
    pool = new_messages(int(args.stream_rate * (args.failover_lead + 40)), "fo")
    feeder = Feeder(pool, args.stream_batch, args.stream_rate)
    with processes(ctx, log_name, env, ["worker-bulk", "scheduler"]) as stack:
        port = free_port()
        stack.start_web(port, extra_env=env)

        def ses_circuit() -> dict[str, Any]:
            response = requests.get(
                f"http://127.0.0.1:{port}/api/v1/providers",
                headers={"Authorization": f"Bearer {ctx.api_key}"},
                timeout=5,
            )
            response.raise_for_status()
            return next(p for p in response.json()["providers"] if p["name"] == "ses")["circuit"]

        feeder.start()
        try:
            time.sleep(args.failover_lead)  # steady state: every batch via SES
            before = sent_by_provider(feeder.ids)
            failing_at = time.time()
            ctx.ses.fail_with(500)
            deadline, circuit = time.monotonic() + 30, ses_circuit()
            while circuit["state"] != "open" and time.monotonic() < deadline:
                time.sleep(0.1)
                circuit = ses_circuit()
            seen_open = time.time()
            time.sleep(1.0)  # the stream goes on with SES skipped
        finally:
            feeder.stopping.set()
            feeder.join()
        if feeder.error is not None:
            raise RuntimeError(f"the feeder failed: {feeder.error!r}")
        ids = feeder.ids
        try:
            wait_sent(ids, args.timeout, retries_expected=True)
        except NotAllSent:
            print(log_excerpt(log_name))
            raise
        circuit = ses_circuit()
    refused = ctx.ses.refused_count
    first = query(
        "SELECT EXTRACT(EPOCH FROM min(sent_at)) FROM delivery_message WHERE id = ANY(%s) AND provider = 'sendgrid'",
        [ids],
    )[0][0]
    if before.get("sendgrid") or not before.get("ses"):
        print(f"  SURPRISE: before SES failed the stream was sent by {before} (expected SES only)")
    if first is None:
        raise RuntimeError(f"nothing was sent via sendgrid after SES failed: {sent_by_provider(ids)}")
    failover_ms = (float(first) - failing_at) * 1000
    next_publish = min((t for t, _ in feeder.published if t >= failing_at), default=float("nan"))
    fail_max = circuit["fail_max"]
    print(
        f"  stream: {args.stream_batch} messages every {args.stream_batch / args.stream_rate * 1000:.0f} ms "
        f"({args.stream_rate:.0f}/s), {len(ids)} published, all sent: {sent_by_provider(ids)}\n"
        f"  SES answers 500 from T; first sendgrid send at T+{failover_ms:.0f} ms "
        f"(next batch published at T+{(next_publish - failing_at) * 1000:.0f} ms); "
        f"API saw the circuit open by T+{(seen_open - failing_at) * 1000:.0f} ms (polled every 0.1 s)\n"
        f"  SES refused {refused} call(s) before its circuit opened (fail_max {fail_max}); "
        f"GET /api/v1/providers: ses state={circuit['state']}, failures_total={circuit['failures_total']}, "
        f"times_opened={circuit['times_opened']}, last_error={circuit['last_error']!r}"
    )
    if circuit["state"] != "open":
        raise RuntimeError(f"the API does not show the SES circuit open: {circuit}")
    # The breaker counts a refusal only when it fails a whole batch: one that comes after an
    # accepted email of the same batch ends that batch normally (its rest is transient and
    # fails over), which pybreaker records as a success. Those are refused - failures_total.
    uncounted = refused - circuit["failures_total"]
    print(f"  of the {refused} refusals, {uncounted} came mid-batch (not counted by the breaker)")
    if circuit["failures_total"] > fail_max + 1:  # +1: the other worker process's call in flight
        print(f"  SURPRISE: the breaker counted {circuit['failures_total']} failures, fail_max is {fail_max}")
    published = {to for (to,) in query("SELECT to_email FROM delivery_message WHERE id = ANY(%s)", [ids])}
    received = ctx.deliveries()
    unique = len(published & set(received))
    print(
        f"  stream check: {len(published) - unique} lost, "
        f"{sum(n for to, n in received.items() if to in published) - unique} duplicated"
    )
    return {"delivery_failover_ms": failover_ms, "delivery_ses_refused_before_open": float(refused)}


def ses_down(ctx: Context, run: int) -> dict[str, float]:
    args = ctx.args
    ctx.reset()
    log_name = f"run{run}-ses-down"
    ctx.ses.fail_with(500)
    ids = new_messages(args.messages, "down")
    results: dict[str, float] = {}
    with processes(ctx, log_name, ctx.provider_env(CHAIN), ["worker-bulk", "scheduler"]):
        started = time.time()
        publish(ids)
        try:
            wait_sent(ids, args.timeout, retries_expected=True)
            wall = last_sent_at(ids) - started
            results["delivery_ses_down_emails_per_s"] = args.messages / wall
            print(f"  all {args.messages} sent in {wall:.2f} s = {args.messages / wall:.0f} emails/s")
        except NotAllSent as exc:  # still count what arrived: lost mail is what this measures
            print(f"  NOT ALL SENT: {exc}\n{log_excerpt(log_name)}")
    retried = query("SELECT count(*) FROM delivery_message WHERE id = ANY(%s) AND attempts > 1", [ids])[0][0]
    print(
        f"  database: sent by provider {sent_by_provider(ids)}, {retried} needed more than one attempt; "
        f"SES refused {ctx.ses.refused_count} call(s)"
    )
    lost, duplicates = check_exactly_once(ctx, "down", args.messages, "exactly once")
    if lost or duplicates:
        print(log_excerpt(log_name))
    results.update(delivery_ses_down_lost=lost, delivery_ses_down_duplicates=duplicates)
    return results


def outage(ctx: Context, run: int) -> dict[str, float]:
    args = ctx.args
    ctx.reset()
    log_name = f"run{run}-outage"
    env = {
        **ctx.provider_env(CHAIN),
        # Short backoff and reset timeout, so recovery is measured in seconds; attempts enough
        # that nothing gives up during the outage.
        "EMAILHUB_RETRY_BASE_SECONDS": "1",
        "EMAILHUB_RETRY_MAX_SECONDS": "5",
        "EMAILHUB_MAX_ATTEMPTS": "1000",
        "EMAILHUB_BREAKER_RESET_TIMEOUT": "5",
    }
    count = args.outage_messages
    ctx.ses.fail_with(500)
    ctx.sendgrid.fail_with(503)
    ctx.smtp.reply_to_everyone("421 4.3.2 service not available")
    ids = new_messages(count, "out")
    results: dict[str, float] = {}
    with processes(ctx, log_name, env, ["worker-bulk", "scheduler"]):
        publish(ids)
        down_until = time.monotonic() + args.outage_seconds
        next_report = time.monotonic() + 10
        while (now := time.monotonic()) < down_until:
            if now >= next_report:
                print(
                    f"  outage +{args.outage_seconds - (down_until - now):.0f} s: {statuses(ids)}", flush=True
                )
                next_report += 10
            time.sleep(0.5)
        during = statuses(ids)
        if during.get("sent") or during.get("failed"):
            print(f"  SURPRISE: during the outage: {during}")
        healed_at = time.time()
        ctx.ses.fail_with(None)
        ctx.sendgrid.fail_with(None)
        ctx.smtp.reply_to_everyone(None)
        print(f"  healed after {args.outage_seconds:.0f} s (statuses then: {during})", flush=True)
        try:
            wait_sent(ids, args.timeout, retries_expected=True)
            recovery = last_sent_at(ids) - healed_at
            results["delivery_outage_recovery_s"] = recovery
            print(f"  all {count} sent {recovery:.2f} s after the heal")
        except NotAllSent as exc:
            print(f"  NOT ALL SENT: {exc}\n{log_excerpt(log_name)}")
    attempts = query(
        "SELECT min(attempts), percentile_disc(0.5) WITHIN GROUP (ORDER BY attempts), max(attempts) "
        "FROM delivery_message WHERE id = ANY(%s)",
        [ids],
    )[0]
    print(
        f"  database: sent by provider {sent_by_provider(ids)}; attempts min/median/max {attempts}; "
        f"refused during the outage: ses {ctx.ses.refused_count}, sendgrid {ctx.sendgrid.refused_count}"
    )
    lost, duplicates = check_exactly_once(ctx, "out", count, "exactly once")
    if lost or duplicates:
        print(log_excerpt(log_name))
    results.update(delivery_outage_lost=lost, delivery_outage_duplicates=duplicates)
    return results


RUNNERS: dict[str, Callable[[Context, int], dict[str, float]]] = {
    "throughput": throughput,
    "failover": failover,
    "ses-down": ses_down,
    "outage": outage,
}


# --- set-up and main ----------------------------------------------------------------------------


def setup() -> tuple[dict[str, str], str]:
    """Create and migrate the bench database; return the processes' env and a fresh API key."""
    env = prepare(BENCH_DB, REDIS_URL)
    from delivery.authentication import create_api_key

    # Sends, reads its messages and watches /api/v1/providers (a `manage` endpoint).
    return env, create_api_key(f"bench-delivery-{time.time_ns()}", ["send", "read", "manage"])[1]


def comma_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        items = [item.strip() for item in value.split(",") if item.strip()]
        unknown = set(items) - set(allowed)
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        return [item for item in allowed if item in items]  # canonical order

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", type=comma_list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument(
        "--providers", type=comma_list(PROVIDERS), default=list(PROVIDERS), help="for throughput"
    )
    parser.add_argument("--runs", type=int, default=1, help="medians are reported when more than 1")
    parser.add_argument("--messages", type=int, default=10_000, help="for throughput and ses-down")
    parser.add_argument(
        "--warmup", type=int, default=200, help="unmeasured messages before each throughput run"
    )
    parser.add_argument("--stream-rate", type=float, default=100.0, help="failover: messages per second")
    parser.add_argument("--stream-batch", type=int, default=10, help="failover: messages per task")
    parser.add_argument("--failover-lead", type=float, default=3.0, help="failover: seconds before SES fails")
    parser.add_argument("--outage-seconds", type=float, default=60.0)
    parser.add_argument("--outage-messages", type=int, default=1000)
    parser.add_argument(
        "--keep-nagle",
        action="store_true",
        help="leave the SES/SendGrid test servers as shipped (~40 ms a request)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for all sent")
    args = parser.parse_args()
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    env, api_key = setup()
    # Django's LOGGING sends INFO to the console; aiosmtpd logs every SMTP command at INFO.
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    if not args.keep_nagle:
        # Both HTTP test servers write a response's headers and body in two send()s on a
        # keep-alive connection: Nagle holds the body until the client's delayed ACK, ~40 ms per
        # request (measured here: 48 ms per SES call through the proxy, 2.8 ms with TCP_NODELAY).
        # That would cap SES near 40 emails/s and SendGrid near 2 x 100 emails / 45 ms whatever
        # emailhub does, so the bench turns Nagle off on their accepted sockets (this process only).
        ses_server._Proxy.disable_nagle_algorithm = True
        sendgrid_server._Handler.disable_nagle_algorithm = True
    results: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    with SESTestServer() as ses, SendGridTestServer() as sendgrid, SMTPTestServer() as smtp:
        ctx = Context(args, env, api_key, ses, sendgrid, smtp)
        print(
            f"database {BENCH_DB}, redis {REDIS_URL}, logs in {LOG_DIR.relative_to(ROOT)}\n"
            f"servers: Postfix smtp-sink (smtp throughput), moto SES behind a proxy at {ses.endpoint_url}, "
            f"SendGridTestServer at {sendgrid.url}, aiosmtpd SMTPTestServer on port {smtp.port} (smtp leg "
            f"of the chain {CHAIN})\nscenarios: {', '.join(args.only)}; {args.runs} run(s)",
            flush=True,
        )
        for run in range(1, args.runs + 1):
            for scenario in args.only:
                print(f"run {run}, {scenario} (load average {os.getloadavg()[0]:.2f})", flush=True)
                started, flushes = time.monotonic(), flushall_calls()
                try:
                    measured = RUNNERS[scenario](ctx, run)
                except RuntimeError as exc:  # NotAllSent, a process that would not start, a miscount
                    errors.append(f"run {run} {scenario}: {exc}")
                    print(f"  FAILED: {exc}", flush=True)
                    measured = {}
                if (flushes := flushall_calls() - flushes) > 0:
                    errors.append(
                        f"run {run} {scenario}: invalid, {flushes} FLUSHALL from elsewhere meanwhile"
                    )
                    print(
                        f"  INVALID: Redis saw {flushes} FLUSHALL meanwhile (not from this bench, which "
                        "only FLUSHDBs its own database): it wiped this bench's broker queue, breakers "
                        "and schedule index, so these figures are dropped",
                        flush=True,
                    )
                    measured = {}
                for name, value in measured.items():
                    results[name].append(value)
                print(f"  ({time.monotonic() - started:.0f} s)", flush=True)

    for error in errors:
        print(f"error: {error}")
    print(f"medians of {args.runs} run(s)" if args.runs > 1 else "one run (use --runs N for medians)")
    for name, (unit, decimals) in METRICS.items():
        if results.get(name):
            print(f"{name}: {median(results[name]):.{decimals}f} {unit}")
    return 1 if errors else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        sys.exit(130)
