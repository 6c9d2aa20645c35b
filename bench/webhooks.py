"""Webhook ingestion benchmark: signed provider events POSTed to a real gunicorn web process.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/webhooks.py [--provider sns] [--requests 2000] [--concurrency 4]

It starts, and always stops (also on error, Ctrl-C or SIGTERM): a database of its own
(`emailhub_bench_webhooks`, created and migrated if missing), Redis database 13, gunicorn (the `web`
command of scripts/stack.py) and, for SNS, a loopback server for the signing certificate.
Each provider has one function (`sns_run`, …) that builds its signed requests BEFORE the clock
starts (signing is the provider's cost, not ours), then POSTs them from `--concurrency` threads.

What it measures, per provider:
- events/s ingested: events recorded (EmailEvent rows counted in PostgreSQL afterwards, which
  must equal the events sent) / wall time of the client loop;
- request time p50/p99 (client side, round trip);
- CPU the web process group spent per event.
SNS sends one notification per request, as SNS does. `--sns-recipients` recipients per
notification (default 1: a Delivery or Bounce usually names one; SES batches up to 50).
SendGrid posts batches: `--sendgrid-requests` signed batches of `--sendgrid-batch` (1,000) events
(ECDSA P-256 key made by the bench, passed to gunicorn as EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY).
The last lines are `webhooks_<provider>_<metric>: value unit`.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from django.db import connection  # noqa: E402

from bench.lib.common import LOG_DIR, bench_database, prepare, run_clients  # noqa: E402
from bench.lib.smtp_sink import free_port  # noqa: E402
from bench.lib.stats import group_stats, percentile  # noqa: E402
from delivery.testing.sns import TOPIC_ARN, SNSSigner, http_headers, ses_event  # noqa: E402
from scripts.stack import Stack  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_webhooks")  # its own: it truncates the event and message tables
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delivery_emailevent, delivery_message, campaigns_suppression CASCADE")
    redis.Redis.from_url(REDIS_URL).flushdb()


def make_messages(count: int) -> list[int]:
    """`count` sent messages for the events to land on (one set-based insert)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # Address and SES id derived from the row's own id, as the events name them.
            """INSERT INTO delivery_message (id, to_email, priority, status, provider, provider_message_id,
                                             sent_at, attempts, created_at)
               SELECT n.id, 'user' || n.id || '@example.com', 'normal', 'sent', 'ses', 'ses-bench-' || n.id,
                      now(), 1, now()
                 FROM (SELECT nextval(pg_get_serial_sequence('delivery_message', 'id')) AS id
                         FROM generate_series(1, %s)) AS n
               RETURNING id""",
            [count],
        )
        return sorted(row[0] for row in cursor.fetchall())


def count_events() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_emailevent")
        return int(cursor.fetchone()[0])


def post_all(
    url: str, bodies: list[tuple[bytes, dict[str, str]]], concurrency: int
) -> tuple[float, list[float]]:
    """POST every (body, headers) from `concurrency` threads; wall seconds, sorted request ms."""
    request_ms, errors = [0.0] * len(bodies), []
    indexes = itertools.count()  # next() on it is atomic under the GIL

    def client() -> None:
        with requests.Session() as session:
            while not errors and (i := next(indexes)) < len(bodies):
                body, headers = bodies[i]
                started = time.perf_counter()
                try:
                    response = session.post(url, data=body, headers=headers, timeout=30)
                except requests.RequestException as exc:
                    errors.append(f"request failed: {exc}")
                    return
                request_ms[i] = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    errors.append(f"HTTP {response.status_code}: {response.text[:300]}")
                    return

    elapsed = run_clients(client, concurrency)
    if errors:
        raise RuntimeError(f"the webhook refused a request: {errors[0]} (see {LOG_DIR})")
    return elapsed, sorted(request_ms)


def measure(
    args: argparse.Namespace,
    env: dict[str, str],
    path: str,
    build: Callable[[list[int]], tuple[list[tuple[bytes, dict[str, str]]], int]],
    warmup: Callable[[list[int]], tuple[list[tuple[bytes, dict[str, str]]], int]],
) -> dict[str, Any]:
    """Start gunicorn with `env`, POST the warm-up then the measured requests, count the rows."""
    reset()
    message_ids = make_messages(args.messages)
    warm_bodies, warm_events = warmup(message_ids)
    bodies, events = build(message_ids)
    stack = Stack(env=env, log_dir=LOG_DIR)
    try:
        port = free_port()
        web = stack.start_web(port, workers=args.web_workers)
        url = f"http://127.0.0.1:{port}{path}"
        post_all(url, warm_bodies, args.concurrency)
        cpu_before = group_stats(web.popen.pid)[1]
        elapsed, request_ms = post_all(url, bodies, args.concurrency)
        cpu = group_stats(web.popen.pid)[1] - cpu_before
    finally:
        stack.stop_all()
    recorded = count_events() - warm_events
    if recorded != events:
        raise RuntimeError(f"{recorded} event rows recorded, {events} sent")
    return {
        "events_per_s": events / elapsed,
        "requests_per_s": len(bodies) / elapsed,
        "request_p50": percentile(request_ms, 50),
        "request_p99": percentile(request_ms, 99),
        "web_cpu_us_per_event": cpu * 1e6 / events,
        "events": events,
        "requests": len(bodies),
    }


# --- Amazon SES through SNS -------------------------------------------------------------------


def sns_run(args: argparse.Namespace, base_env: dict[str, str]) -> dict[str, Any]:
    per = args.sns_recipients

    def bodies(
        message_ids: list[int], count: int, tag: str
    ) -> tuple[list[tuple[bytes, dict[str, str]]], int]:
        out = []
        for i in range(count):
            first = (i * per) % len(message_ids)
            ids = [message_ids[(first + k) % len(message_ids)] for k in range(per)]
            recipients = [f"user{k}@example.com" for k in ids]
            # SES's Delivery names the message by its SES id; the X-Emailhub-Message header
            # (SES "include original headers") names ours, which is what the lookup uses.
            event = ses_event(
                "Delivery",
                "delivery",
                {"timestamp": "2024-05-01T12:00:01.000Z", "recipients": recipients, "smtpResponse": "250 ok"},
                recipients,
                ses_message_id=f"ses-bench-{ids[0]}",
                emailhub_id=ids[0] if args.sns_lookup == "header" else None,
            )
            envelope = signer.notification(event, message_id=f"{tag}-{i}")
            out.append((json.dumps(envelope).encode(), http_headers(envelope)))
        return out, count * per

    with SNSSigner() as signer:
        env = {
            **base_env,
            "EMAILHUB_SES_SNS_TOPIC_ARNS": TOPIC_ARN,
            "EMAILHUB_SNS_CERT_FETCH_OVERRIDE": ",".join(f"{k}={v}" for k, v in signer.override.items()),
        }
        result = measure(
            args,
            env,
            "/api/v1/webhooks/ses",
            lambda ids: bodies(ids, args.requests, "run"),
            lambda ids: bodies(ids, args.warmup, "warm"),
        )
        result["certificate_fetches"] = len(signer.requests)
    return result


# --- SendGrid Event Webhook -------------------------------------------------------------------


def sendgrid_run(args: argparse.Namespace, base_env: dict[str, str]) -> dict[str, Any]:
    """Signed batches of `--sendgrid-batch` events (SendGrid posts up to about a thousand per
    request): per 100 events 90 delivered, 8 opens, 1 bounce and 1 spam report, so the batch also
    pays for suppressions and campaign-less feedback, each event naming its message by the
    `emailhub_id` custom arg as SendGrid echoes it."""
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    per = args.sendgrid_batch
    mix = ["delivered"] * 90 + ["open"] * 8 + ["bounce", "spamreport"]

    def bodies(
        message_ids: list[int], count: int, tag: str
    ) -> tuple[list[tuple[bytes, dict[str, str]]], int]:
        out = []
        timestamp = str(int(time.time()))
        for i in range(count):
            events = []
            for k in range(per):
                n = i * per + k
                message_id = message_ids[n % len(message_ids)]
                kind = mix[n % len(mix)]
                event: dict[str, Any] = {
                    "email": f"user{message_id}@example.com",
                    "timestamp": int(timestamp),
                    "event": kind,
                    "sg_event_id": f"{tag}-{n}",
                    "sg_message_id": f"bench{message_id}.filter0001.{n}.0",
                    "smtp-id": f"<bench{message_id}@ismtpd-1>",
                    "emailhub_id": str(message_id),
                }
                if kind == "bounce":
                    event.update(type="bounce", status="5.1.1", reason="550 5.1.1 user unknown")
                elif kind == "delivered":
                    event["response"] = "250 2.0.0 OK"
                elif kind == "open":
                    event.update(useragent="Mozilla/5.0", ip="192.0.2.1", sg_machine_open=False)
                events.append(event)
            body = json.dumps(events).encode()
            signature = base64.b64encode(key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256())))
            headers = {
                "Content-Type": "application/json",
                "X-Twilio-Email-Event-Webhook-Signature": signature.decode("ascii"),
                "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
            }
            out.append((body, headers))
        return out, count * per

    env = {**base_env, "EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY": base64.b64encode(der).decode("ascii")}
    return measure(
        args,
        env,
        "/api/v1/webhooks/sendgrid",
        lambda ids: bodies(ids, args.sendgrid_requests, "run"),
        lambda ids: bodies(ids, 2, "warm"),
    )


# --- registry of provider runs: one function each ---------------------------------------------

PROVIDERS: dict[str, Callable[[argparse.Namespace, dict[str, str]], dict[str, Any]]] = {
    "sns": sns_run,
    "sendgrid": sendgrid_run,
}

METRICS = [
    ("events_per_s", "events/s"),
    ("request_p50", "ms"),
    ("request_p99", "ms"),
    ("web_cpu_us_per_event", "us"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--provider", choices=[*PROVIDERS, "all"], default="all")
    parser.add_argument("--requests", type=int, default=2000, help="measured requests per provider")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured requests first")
    parser.add_argument("--messages", type=int, default=10_000, help="sent messages the events refer to")
    parser.add_argument("--sns-recipients", type=int, default=1, help="recipients per SNS notification")
    parser.add_argument(
        "--sns-lookup",
        choices=["header", "provider-id"],
        default="header",
        help="name the message by the X-Emailhub-Message header or only by SES's messageId",
    )
    parser.add_argument("--sendgrid-requests", type=int, default=50, help="measured SendGrid batches")
    parser.add_argument("--sendgrid-batch", type=int, default=1000, help="events per SendGrid batch")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads, a Session each")
    parser.add_argument("--web-workers", type=int, default=2)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the `finally` blocks

    env = prepare(BENCH_DB, REDIS_URL)
    names = list(PROVIDERS) if args.provider == "all" else [args.provider]
    print(
        f"database {BENCH_DB}, redis {REDIS_URL}, logs in {LOG_DIR}; {args.concurrency} client threads, "
        f"{args.web_workers} gunicorn workers, load average {os.getloadavg()[0]:.2f}"
    )
    results = {}
    for name in names:
        r = results[name] = PROVIDERS[name](args, env)
        print(
            f"{name}: {r['events']} events in {r['requests']} requests: {r['events_per_s']:.0f} events/s "
            f"({r['requests_per_s']:.0f} requests/s), request p50 {r['request_p50']:.1f} ms "
            f"p99 {r['request_p99']:.1f} ms, web CPU {r['web_cpu_us_per_event']:.0f} us/event"
            + (f", certificate fetched {r['certificate_fetches']}x" if "certificate_fetches" in r else "")
        )
    for name, r in results.items():
        for key, unit in METRICS:
            print(f"webhooks_{name}_{key}: {r[key]:.1f} {unit}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
