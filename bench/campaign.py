"""Campaign benchmark: a 100,000-recipient campaign end to end, with critical traffic alongside.

Run from the repository root, after `make test` has set up the services:

    .venv/bin/python bench/campaign.py [--runs 1] [--contacts 100000] [--critical-rate 10]
    .venv/bin/python bench/campaign.py --kill-fanout [--contacts 200000]
    .venv/bin/python bench/campaign.py --dkim [--runs 1] [--contacts 100000]
    .venv/bin/python bench/campaign.py --compare [--runs 3] [--contacts 100000]
    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// .venv/bin/python bench/campaign.py --compare

Targets (the issue): >= 3,000 emails/s end to end (fan-out, render, SMTP to a local sink) and a
p99 under 1 s for critical messages sent during the campaign.

Everything is the real pipeline on real processes, started with scripts/stack.py's PROCESSES
commands: gunicorn (2 workers), `worker-transactional`, the standard `worker-bulk` (queues
normal,low,campaigns, concurrency 2) and beat (the outbox relay and the stalled fan-out sweep,
as in production), all with SMTP_PORT pointing at Postfix's `smtp-sink` (bench/lib/smtp_sink.py; an
aiosmtpd sink would cap near 2,300 msgs/s, below the target). The bench has a database
(`emailhub_bench_campaign`, created and migrated if missing) and Redis database (9) of its own,
and refuses to start while any other session or client uses them (bench/lib/common.py's
claim_bench): each run empties the message tables and flushes Redis. The audience (contacts with
a `first_name` attribute, list memberships) is generated in SQL once and reused (bench/lib/audience.py's
ensure_audience); the template has per-recipient variables in subject, HTML and text.

Default mode, per run (on emptied message tables, a flushed Redis and freshly started processes):
- warm-up: --warmup critical messages through the API, not measured (imports, connections);
- a thread POSTs critical messages to /api/v1/messages at a steady --critical-rate from just
  before the campaign is scheduled until it is `completed`;
- the campaign is scheduled with lifecycle.schedule(id, "immediate") (the fan-out task goes to
  the bulk worker's `campaigns` queue, exactly as from the API); the clock runs from just before
  that call until this process sees the campaign `completed` (polled every 50 ms):
  emails/s = messages sent / that time;
- checks: campaign sent_count == messages `sent` == non-suppressed recipients, and the sink's own
  count == those + the warm-up and critical messages the database calls sent == the sent counter
  of /metrics (`emailhub_emails_sent_total{outcome="sent"}`, summed over the web's, the workers'
  and their children's files: the stack's own PROMETHEUS_MULTIPROC_DIR); the metrics URL is
  printed at the start of each run, for a `curl` while it runs;
- critical latency: `sent_at - created_at` in PostgreSQL (INSERT inside the API request to just
  after the SMTP 250), p50/p99/max; the API round trip seen by the client is printed apart;
- peak RSS (VmHWM) of the bulk worker's processes (master + 2 children; sum and largest), and the
  CPU seconds each process group, the bench database's PostgreSQL backends and the sink used.
`--profile` attaches py-spy (`pip install py-spy`) to the bulk worker's children for the
campaign and prints where their samples fall (it slows them a little: not for the figures).

--kill-fanout (the issue's done-criterion): a --contacts (default 200,000) list with every 100th
contact suppressed; fan-out runs on a worker of its own (`-Q campaigns`, EMAILHUB_FANOUT_STEP
--kill-step, small so that "half" is hit closely), sending on another (`-Q normal,low`). When
the campaign's total_count reaches half the recipients, after --kill-delay, the fan-out worker's
process group gets SIGKILL: with no delay that is right after a step's commit, before its send
tasks are published (the outbox rows left then are printed; beat's relay publishes them), with
~0.02 s inside the next step's transaction. Another fan-out worker starts (default step) and
lifecycle.resume_stalled_fanouts(stale_seconds=0) hands it the campaign, as beat's sweep would
after EMAILHUB_FANOUT_STALL_SECONDS. When the campaign completes: one message per non-suppressed
recipient (count, distinct contacts, distinct addresses), none to a suppressed address, all
`sent`, the campaign's counters agree, and the sink received exactly that many messages (one
recipient each: equal counts plus unique rows in the database mean each recipient got one).

--dkim: each run is a pair, the same campaign unsigned and then DKIM-signed (RSA-2048 and Ed25519,
both, dual signing: keys generated into a temporary directory and passed to every process as
EMAILHUB_DKIM_KEYS for the From domain of EMAILHUB_DEFAULT_FROM, which the bench campaign sends
from). Printed side by side; `campaign_dkim_ratio` is signed emails/s over unsigned (the issue's
target: >= 0.9).

--compare (issue 13): each run is a pair on the same N and a fresh Postfix smtp-sink each:
the emailhub campaign as above, then django-post_office's `send_queued_mail --processes 2`
(bench/post_office_ref.py: its own database, BATCH_SIZE 1000, the same template rendered at
delivery). `campaign_ratio` is the median of the runs' emailhub / post_office emails/s (the
issue's target: >= 2.5).

Broker: CELERY_BROKER_URL from the environment (default: the bench's Redis database). For
RabbitMQ (amqp://…) the bench creates a throwaway vhost with `rabbitmqctl`, points every process
at it, purges its queues before each run and deletes it at the end.

The last lines are medians across runs (`campaign_kill_fanout_*` in that mode), `name: value unit`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
from django.db import connection  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.lib import audience as bench_audience  # noqa: E402
from bench.lib import post_office  # noqa: E402
from bench.lib.api import message_body, post_messages, wait_until_sent  # noqa: E402
from bench.lib.audience import bench_template, ensure_audience  # noqa: E402
from bench.lib.common import bench_database, prepare_alone  # noqa: E402
from bench.lib.smtp_sink import PostfixSink, SinkUnavailable, free_port  # noqa: E402
from bench.lib.stats import percentile  # noqa: E402
from scripts.stack import PROCESSES, Stack, with_option  # noqa: E402

BENCH_DB = bench_database("emailhub_bench_campaign")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

LOG_DIR = ROOT / "bench" / ".cache" / "logs" / "campaign"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def setup() -> tuple[dict[str, str], str]:
    """Create, migrate and claim the bench's database and Redis database; return env and API key."""
    env = prepare_alone(BENCH_DB, REDIS_URL)
    from delivery.authentication import create_api_key

    return env, create_api_key(f"bench-{time.time_ns()}")[1]


def reset_state() -> None:
    bench_audience.reset_state(REDIS_URL)
    if _VHOST is not None:  # Redis was the broker's store otherwise: flushed above
        _purge_vhost(_VHOST)


# --- RabbitMQ: a throwaway vhost ---------------------------------------------------------------

_VHOST: str | None = None


def _rabbitmqctl(*argv: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *argv], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _purge_vhost(vhost: str) -> None:
    for line in _rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name").splitlines():
        if line.strip():
            _rabbitmqctl("purge_queue", "-p", vhost, line.strip())


def open_broker() -> str:
    """The broker every process of this run uses. For amqp:// a vhost of our own is created and
    CELERY_BROKER_URL rewritten to it (before Django reads it); close_broker() deletes it."""
    global _VHOST
    url = os.environ.get("CELERY_BROKER_URL") or ""
    if not url.startswith(("amqp://", "pyamqp://")):
        return url or REDIS_URL
    if shutil.which("rabbitmqctl") is None:
        print(
            "rabbitmqctl not found: using the vhost of CELERY_BROKER_URL, purged before each run", flush=True
        )
        parts = urlsplit(url)
        _VHOST = unquote(parts.path[1:]) or "/"
        return url
    parts = urlsplit(url)
    vhost = f"emailhub-bench-campaign-{os.getpid()}"
    _rabbitmqctl("add_vhost", vhost)
    _VHOST = vhost
    _rabbitmqctl("set_permissions", "-p", vhost, unquote(parts.username or "guest"), ".*", ".*", ".*")
    os.environ["CELERY_BROKER_URL"] = urlunsplit(parts._replace(path=f"/{vhost}"))
    return os.environ["CELERY_BROKER_URL"]


def close_broker() -> None:
    global _VHOST
    if _VHOST is not None and _VHOST.startswith("emailhub-bench-campaign-"):
        _rabbitmqctl("delete_vhost", _VHOST)
    _VHOST = None


# --- processes: memory and CPU from /proc ------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    # After "(comm)", which may hold spaces: state(0) ppid(1) pgrp(2) ... utime(11) stime(12).
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def group_pids(pgid: int) -> list[int]:
    """The live processes of a process group (Stack starts each process in a session of its own)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int(_stat_fields(int(proc.name))[2]) == pgid:
                    pids.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                continue  # ended while we looked
    return pids


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        try:
            fields = _stat_fields(pid)
            found[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
        except (OSError, IndexError, ValueError):
            continue
    return found


def peak_rss_kb(pids: list[int]) -> dict[int, int]:
    """VmHWM (peak resident set) of each process."""
    found = {}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            found[pid] = int(status.split("VmHWM:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return found


def backend_pids() -> list[int]:
    """PostgreSQL backends connected to the bench database, other than this process's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


class CpuMeter:
    """CPU seconds used between start() and stop() by named sets of processes.

    A process that appears meanwhile (a PostgreSQL backend opened mid-run) counts from zero, one
    that ends meanwhile is lost: the figures are a lower bound, close when processes live long.
    """

    def __init__(self, groups: dict[str, Any]) -> None:
        self.groups = groups  # name -> callable returning the pids of that set now
        self.before: dict[str, dict[int, float]] = {}

    def start(self) -> None:
        self.before = {name: cpu_seconds(pids()) for name, pids in self.groups.items()}

    def stop(self) -> dict[str, float]:
        used = {}
        for name, pids in self.groups.items():
            now, before = cpu_seconds(pids()), self.before.get(name, {})
            used[name] = sum(seconds - before.get(pid, 0.0) for pid, seconds in now.items())
        return used


# --- critical traffic --------------------------------------------------------------------------


class CriticalPoster(threading.Thread):
    """POSTs critical messages at a steady rate until stopped; keeps the ids and round trips."""

    def __init__(self, url: str, api_key: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.api_key, self.rate = url, api_key, rate
        self.ids: list[int] = []
        self.api_ms: list[float] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {self.api_key}"
            started = time.monotonic()
            i = 0
            # A fixed schedule (the i-th request at started + i/rate), not sleep(1/rate) after
            # each: a slow answer does not lower the rate, the next request just goes at once.
            while not self._stop_event.wait(max(0.0, started + i / self.rate - time.monotonic())):
                sent = time.perf_counter()
                try:
                    response = session.post(self.url, json=message_body(i, "during campaign"), timeout=30)
                except requests.RequestException as exc:
                    self.errors.append(f"request failed: {exc}")
                    return
                self.api_ms.append((time.perf_counter() - sent) * 1000)
                if response.status_code != 202:
                    self.errors.append(f"HTTP {response.status_code}: {response.text[:300]}")
                    return
                self.ids.append(response.json()["id"])
                i += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=35)


# --- py-spy ------------------------------------------------------------------------------------


class Profiler:
    """py-spy record (raw collapsed stacks) attached to some processes; summarised when stopped."""

    def __init__(self, pids: list[int], out_dir: Path) -> None:
        self.outputs = [out_dir / f"py-spy-{pid}.txt" for pid in pids]
        spy = Path(sys.executable).with_name("py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        # --idle: waiting (for PostgreSQL, the sink, the broker) is sampled too, so that shares
        # are of wall-clock time; --nonblocking: the workers are never paused to be sampled.
        options = ["--rate", "100", "--format", "raw", "--idle", "--nonblocking"]
        self.popens = [
            subprocess.Popen(
                [str(spy), "record", "--pid", str(pid), "--output", str(output), *options],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for pid, output in zip(pids, self.outputs, strict=True)
        ]

    def stop(self) -> None:
        for popen in self.popens:
            if popen.poll() is None:
                popen.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for popen in self.popens:
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()

    # Inclusive shares worth knowing for the send path: (label, substring of a frame).
    MARKERS = [
        ("send_messages task", "send_messages (delivery/services/sending.py"),
        ("claim (UPDATE … RETURNING)", "claim (delivery/services/transitions.py"),
        ("compose (templates, contacts)", "compose (delivery/services/compose.py"),
        ("  Contact.objects.in_bulk", "in_bulk ("),
        ("  template render", "render (core/templating.py"),
        ("provider gateway (SMTP)", "send_via ("),
        ("  MIME rendering", "render (delivery/providers/mime.py"),
        ("  SMTP exchange", "_round (delivery/providers/smtp.py"),
        ("record outcomes (UPDATEs)", "record (delivery/services/recording.py"),
        ("  campaign counters", "move_counters (campaigns/progress.py"),
        ("fan-out task", "fan_out (campaigns/fanout.py"),
        ("waiting for the next task (pool pipe)", "(billiard/connection.py"),
    ]

    def summary(self) -> str:
        total, inclusive, leaves = 0, Counter[str](), Counter[str]()
        for output in self.outputs:
            if not output.exists():
                continue
            for line in output.read_text(errors="replace").splitlines():
                stack, _, count = line.rpartition(" ")
                if not count.isdigit():
                    continue
                frames, n = stack.split(";"), int(count)
                total += n
                for label, marker in self.MARKERS:
                    if any(marker in frame for frame in frames):
                        inclusive[label] += n
                leaves[frames[-1]] += n
        if not total:
            return "py-spy recorded nothing (is py-spy installed? see the docstring)"
        lines = [f"py-spy --idle, bulk worker children, {total} samples at 100 Hz (wall clock, summed):"]
        lines += [f"  {100 * inclusive[label] / total:5.1f}%  {label}" for label, _ in self.MARKERS]
        lines.append("  top frames (self):")
        lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in leaves.most_common(12)]
        return "\n".join(lines)


# --- helpers -----------------------------------------------------------------------------------


def start_bulk(stack: Stack, queues: str, key: str, extra_env: dict[str, str] | None = None) -> int:
    """The standard bulk worker command with other queues and node name; returns its pgid."""
    argv = with_option(PROCESSES["worker-bulk"], "-Q", queues)
    argv = with_option(argv, "-n", f"{key}@%h")
    return stack.start("worker-bulk", argv, key=key, extra_env=extra_env, timeout=60).popen.pid


def metrics_sent(web_port: int) -> float:
    """`emailhub_emails_sent_total{outcome="sent"}` as /metrics shows it: summed over every process."""
    text = requests.get(f"http://127.0.0.1:{web_port}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "emailhub_emails_sent_total" and sample.labels.get("outcome") == "sent"
    )


def campaign_row(campaign_id: int) -> dict[str, Any]:
    from campaigns.models import Campaign

    return dict(
        Campaign.objects.filter(pk=campaign_id)
        .values(
            "status", "fanout_done", "total_count", "excluded_count", "sent_count", "failed_count",
            "suppressed_count", "cancelled_count",
        )
        .get()
    )  # fmt: skip


def check_alive(stack: Stack) -> None:
    for process in stack.processes.values():
        if not process.alive:
            raise RuntimeError(f"{process.name} exited:\n{process.log()[-3000:]}")


def wait_completed(campaign_id: int, stack: Stack, timeout: float, poll: float = 0.05) -> dict[str, Any]:
    """Poll until the campaign is completed; also note when fan-out finished. Seconds from now."""
    started = time.monotonic()
    fanout_done_at, sent_at_fanout_done = None, 0
    while True:
        row = campaign_row(campaign_id)
        elapsed = time.monotonic() - started
        if row["fanout_done"] and fanout_done_at is None:
            # Sending runs during fan-out too; how fast it goes then shows their interference.
            fanout_done_at, sent_at_fanout_done = elapsed, row["sent_count"]
        if row["status"] == "completed":
            return {
                **row,
                "elapsed": elapsed,
                "fanout_done_at": fanout_done_at,
                "sent_at_fanout_done": sent_at_fanout_done,
            }
        if row["status"] != "sending":
            raise RuntimeError(f"the campaign went {row['status']}: {row}")
        if elapsed > timeout:
            raise RuntimeError(f"not completed after {timeout:.0f}s: {row} (logs in {LOG_DIR})")
        check_alive(stack)
        time.sleep(poll)


def new_campaign(name: str, list_id: int) -> int:
    from campaigns.models import Campaign

    return int(
        Campaign.objects.create(
            name=name, template=bench_template(), contact_list_id=list_id, priority="normal"
        ).pk
    )


# --- default mode ------------------------------------------------------------------------------


def campaign_run(
    args: argparse.Namespace,
    env: dict[str, str],
    api_key: str,
    audience: tuple[int, int, int],
    number: int,
    extra_env: dict[str, str] | None = None,
    label: str = "run",
) -> dict[str, Any]:
    from campaigns import lifecycle
    from delivery.models import Message

    list_id, expected, _ = audience
    reset_state()
    campaign_id = new_campaign(f"bench campaign {number}", list_id)
    sink = PostfixSink()
    stack = Stack(
        env={**env, "SMTP_PORT": str(sink.port), **(extra_env or {})}, log_dir=LOG_DIR / f"{label}{number}"
    )
    poster: CriticalPoster | None = None
    profiler: Profiler | None = None
    try:
        sink.start()
        sink_pid = sink._popen.pid if sink._popen else 0  # smtp-sink does not fork
        web_port = free_port()
        groups = {
            "web": stack.start_web(web_port, workers=2).popen.pid,
            "transactional": stack.start("worker-transactional", timeout=60).popen.pid,
            "bulk": stack.start("worker-bulk", timeout=60).popen.pid,
            "beat": stack.start("beat", timeout=60).popen.pid,
        }
        url = f"http://127.0.0.1:{web_port}/api/v1/messages"
        print(f"  metrics while it runs: curl -s http://127.0.0.1:{web_port}/metrics", flush=True)
        warm_ids, _, _ = post_messages(url, api_key, args.warmup, 2, f"warm-up {number}")
        wait_until_sent(warm_ids, 60)

        meter = CpuMeter(
            {
                **{name: (lambda pgid=pgid: group_pids(pgid)) for name, pgid in groups.items()},
                "postgres (bench db)": backend_pids,
                "smtp-sink": lambda: [sink_pid],
            }
        )
        if args.profile:
            bulk_children = [pid for pid in group_pids(groups["bulk"]) if pid != groups["bulk"]]
            profiler = Profiler(bulk_children, LOG_DIR / f"run{number}")
        meter.start()
        poster = CriticalPoster(url, api_key, args.critical_rate)
        poster.start()
        load = os.getloadavg()[0]
        started = time.monotonic()
        lifecycle.schedule(campaign_id, "immediate")
        done = wait_completed(campaign_id, stack, args.timeout)
        elapsed = time.monotonic() - started
        poster.stop()
        cpu = meter.stop()
        if profiler is not None:
            profiler.stop()
        if poster.errors:
            raise RuntimeError(f"a critical message was refused: {poster.errors[0]}")
        wait_until_sent(poster.ids, 60)
        rss = peak_rss_kb(group_pids(groups["bulk"]))
        sent_in_db = Message.objects.filter(campaign_id=campaign_id, status="sent").count()
        all_sent = Message.objects.filter(status="sent").count()
        scraped_sent = metrics_sent(web_port)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM sent_at - created_at) * 1000 FROM delivery_message WHERE id = ANY(%s)",
                [poster.ids],
            )
            latencies = sorted(float(row[0]) for row in cursor.fetchall())
        received = sink.count()
    finally:
        if poster is not None and poster.is_alive():
            poster.stop()
        if profiler is not None:
            profiler.stop()
        stack.stop_all()
        sink.stop()

    problems = []
    if not (done["sent_count"] == sent_in_db == done["total_count"] == expected):
        problems.append(f"campaign {done}, {sent_in_db} messages sent, {expected} recipients")
    if received != all_sent:
        problems.append(f"the sink received {received} messages, the database sent {all_sent}")
    if scraped_sent != all_sent:
        problems.append(f"/metrics counted {scraped_sent:.0f} sent, the database {all_sent}")
    if problems:
        raise RuntimeError("; ".join(problems))
    api_ms = sorted(poster.api_ms)
    return {
        "emails_per_s": sent_in_db / elapsed,
        "elapsed": elapsed,
        "fanout_done_at": done["fanout_done_at"],
        "sent_at_fanout_done": done["sent_at_fanout_done"],
        "sent": sent_in_db,
        "received": received,
        "metrics_sent": scraped_sent,
        "load": load,
        "critical_count": len(latencies),
        "critical_p50": percentile(latencies, 50),
        "critical_p99": percentile(latencies, 99),
        "critical_max": latencies[-1],
        "api_p50": percentile(api_ms, 50),
        "api_p99": percentile(api_ms, 99),
        "bulk_worker_peak_rss": sum(rss.values()) / 1024,
        "bulk_worker_largest_rss": max(rss.values()) / 1024,
        "bulk_processes": len(rss),
        "cpu": cpu,
        "profile": profiler.summary() if profiler is not None else None,
    }


CAMPAIGN_METRICS = [
    ("emails_per_s", "emails/s", "{:.0f}"),
    ("critical_p99", "ms", "{:.0f}"),
    ("critical_p50", "ms", "{:.0f}"),
    ("bulk_worker_peak_rss", "MB", "{:.0f}"),
]


def dkim_keys(directory: Path) -> tuple[str, str]:
    """RSA-2048 and Ed25519 keys for the bench campaign's From domain under `directory`, in the
    <domain>/<selector>.pem layout EMAILHUB_DKIM_KEYS accepts; (the setting's value, the domain)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
    from django.conf import settings

    from delivery.providers.dkim import DkimSigner
    from delivery.providers.mime import bare_address

    domain = bare_address(settings.EMAILHUB_DEFAULT_FROM).rpartition("@")[2]
    (directory / domain).mkdir(parents=True)
    for selector, key in (
        ("rsa2048", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        ("ed25519", ed25519.Ed25519PrivateKey.generate()),
    ):
        (directory / domain / f"{selector}.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    # The workers would send unsigned (and the ratio be meaningless) if the campaign's From
    # domain had no key: check with the same loader the workers use.
    if len(DkimSigner.from_setting(str(directory)).keys_for(domain)) != 2:
        raise RuntimeError(f"DKIM keys for {domain} were not loaded from {directory}")
    return str(directory), domain


def print_run(label: str, number: int, r: dict[str, Any]) -> None:
    cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in r["cpu"].items())
    print(
        f"{label} {number} (load average {r['load']:.2f} at start): {r['sent']:,} campaign emails in "
        f"{r['elapsed']:.1f} s = {r['emails_per_s']:,.0f} emails/s; sink received {r['received']:,} "
        f"(= database sent = /metrics emailhub_emails_sent_total {r['metrics_sent']:,.0f})\n"
        f"  fan-out done at {r['fanout_done_at']:.1f} s, {r['sent_at_fanout_done']:,} sent by then\n"
        f"  {r['critical_count']} critical messages during the campaign: accept->SMTP 250 p50 "
        f"{r['critical_p50']:.0f} p99 {r['critical_p99']:.0f} ms\n"
        f"  CPU seconds during the campaign (2 cores = {2 * r['elapsed']:.0f} s): {cpu}",
        flush=True,
    )


def main_dkim(args: argparse.Namespace, env: dict[str, str], api_key: str) -> int:
    contacts = args.contacts or 100_000
    audience = ensure_audience(contacts, 0)
    plain_runs: list[dict[str, Any]] = []
    signed_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="emailhub-bench-dkim-") as directory:
        setting, domain = dkim_keys(Path(directory))
        print(
            f"database {BENCH_DB}, redis {REDIS_URL}, sink: postfix smtp-sink, logs in {LOG_DIR}\n"
            f"{args.runs} pair(s) of runs of a {audience[1]:,}-recipient campaign: unsigned, then "
            f"DKIM-signed for {domain} (rsa-sha256 + ed25519-sha256)",
            flush=True,
        )
        for number in range(1, args.runs + 1):
            plain_runs.append(campaign_run(args, env, api_key, audience, number, label="unsigned"))
            print_run("unsigned", number, plain_runs[-1])
            signed_runs.append(
                campaign_run(
                    args,
                    env,
                    api_key,
                    audience,
                    number,
                    extra_env={"EMAILHUB_DKIM_KEYS": setting},
                    label="dkim",
                )
            )
            print_run("dkim", number, signed_runs[-1])
    print(f"{'median':<24}{'unsigned':>12}{'dkim':>12}")
    for key, unit, fmt in CAMPAIGN_METRICS:
        plain, signed = (median(r[key] for r in runs) for runs in (plain_runs, signed_runs))
        print(f"{key + ' (' + unit + ')':<24}{fmt.format(plain):>12}{fmt.format(signed):>12}")
    plain_rate = median(r["emails_per_s"] for r in plain_runs)
    signed_rate = median(r["emails_per_s"] for r in signed_runs)
    ratio = signed_rate / plain_rate
    print(f"DKIM throughput {'meets' if ratio >= 0.9 else 'MISSES'} within 10% of unsigned")
    print(f"campaign_dkim_emails_per_s: {signed_rate:.0f} emails/s")
    print(f"campaign_unsigned_emails_per_s: {plain_rate:.0f} emails/s")
    print(f"campaign_dkim_ratio: {ratio:.3f}")
    return 0


def main_campaign(args: argparse.Namespace, env: dict[str, str], api_key: str) -> int:
    contacts = args.contacts or 100_000
    audience = ensure_audience(contacts, 0)
    print(
        f"database {BENCH_DB}, redis {REDIS_URL}, sink: postfix smtp-sink, logs in {LOG_DIR}\n"
        f"{args.runs} run(s) of a {audience[1]:,}-recipient campaign (template with per-recipient "
        f"variables), critical messages at {args.critical_rate}/s meanwhile",
        flush=True,
    )
    runs, references = [], []
    if args.compare:
        post_office.prepare()
    for number in range(1, args.runs + 1):
        r = campaign_run(args, env, api_key, audience, number)
        runs.append(r)
        cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in r["cpu"].items())
        print(
            f"run {number} (load average {r['load']:.2f} at start): {r['sent']:,} campaign emails in "
            f"{r['elapsed']:.1f} s = {r['emails_per_s']:,.0f} emails/s; sink received {r['received']:,} "
            f"(= database sent = /metrics emailhub_emails_sent_total {r['metrics_sent']:,.0f})\n"
            f"  fan-out done at {r['fanout_done_at']:.1f} s, {r['sent_at_fanout_done']:,} sent by then "
            f"({r['sent_at_fanout_done'] / r['fanout_done_at']:,.0f}/s during fan-out, "
            f"{(r['sent'] - r['sent_at_fanout_done']) / (r['elapsed'] - r['fanout_done_at']):,.0f}/s after)\n"
            f"  {r['critical_count']} critical messages during the campaign: accept->SMTP 250 p50 "
            f"{r['critical_p50']:.0f} p99 {r['critical_p99']:.0f} max {r['critical_max']:.0f} ms; "
            f"API round trip p50 {r['api_p50']:.0f} p99 {r['api_p99']:.0f} ms\n"
            f"  bulk worker peak RSS {r['bulk_worker_peak_rss']:.0f} MB over {r['bulk_processes']} "
            f"processes (largest {r['bulk_worker_largest_rss']:.0f} MB)\n"
            f"  CPU seconds during the campaign (2 cores = {2 * r['elapsed']:.0f} s): {cpu}",
            flush=True,
        )
        if r["profile"]:
            print(r["profile"], flush=True)
        if args.compare:
            with PostfixSink() as sink:
                ref = post_office.run(r["sent"], sink)
            references.append(ref)
            print(
                f"  post_office (load average {ref['load']:.2f} at start): {ref['sent']:,} emails in "
                f"{ref['elapsed']:.1f} s = {ref['emails_per_s']:,.0f} emails/s (send_queued_mail "
                f"--processes 2, {ref['cpu']:.1f} CPU s); sink received them all; ratio "
                f"{r['emails_per_s'] / ref['emails_per_s']:.2f}",
                flush=True,
            )
    emails = median(r["emails_per_s"] for r in runs)
    p99 = median(r["critical_p99"] for r in runs)
    print(
        f"median of {len(runs)} run(s): {'meets' if emails >= 3000 else 'MISSES'} >= 3,000 emails/s, "
        f"critical p99 {'meets' if p99 < 1000 else 'MISSES'} < 1 s; load average now {os.getloadavg()[0]:.2f}"
    )
    for key, unit, fmt in CAMPAIGN_METRICS:
        print(f"campaign_{key}: {fmt.format(median(r[key] for r in runs))} {unit}")
    if references:
        ratio = median(
            r["emails_per_s"] / ref["emails_per_s"] for r, ref in zip(runs, references, strict=True)
        )
        print(f"campaign ratio to django-post_office {'meets' if ratio >= 2.5 else 'MISSES'} >= 2.5")
        print(f"post_office_emails_per_s: {median(ref['emails_per_s'] for ref in references):.0f} emails/s")
        print(f"campaign_ratio: {ratio:.2f}")
    return 0


# --- kill-fanout mode --------------------------------------------------------------------------


def kill_run(
    args: argparse.Namespace, env: dict[str, str], audience: tuple[int, int, int], number: int
) -> dict[str, Any]:
    from campaigns import lifecycle
    from core.models import OutboxTask

    list_id, expected, suppressed = audience
    reset_state()
    campaign_id = new_campaign(f"bench kill-fanout {number}", list_id)
    sink = PostfixSink()
    stack = Stack(env={**env, "SMTP_PORT": str(sink.port)}, log_dir=LOG_DIR / f"kill{number}")
    try:
        sink.start()
        start_bulk(stack, "normal,low", "sender")
        # The outbox relay (beat -> `system` queue -> transactional worker) publishes the send
        # tasks of a step that committed just before the kill but was not published yet.
        stack.start("worker-transactional", timeout=60)
        stack.start("beat", timeout=60)
        start_bulk(stack, "campaigns", "fanout", {"EMAILHUB_FANOUT_STEP": str(args.kill_step)})
        started = time.monotonic()
        lifecycle.schedule(campaign_id, "immediate")
        while (row := campaign_row(campaign_id))["total_count"] < expected // 2:
            if row["fanout_done"] or time.monotonic() - started > args.timeout:
                raise RuntimeError(f"fan-out did not stop half-way to be killed: {row}")
            check_alive(stack)
            time.sleep(0.005)
        # Seen right after a step's commit: killing now lands before that step's tasks are
        # published (the outbox relay's case); a few ms later, inside the next step.
        time.sleep(args.kill_delay)
        stack.kill("fanout")  # SIGKILL to the worker's whole process group, as a crash would
        stack.stop("fanout")  # forgets it (it is dead: nothing is sent), so check_alive passes
        killed_at = campaign_row(campaign_id)
        unpublished = OutboxTask.objects.count()
        if killed_at["fanout_done"]:
            raise RuntimeError(f"fan-out finished before the kill: {killed_at}")
        start_bulk(stack, "campaigns", "fanout-again")
        handed = lifecycle.resume_stalled_fanouts(stale_seconds=0)
        done = wait_completed(campaign_id, stack, args.timeout)
        elapsed = time.monotonic() - started
        received = sink.count()  # smtp-sink writes its count before it answers 250: all are in
        resumed_log = stack.processes["fanout-again"].log()
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT count(*), count(DISTINCT m.contact_id), count(DISTINCT lower(m.to_email)),
                       count(*) FILTER (WHERE m.status = 'sent'),
                       count(*) FILTER (WHERE s.id IS NOT NULL)
                  FROM delivery_message AS m
                  LEFT JOIN campaigns_suppression AS s ON s.email = lower(m.to_email)
                 WHERE m.campaign_id = %s
                """,
                [campaign_id],
            )
            messages, contacts, addresses, sent, to_suppressed = cursor.fetchone()
            cursor.execute(
                "SELECT count(*) FROM delivery_message WHERE campaign_id IS DISTINCT FROM %s", [campaign_id]
            )
            (others,) = cursor.fetchone()
    finally:
        stack.stop_all()
        sink.stop()

    # What the resumed fan-out did, from its task's result in the worker log.
    found = re.findall(r"campaigns\.fan_out\[[^\]]+\] succeeded in [\d.]+s: (\{[^}]*\})", resumed_log)
    checks = {
        "one message per non-suppressed recipient": messages == expected,
        "no duplicate (campaign, contact)": contacts == messages,
        "no duplicate address": addresses == messages,
        "none to a suppressed address": to_suppressed == 0,
        "all sent": sent == messages,
        "campaign counters": (done["total_count"], done["sent_count"], done["excluded_count"])
        == (expected, expected, suppressed),
        "no other messages": others == 0,
        "sink received each once (count == messages)": received == messages,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "expected": expected,
        "messages": messages,
        "duplicates": messages - contacts,
        "received": received,
        "killed_at": killed_at["total_count"],
        "unpublished_at_kill": unpublished,
        "handed": handed,
        "resumed_reports": found,
        "elapsed": elapsed,
    }


KILL_METRICS = [
    ("ok", "bool", "{:.0f}"),
    ("expected", "messages", "{:.0f}"),
    ("messages", "messages", "{:.0f}"),
    ("duplicates", "messages", "{:.0f}"),
    ("received", "messages", "{:.0f}"),
    ("killed_at", "messages", "{:.0f}"),
    ("elapsed", "s", "{:.1f}"),
]


def main_kill(args: argparse.Namespace, env: dict[str, str]) -> int:
    contacts = args.contacts or 200_000
    audience = ensure_audience(contacts, 100)
    print(
        f"database {BENCH_DB}, redis {REDIS_URL}, sink: postfix smtp-sink, logs in {LOG_DIR}\n"
        f"{args.runs} run(s): {contacts:,} contacts, {audience[2]:,} suppressed: {audience[1]:,} "
        f"recipients; the fan-out worker (step {args.kill_step}) is SIGKILLed half-way",
        flush=True,
    )
    runs = []
    for number in range(1, args.runs + 1):
        load = os.getloadavg()[0]
        r = kill_run(args, env, audience, number)
        runs.append(r)
        print(
            f"run {number} (load average {load:.2f} at start): killed at total_count {r['killed_at']:,} "
            f"({r['unpublished_at_kill']} outbox rows unpublished then); resume_stalled_fanouts handed "
            f"{r['handed']} campaign(s); resumed fan-out task(s): {', '.join(r['resumed_reports']) or '-'}\n"
            f"  completed {r['elapsed']:.1f} s after scheduling: {r['messages']:,} messages for "
            f"{r['expected']:,} recipients, sink received {r['received']:,}",
            flush=True,
        )
        for check, passed in r["checks"].items():
            print(f"  {'ok  ' if passed else 'FAIL'} {check}")
    values = {key: median(float(r[key]) for r in runs) for key, _, _ in KILL_METRICS}
    values["ok"] = float(all(r["ok"] for r in runs))
    for key, unit, fmt in KILL_METRICS:
        print(f"campaign_kill_fanout_{key}: {fmt.format(values[key])} {unit}")
    return 0 if values["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--contacts", type=int, default=None, help="list size (default 100,000; 200,000 with --kill-fanout)"
    )
    parser.add_argument("--critical-rate", type=float, default=10.0, help="critical messages per second")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured critical messages first")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the campaign may take")
    parser.add_argument("--profile", action="store_true", help="py-spy the bulk worker's children")
    parser.add_argument("--kill-fanout", action="store_true", help="the SIGKILL-half-way scenario")
    parser.add_argument("--dkim", action="store_true", help="each run unsigned and DKIM-signed, side by side")
    parser.add_argument(
        "--compare", action="store_true", help="each run also django-post_office on the same sink and N"
    )
    parser.add_argument("--kill-step", type=int, default=2000, help="fan-out step of the worker killed")
    parser.add_argument(
        "--kill-delay",
        type=float,
        default=0.0,
        help="seconds from seeing half to the SIGKILL (0.02: mid-step)",
    )
    args = parser.parse_args()
    # SIGTERM ends the script through the same `finally` blocks as Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    broker = open_broker()
    try:
        env, api_key = setup()
    except BaseException:
        close_broker()
        raise
    print(f"broker: {re.sub(r'//[^@/]*@', '//', broker)}", flush=True)
    try:
        if args.kill_fanout:
            return main_kill(args, env)
        return main_dkim(args, env, api_key) if args.dkim else main_campaign(args, env, api_key)
    except SinkUnavailable as exc:
        print(f"Postfix smtp-sink is not available: {exc}", file=sys.stderr)
        return 2
    finally:
        try:
            reset_state()  # no 100,000 message rows nor queued tasks left behind
        finally:
            close_broker()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything started was stopped on the way out
        sys.exit(130)
