"""Memory of messages with attachments: a batch of 1,000 messages, each with a 1 MiB file.

    .venv/bin/python bench/attachments.py [--messages 1000] [--size-kib 1024] [--sink postfix]

Issue 21 asks that the accept path stay bounded (a request's base64 decoded once) and that a
worker's memory per batch stay bounded. Each phase runs in a fresh process, so its peak RSS
(`ru_maxrss`) is its own:

1. accept: one request of 10 messages (13.3 MiB of JSON) in a process of its own: the RSS it
   adds; then 1,000 messages through the WSGI application (`POST /api/v1/messages/batch`, 10
   items a request, priority normal), all with the same 1 MiB PDF, which is stored once (the
   count of `delivery_attachmentcontent` rows is printed), with that process's peak RSS;
2. send: a worker process sends them as the bulk worker would (`send_messages`, batches of
   EMAILHUB_BATCH_SIZE_NORMAL) to Postfix's smtp-sink, composing each batch in parts of
   EMAILHUB_SEND_PART_BYTES of attachments (32 MiB);
3. the reference, in the same invocation: the same send with one part per batch (the setting
   raised past any batch), i.e. what a worker holds without the parts;
4. baseline: a process that sets up Django and claims nothing (what every worker holds anyway).

The last lines are the figures, `name: value unit`; `send_rss_ratio` is the parts' peak over the
reference's. Database `emailhub_bench_attach` (BENCH_DATABASE_SUFFIX), Redis database 11.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.common import bench_database, prepare_alone  # noqa: E402

DATABASE = bench_database("emailhub_bench_attach")
REDIS_URL = os.environ.get("BENCH_ATTACH_REDIS_URL", "redis://127.0.0.1:6379/11")
PER_REQUEST = 10


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _pdf(size: int) -> bytes:
    """A file of `size` bytes that looks like a PDF (a header, then incompressible bytes)."""
    head = b"%PDF-1.7\n"
    return head + os.urandom(size - len(head))


def child(phase: str, args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    from delivery.authentication import create_api_key
    from delivery.models import AttachmentContent, Message
    from delivery.services.sending import send_messages

    before = _peak_mb()
    if phase == "baseline":
        Message.objects.exists()  # a connection, as a worker has
        print(json.dumps({"peak_mb": _peak_mb(), "setup_mb": before}))
        return
    if phase == "accept_one":  # one request of PER_REQUEST messages: what a request costs
        _, raw = create_api_key(f"bench-attach-{time.monotonic_ns()}", ["send", "read"])
        client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        content = base64.b64encode(_pdf(args.size_kib * 1024)).decode("ascii")
        items = [
            {"to": f"one{n}@example.com", "subject": "s", "text": "t", "priority": "normal",
             "attachments": [{"filename": "invoice.pdf", "content_type": "application/pdf", "content": content}]}
            for n in range(PER_REQUEST)
        ]  # fmt: skip
        body = json.dumps({"messages": items})
        del items, content
        ready = _peak_mb()
        response = client.post("/api/v1/messages/batch", body, content_type="application/json")
        assert response.status_code == 202, response.content[:500]
        print(json.dumps({"peak_mb": _peak_mb(), "ready_mb": ready, "body_mb": len(body) / 2**20}))
        return
    if phase == "accept":
        _, raw = create_api_key(f"bench-attach-{time.monotonic_ns()}", ["send", "read"])
        client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        content = base64.b64encode(_pdf(args.size_kib * 1024)).decode("ascii")
        started = time.perf_counter()
        for first in range(0, args.messages, PER_REQUEST):
            items = [
                {
                    "to": f"attach{n}@example.com", "subject": "Your invoice", "text": "Attached.",
                    "priority": "normal",
                    "attachments": [{"filename": "invoice.pdf", "content_type": "application/pdf", "content": content}],
                }
                for n in range(first, min(first + PER_REQUEST, args.messages))
            ]  # fmt: skip
            response = client.post(
                "/api/v1/messages/batch", json.dumps({"messages": items}), content_type="application/json"
            )
            assert response.status_code == 202, response.content[:500]
        elapsed = time.perf_counter() - started
        stored = AttachmentContent.objects.count()
        print(
            json.dumps(
                {
                    "peak_mb": _peak_mb(),
                    "setup_mb": before,
                    "per_s": args.messages / elapsed,
                    "stored": stored,
                }
            )
        )
        return
    # send / reference: every message queued again, then sent in the bulk worker's batches.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE delivery_message SET status = 'queued', attempts = 0")
    ids = list(Message.objects.order_by("id").values_list("id", flat=True))
    batch = int(os.environ.get("EMAILHUB_BATCH_SIZE_NORMAL", "100"))
    started = time.perf_counter()
    sent = 0
    for first in range(0, len(ids), batch):
        sent += send_messages(ids[first : first + batch]).sent
    elapsed = time.perf_counter() - started
    print(json.dumps({"peak_mb": _peak_mb(), "setup_mb": before, "sent": sent, "per_s": sent / elapsed}))


def run_child(phase: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable,
        __file__,
        "--child",
        phase,
        "--messages",
        str(args.messages),
        "--size-kib",
        str(args.size_kib),
    ]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--sink", choices=["postfix", "aiosmtpd"], default="postfix")
    parser.add_argument("--child", choices=["accept_one", "accept", "send", "reference", "baseline"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return

    from bench.lib.smtp_sink import open_sink

    env = {**os.environ, **prepare_alone(DATABASE, REDIS_URL)}  # created, migrated, and ours alone
    from django.db import connection

    def empty_tables() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE delivery_message, core_outboxtask, delivery_emailevent, delivery_attachmentcontent CASCADE"
            )

    empty_tables()
    print(f"load at start: {os.getloadavg()[0]:.2f}")
    with open_sink(args.sink) as sink:
        worker_env = {
            **env,
            "SMTP_HOST": "127.0.0.1",
            "SMTP_PORT": str(sink.port),
            "EMAILHUB_PROVIDERS_BULK": "smtp",
        }
        one = run_child("accept_one", env, args)
        empty_tables()
        print(f"accept, one request of {PER_REQUEST} ({one['body_mb']:.1f} MiB of JSON): RSS {one['ready_mb']:.0f} MB "
              f"with the request built, peak {one['peak_mb']:.0f} MB")  # fmt: skip
        accept = run_child("accept", env, args)
        print(f"accept: {args.messages} messages with a {args.size_kib} KiB file each, {accept['per_s']:.0f} msgs/s, "
              f"peak RSS {accept['peak_mb']:.0f} MB over {args.messages // PER_REQUEST} requests, contents stored: "
              f"{accept['stored']}")  # fmt: skip
        parts = run_child("send", worker_env, args)
        print(
            f"send in parts: {parts['sent']} sent, {parts['per_s']:.0f} msgs/s, peak RSS {parts['peak_mb']:.0f} MB"
        )
        whole = run_child("reference", {**worker_env, "EMAILHUB_SEND_PART_BYTES": str(2**40)}, args)
        print(
            f"reference, one part a batch: {whole['sent']} sent, {whole['per_s']:.0f} msgs/s, peak RSS {whole['peak_mb']:.0f} MB"
        )
        baseline = run_child("baseline", env, args)
        received = sink.count()
    assert parts["sent"] == whole["sent"] == args.messages, (parts, whole)
    assert received >= 2 * args.messages, received
    print(
        f"baseline (Django set up, nothing claimed): peak RSS {baseline['peak_mb']:.0f} MB; sink counted {received}"
    )
    print(f"attach_contents_stored: {accept['stored']} rows")
    print(f"attach_accept_request_rss: {one['peak_mb'] - one['ready_mb']:.0f} MB")
    print(f"attach_accept_peak_rss: {accept['peak_mb']:.0f} MB")
    print(f"attach_worker_baseline_rss: {baseline['peak_mb']:.0f} MB")
    print(f"attach_send_peak_rss: {parts['peak_mb']:.0f} MB")
    print(f"attach_send_reference_peak_rss: {whole['peak_mb']:.0f} MB")
    print(f"attach_send_rate: {parts['per_s']:.0f} msgs/s")
    print(f"send_rss_ratio: {parts['peak_mb'] / whole['peak_mb']:.2f} x")


if __name__ == "__main__":
    main()
