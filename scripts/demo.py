"""`make demo`: emailhub's whole pipeline on this machine, start to finish.

Starts an SMTP sink, a local Amazon SES (moto) and a local SendGrid, the web app, both worker
pools, beat and the scheduler. Transactional mail goes SES → SendGrid → SMTP, bulk mail
SMTP → SendGrid → SES. It sends a burst of messages of all four priorities through the HTTP API
(plus one scheduled a few seconds ahead); halfway through, SES starts answering 500 to
everything, so the demo shows the circuit breaker opening and mail moving to SendGrid. It prints
per-priority latency from acceptance to the provider's acceptance, and stops everything.

It runs on a database of its own (DEMO_DATABASE_URL, by default `emailhub_demo`, created and
migrated here), never the one the README's examples use, and at its end deactivates the
recurring schedule it created and cancels anything still pending (scripts/demo_cleanup.py), so
no beat or scheduler started on that database later mails the demo's contacts.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")
# The demo keeps its broker queues, breakers and buckets in a Redis database of its own, emptied
# at start, so an earlier run (an SES breaker left open, say) cannot change what it shows.
DEMO_REDIS_URL = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/13")
os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = DEMO_REDIS_URL
# Its own database too: the 5,000 demo contacts and the demo's schedules stay out of `emailhub`.
DEMO_DATABASE_URL = os.environ.get("DEMO_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/emailhub_demo")
os.environ["DATABASE_URL"] = DEMO_DATABASE_URL

import django  # noqa: E402

from scripts import ensure_db  # noqa: E402

if ensure_db.main() != 0:
    sys.exit(1)
django.setup()

import redis  # noqa: E402
import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from delivery.authentication import create_api_key  # noqa: E402
from delivery.models import Message  # noqa: E402
from delivery.testing.sendgrid_server import SendGridTestServer  # noqa: E402
from delivery.testing.ses_server import SESTestServer  # noqa: E402
from delivery.testing.smtp_server import free_port  # noqa: E402
from outbound.testing.receiver import Receiver  # noqa: E402
from scripts.demo_cleanup import retire_demo_work  # noqa: E402
from scripts.stack import PROCESSES, ROOT, Stack, with_option  # noqa: E402

BURST = {"critical": 40, "high": 60, "normal": 200, "low": 100}
CAMPAIGN_SIZE = 5000
SCHEDULE_AHEAD = timedelta(seconds=4)
TIMEOUT_SECONDS = 120
console = Console()


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def start_processes(stack: Stack, sink_port: int, web_port: int) -> None:
    steps = [
        (
            "smtp-sink",
            lambda: stack.start("smtp-sink", with_option(PROCESSES["smtp-sink"], "--port", str(sink_port))),
        ),
        ("web", lambda: stack.start_web(web_port)),
        ("worker-transactional", lambda: stack.start("worker-transactional")),
        ("worker-bulk", lambda: stack.start("worker-bulk")),
        ("worker-webhooks", lambda: stack.start("worker-webhooks")),
        ("beat", lambda: stack.start("beat")),
        ("scheduler", lambda: stack.start("scheduler")),
    ]
    for name, start in steps:
        with console.status(f"starting {name}…"):
            process = start()
        console.print(f"  [green]✓[/] {name:<22} pid {process.popen.pid}")


def send_burst(base_url: str, key: str, progress: Progress, ses: SESTestServer) -> tuple[list[int], float]:
    """Send the burst; halfway through, make SES fail. Returns the ids and when SES broke."""
    session_headers = {"Authorization": f"Bearer {key}"}
    # Each priority's messages are split evenly between the halves sent before and after SES breaks.
    halves: list[list[tuple[str, int]]] = [[], []]
    for priority, count in BURST.items():
        halves[0] += [(priority, n) for n in range(count // 2)]
        halves[1] += [(priority, n) for n in range(count // 2, count)]
    task = progress.add_task("accepted by the API", total=sum(BURST.values()) + 1)
    sessions: dict[int, requests.Session] = {}

    def post(job: tuple[str, int]) -> int:
        session = sessions.setdefault(threading.get_ident(), requests.Session())
        priority, n = job
        body = {
            "to": f"{priority}-{n}@demo.example.com",
            "subject": f"[{priority}] demo message {n}",
            "text": f"Hello! This is {priority} message {n}.",
            "html": f"<p>Hello! This is <b>{priority}</b> message {n}.</p>",
            "priority": priority,
        }
        response = session.post(f"{base_url}/api/v1/messages", json=body, headers=session_headers, timeout=10)
        response.raise_for_status()
        progress.advance(task)
        return int(response.json()["id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(post, sorted(halves[0], key=lambda job: job[1])))
        ses.fail_with(500)
        broke_at = time.time()
        progress.console.print(
            f"  [bold red]✗ SES starts answering HTTP 500 to every send[/] ({datetime.now(UTC):%H:%M:%S.%f})"
        )
        ids += list(pool.map(post, sorted(halves[1], key=lambda job: job[1])))
    send_at = (datetime.now(UTC) + SCHEDULE_AHEAD).isoformat()
    scheduled = requests.post(
        f"{base_url}/api/v1/messages",
        json={
            "to": "later@demo.example.com",
            "subject": "scheduled",
            "text": "sent later",
            "send_at": send_at,
        },
        headers=session_headers,
        timeout=10,
    )
    scheduled.raise_for_status()
    progress.advance(task)
    console.print(
        f"  scheduled message #{scheduled.json()['id']} for {send_at} ({scheduled.json()['status']})"
    )
    return [*ids, int(scheduled.json()["id"])], broke_at


def create_recurring(base_url: str, key: str, template_name: str, list_id: int) -> dict:
    """An every-minute schedule in Europe/London that sends the newsletter to a small list, narrowed
    by a segment."""
    headers = {"Authorization": f"Bearer {key}"}
    small = requests.post(
        f"{base_url}/api/v1/lists",
        json={"name": f"demo recurring {time.time():.0f}"},
        headers=headers,
        timeout=10,
    )
    small.raise_for_status()
    contacts = requests.get(
        f"{base_url}/api/v1/contacts", params={"list": list_id, "page_size": 3}, headers=headers, timeout=10
    )
    ids = [c["id"] for c in contacts.json()["results"]]
    requests.post(
        f"{base_url}/api/v1/lists/{small.json()['id']}/members",
        json={"contact_ids": ids},
        headers=headers,
        timeout=10,
    ).raise_for_status()
    # The blueprint's audience: the small list narrowed by a segment (issue 23), here the
    # readers among the first thousand of the newsletter's audience (a typed attribute and a
    # field condition), counted through the API before it is used.
    segment_filter = {
        "and": [
            {"field": "email", "op": "domain", "value": "audience.example.com"},
            {"attribute": "first_name", "type": "string", "op": "contains", "value": "Reader"},
        ]
    }
    segment = requests.post(
        f"{base_url}/api/v1/segments",
        json={"name": f"demo readers {time.time():.0f}", "filter": segment_filter},
        headers=headers,
        timeout=10,
    )
    segment.raise_for_status()
    counted = requests.get(
        f"{base_url}/api/v1/segments/{segment.json()['id']}/count",
        params={"contact_list": small.json()["id"]},
        headers=headers,
        timeout=10,
    ).json()
    console.print(
        f"segment '{segment.json()['name']}': {counted['count']} of the recurring list's contacts match "
        f"{json.dumps(segment_filter)}"
    )
    body = {
        "name": "demo every minute",
        "cron": "* * * * *",
        "timezone": "Europe/London",
        "template": template_name,
        "contact_list": small.json()["id"],
        "segment": segment.json()["id"],
        "priority": "low",
    }
    created = requests.post(f"{base_url}/api/v1/recurring-schedules", json=body, headers=headers, timeout=10)
    created.raise_for_status()
    return created.json()


def wait_for_recurring(base_url: str, key: str, recurring: dict) -> bool:
    """Wait for beat to fire the schedule (next minute boundary, then a beat tick) and show it."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{base_url}/api/v1/recurring-schedules/{recurring['id']}"
    deadline = time.monotonic() + 90
    with console.status("") as status:
        while time.monotonic() < deadline:
            current = requests.get(url, headers=headers, timeout=10).json()
            if current["last_run"]:
                break
            left = datetime.fromisoformat(current["next_run"].replace("Z", "+00:00")) - datetime.now(UTC)
            status.update(
                f"waiting for recurring schedule '{current['name']}' ({current['cron']}, {current['timezone']}): next run in {max(left.total_seconds(), 0):.0f} s"
            )
            time.sleep(0.5)
        else:
            console.print("[red]the recurring schedule did not fire in time[/]")
            return False
    dashboard = requests.get(
        f"{base_url}/api/v1/schedules", params={"type": "recurring"}, headers=headers, timeout=10
    ).json()
    row = next(r for r in dashboard["schedules"] if r["id"] == f"recurring-{recurring['id']}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        campaign = requests.get(
            f"{base_url}/api/v1/campaigns/{row['campaign_id']}", headers=headers, timeout=10
        ).json()
        if campaign["status"] == "completed":
            break
        time.sleep(0.3)
    console.print(
        f"recurring schedule '{current['name']}' fired for {current['last_run']}: campaign #{row['campaign_id']} "
        f"'{campaign['name']}' {campaign['status']}, {campaign['progress']['sent']} sent; next run {current['next_run']}"
    )
    console.print(f"GET /api/v1/schedules queue_snapshot: {dashboard['queue_snapshot']}")
    return campaign["status"] == "completed"


def start_campaign(base_url: str, key: str) -> tuple[int, str, int]:
    """A newsletter to CAMPAIGN_SIZE contacts, created and started through the API."""
    headers = {"Authorization": f"Bearer {key}"}
    with connection.cursor() as cursor:  # the audience: generated in SQL, reused by later runs
        cursor.execute(
            """
            INSERT INTO campaigns_contact (email, name, timezone, attributes, status, updated_at)
            SELECT 'reader' || n || '@audience.example.com', 'Reader ' || n, 'Europe/London',
                   jsonb_build_object('first_name', 'Reader' || n), 'active', now()
              FROM generate_series(1, %s) AS n
            ON CONFLICT (email) DO NOTHING
            """,
            [CAMPAIGN_SIZE],
        )
    audience = requests.post(
        f"{base_url}/api/v1/lists",
        json={"name": f"demo audience {time.time():.0f}"},
        headers=headers,
        timeout=10,
    )
    audience.raise_for_status()
    list_id = audience.json()["id"]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO campaigns_listmembership (contact_list_id, contact_id)
            SELECT %s, id FROM campaigns_contact WHERE email LIKE 'reader%%@audience.example.com'
            """,
            [list_id],
        )
    template_name = f"demo-newsletter-{time.time():.0f}"
    requests.post(
        f"{base_url}/api/v1/templates",
        json={
            "name": template_name,
            "subject": "News for {{ first_name }}",
            "html": "<h1>Hello {{ first_name }}</h1>",
            "text": "Hello {{ first_name }}",
        },
        headers=headers,
        timeout=10,
    ).raise_for_status()
    campaign = requests.post(
        f"{base_url}/api/v1/campaigns",
        json={
            "name": "demo newsletter",
            "template": template_name,
            "contact_list": list_id,
            "priority": "normal",
        },
        headers=headers,
        timeout=10,
    )
    campaign.raise_for_status()
    campaign_id = int(campaign.json()["id"])
    requests.post(
        f"{base_url}/api/v1/campaigns/{campaign_id}/schedule",
        json={"type": "immediate"},
        headers=headers,
        timeout=10,
    ).raise_for_status()
    return campaign_id, template_name, list_id


def wait_until_sent(ids: list[int], progress: Progress, campaign_id: int, base_url: str, key: str) -> dict:
    campaign_task = progress.add_task(f"campaign #{campaign_id}", total=CAMPAIGN_SIZE)
    task = progress.add_task("accepted by a provider", total=len(ids))
    deadline = time.monotonic() + TIMEOUT_SECONDS
    campaign: dict = {}
    while time.monotonic() < deadline:
        done = Message.objects.filter(pk__in=ids, status__in=["sent", "failed", "suppressed"]).count()
        progress.update(task, completed=done)
        campaign = requests.get(
            f"{base_url}/api/v1/campaigns/{campaign_id}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        ).json()
        progress.update(campaign_task, completed=campaign["progress"]["sent"])
        if done == len(ids) and campaign["status"] == "completed":
            return campaign
        time.sleep(0.2)
    return campaign


def summarize(ids: list[int]) -> bool:
    # The scheduled message waits on purpose; it is reported on its own line, not in the table.
    rows = list(Message.objects.filter(pk__in=ids).annotate(latency=F("sent_at") - F("created_at")))
    scheduled = next((r for r in rows if r.to_email == "later@demo.example.com"), None)
    table = Table(title="emailhub demo: accepted by the API → accepted by the provider")
    for column in ("priority", "messages", "sent", "p50 ms", "p99 ms", "max ms", "provider"):
        table.add_column(column, justify="right" if column not in ("priority", "provider") else "left")
    all_sent = True
    for priority in ("critical", "high", "normal", "low"):
        group = [r for r in rows if r.priority == priority and r is not scheduled]
        sent = [r for r in group if r.status == "sent"]
        all_sent &= len(sent) == len(group)
        latencies = [r.latency.total_seconds() * 1000 for r in sent if r.latency is not None]
        providers = ",".join(sorted({r.provider for r in sent if r.provider})) or "-"
        table.add_row(
            priority, str(len(group)), str(len(sent)),
            f"{percentile(latencies, 50):.0f}", f"{percentile(latencies, 99):.0f}",
            f"{max(latencies, default=float('nan')):.0f}", providers,
        )  # fmt: skip
    console.print(table)
    if scheduled is not None and scheduled.sent_at and scheduled.due_at:
        late = (scheduled.sent_at - scheduled.due_at).total_seconds()
        console.print(
            f"scheduled message: due {scheduled.due_at:%H:%M:%S}, sent {late:.2f} s after its due time"
        )
    sent_total = sum(1 for r in rows if r.status == "sent")
    by_provider = {name: sum(1 for r in rows if r.provider == name) for name in ("ses", "sendgrid", "smtp")}
    console.print(
        f"[bold]{sent_total} of {len(ids)} messages sent[/]: "
        + ", ".join(f"{count} via {name}" for name, count in by_provider.items())
    )
    return all_sent and sent_total == len(ids)


def show_failover(
    base_url: str, key: str, ids: list[int], broke_at: float, ses: SESTestServer, stack: Stack
) -> None:
    health = requests.get(
        f"{base_url}/api/v1/providers", headers={"Authorization": f"Bearer {key}"}, timeout=5
    ).json()
    circuit = next(p for p in health["providers"] if p["name"] == "ses")["circuit"]
    first = (
        Message.objects.filter(pk__in=ids, provider="sendgrid", priority__in=["critical", "high"])
        .order_by("sent_at")
        .values_list("sent_at", flat=True)
        .first()
    )
    console.rule("failover")
    for line in stack.processes["worker-transactional"].log().splitlines():
        if "circuit breaker for" in line:
            console.print(f"  worker log: {line.split(' ', 3)[-1]}")
    console.print(
        f"  SES refused {ses.refused_count} call(s); its circuit is [bold]{circuit['state']}[/] "
        f"(opens after {circuit['fail_max']} consecutive failures, probes again after {circuit['reset_timeout']:.0f} s)"
    )
    if first is not None:
        console.print(
            f"  first transactional message through SendGrid {(first.timestamp() - broke_at) * 1000:.0f} ms after SES broke"
        )


def show_message_api(base_url: str, key: str) -> bool:
    """After the 202 (issue 21): a reminder cancelled by its tag while another goes at its time,
    and a receipt with tags, metadata, copies, a header and a PDF attachment."""
    console.rule("the message API after the 202")
    headers = {"Authorization": f"Bearer {key}"}
    due = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    reminders = {}
    for user in ("user-1", "user-2"):
        body: dict[str, Any] = {"to": f"{user}@demo.example.com", "subject": "Finish signing up", "text": "One step left.",
                "priority": "high", "send_at": due, "tags": [f"reminder:{user}"], "metadata": {"user": user}}  # fmt: skip
        reminders[user] = requests.post(
            f"{base_url}/api/v1/messages", json=body, headers=headers, timeout=10
        ).json()["id"]
    report = requests.post(
        f"{base_url}/api/v1/messages/cancel", json={"tag": "reminder:user-1"}, headers=headers, timeout=10
    ).json()
    console.print(f"  two reminders due {due[11:19]}; user-1 completes the action: cancel by tag -> {report}")
    pdf = b"%PDF-1.4\n% emailhub demo receipt\n" + bytes(range(256)) * 64
    receipt: dict[str, Any] = {
        "to": "buyer@demo.example.com", "cc": ["accounts@demo.example.com"], "bcc": ["audit@demo.example.com"],
        "subject": "Your receipt", "text": "Thanks for your order.", "priority": "high",
        "tags": ["receipt", "order-1234"], "metadata": {"order": "1234"},
        "headers": {"X-Entity-Ref-ID": "order-1234"},
        "attachments": [{"filename": "receipt-1234.pdf", "content_type": "application/pdf",
                         "content": base64.b64encode(pdf).decode("ascii")}],
    }  # fmt: skip
    receipt_id = requests.post(
        f"{base_url}/api/v1/messages", json=receipt, headers=headers, timeout=10
    ).json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {
            name: requests.get(f"{base_url}/api/v1/messages/{i}", headers=headers, timeout=10).json()
            for name, i in {**reminders, "receipt": receipt_id}.items()
        }
        if states["user-2"]["status"] == "sent" and states["receipt"]["status"] == "sent":
            break
        time.sleep(0.3)
    for name, state in states.items():
        console.print(f"  {name}: {state['status']} via {state['provider']}, tags {state['tags']}, cc {state['cc']}, "
                      f"attachments {[a['filename'] for a in state['attachments']]}")  # fmt: skip
    tagged = requests.get(
        f"{base_url}/api/v1/messages", params={"tag": "order-1234"}, headers=headers, timeout=10
    )
    console.print(f"  GET /api/v1/messages?tag=order-1234 -> {[m['id'] for m in tagged.json()['results']]}")
    return (
        report["cancelled"] == 1
        and [states[n]["status"] for n in ("user-1", "user-2", "receipt")] == ["cancelled", "sent", "sent"]
        and [m["id"] for m in tagged.json()["results"]] == [receipt_id]
    )


def register_endpoint(base_url: str, key: str, receiver: Receiver) -> int:
    """An endpoint on the local receiver for what the message API does next (issue 22)."""
    console.rule("telling the application: signed webhooks")
    body = {"url": receiver.url, "event_types": ["message.queued", "message.sent", "message.cancelled"]}
    created = requests.post(
        f"{base_url}/api/v1/webhook-endpoints",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ).json()
    receiver.secret = created["secret"]
    console.print(
        f"  endpoint #{created['id']} registered on a local receiver for {', '.join(body['event_types'])}"
    )
    return int(created["id"])


def show_webhooks(base_url: str, key: str, endpoint_id: int, receiver: Receiver) -> bool:
    """What the receiver heard of the message API's messages, each request verified with the
    Standard Webhooks reference library; and the endpoint's delivery log."""
    console.rule("what the application heard")
    # queued ×3, cancelled ×1, sent ×2 (the remaining reminder and the receipt).
    receiver.wait_for(lambda r: len(r.events(answered_2xx=True)) >= 6, timeout=30)
    requests_seen = receiver.received
    for request in requests_seen:
        event = request.json or {}
        data = event.get("data", {})
        mark = "[green]verified[/]" if request.verified else f"[red]not verified: {request.error}[/]"
        console.print(f"  {request.headers.get('webhook-id', '?'):<10} {event.get('type', '?'):<18} message "
                      f"{data.get('message_id')} tags {data.get('tags')} metadata {data.get('metadata')}  {mark}")  # fmt: skip
    attempts = requests.get(
        f"{base_url}/api/v1/webhook-endpoints/{endpoint_id}/attempts",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ).json()["results"]
    console.print(
        f"  delivery log: {len(attempts)} attempt(s), {sum(a['succeeded'] for a in attempts)} answered 2xx"
    )
    types = sorted(e["type"] for e in receiver.events(answered_2xx=True))
    return bool(requests_seen) and all(r.verified for r in requests_seen) and types.count("message.sent") >= 2


def main() -> int:
    sink_port, web_port = free_port(), free_port()
    redis.Redis.from_url(DEMO_REDIS_URL).flushdb()
    log_dir = ROOT / "var" / "demo-logs"
    console.rule("[bold]emailhub demo")
    with console.status(f"migrating the demo's database {connection.settings_dict['NAME']}…"):
        call_command("migrate", interactive=False, verbosity=0)
    console.print(f"database: {connection.settings_dict['NAME']} (the demo's own); process logs: {log_dir}")
    ses, sendgrid = SESTestServer(), SendGridTestServer()
    env = {
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "DATABASE_URL": DEMO_DATABASE_URL,
        "REDIS_URL": DEMO_REDIS_URL,
        "CELERY_BROKER_URL": DEMO_REDIS_URL,
        "SMTP_PORT": str(sink_port),
        "EMAILHUB_PROVIDERS_TRANSACTIONAL": "ses,sendgrid,smtp",
        "EMAILHUB_PROVIDERS_BULK": "smtp,sendgrid,ses",
        "SES_ENDPOINT_URL": ses.endpoint_url,
        "SES_ACCESS_KEY_ID": "demo",
        "SES_SECRET_ACCESS_KEY": "demo",
        "SENDGRID_API_KEY": sendgrid.api_key,
        "SENDGRID_HOST": sendgrid.url,
        # The demo's webhook receiver listens on 127.0.0.1 over http: allowed here only.
        "EMAILHUB_WEBHOOKS_ALLOW_HTTP": "1",
        "EMAILHUB_WEBHOOKS_ALLOW_PRIVATE": "1",
    }
    os.environ.update(EMAILHUB_WEBHOOKS_ALLOW_HTTP="1", EMAILHUB_WEBHOOKS_ALLOW_PRIVATE="1")
    receiver = Receiver()
    stack = Stack(env=env, log_dir=log_dir)
    try:
        with console.status("starting local SES (moto) and SendGrid…"):
            ses.__enter__()
            sendgrid.__enter__()
        console.print(f"  [green]✓[/] local SES (moto)       {ses.endpoint_url}")
        console.print(f"  [green]✓[/] local SendGrid         {sendgrid.url}")
        start_processes(stack, sink_port, web_port)
        # The demo drives every endpoint: contacts, campaigns, schedules as well as messages.
        _, key = create_api_key(f"demo-{int(time.time() * 1000)}", ["send", "read", "manage"])
        base_url = f"http://127.0.0.1:{web_port}"
        columns = (
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            started = time.monotonic()
            campaign_id, template_name, list_id = start_campaign(base_url, key)
            recurring = create_recurring(base_url, key, template_name, list_id)
            progress.console.print(
                f"  campaign #{campaign_id} to {CAMPAIGN_SIZE} contacts started; transactional burst goes alongside"
            )
            ids, broke_at = send_burst(base_url, key, progress, ses)
            campaign = wait_until_sent(ids, progress, campaign_id, base_url, key)
            elapsed = time.monotonic() - started
        ok = summarize(ids)
        console.print(f"whole burst: {len(ids)} messages in {elapsed:.1f} s")
        took = (
            (
                datetime.fromisoformat(campaign["completed_at"])
                - datetime.fromisoformat(campaign["started_at"])
            ).total_seconds()
            if campaign.get("completed_at")
            else float("nan")
        )
        console.print(
            f"campaign #{campaign_id}: {campaign['progress']['sent']} of {campaign['progress']['total']} sent, "
            f"status {campaign['status']}, {took:.1f} s ({campaign['progress']['sent'] / took:.0f} emails/s) — "
            "critical and high mail above was sent while it ran, on the transactional pool"
        )
        ok = ok and campaign.get("status") == "completed"
        show_failover(base_url, key, ids, broke_at, ses, stack)
        endpoint_id = register_endpoint(base_url, key, receiver)
        ok = show_message_api(base_url, key) and ok
        ok = show_webhooks(base_url, key, endpoint_id, receiver) and ok
        console.rule("scheduling")
        ok = wait_for_recurring(base_url, key, recurring) and ok
    finally:
        sink = stack.processes.get("smtp-sink")
        with console.status("stopping every process the demo started…"):
            stack.stop_all()
            receiver.close()
            for server in (ses, sendgrid):
                try:
                    server.__exit__(None, None, None)
                except Exception:  # noqa: BLE001 - a server that never started has nothing to stop
                    pass
        console.print("all demo processes stopped")
        # After the processes: nothing can start new work while this retires what is left.
        retired = retire_demo_work()
        console.print(
            f"left nothing active: {len(retired.schedules)} recurring schedule(s) deactivated, "
            f"{len(retired.campaigns)} unfinished campaign(s) and {len(retired.messages)} pending "
            "message(s) cancelled"
        )
        # The demo's Redis database holds only transport (queued housekeeping ticks, breaker
        # state), all rebuilt from PostgreSQL; empty it so nothing there waits for a worker.
        redis.Redis.from_url(DEMO_REDIS_URL).flushdb()
    if sink is not None:
        console.print(f"the SMTP sink says: {sink.log().strip().splitlines()[-1]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
