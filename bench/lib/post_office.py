"""The django-post_office reference of `bench/campaign.py --compare`, its parent side: the same N
emails, the same template (bench.lib.audience's newsletter, in Django's template language), the
same sink, sent by post_office's own `send_queued_mail --processes 2` on a database of its own.
bench/post_office_ref.py is the child that runs under post_office's settings (enqueue, count)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.lib.common import ROOT, bench_database

CHILD_SCRIPT = ROOT / "bench" / "post_office_ref.py"
DATABASE = bench_database("emailhub_bench_post_office")
SETTINGS = "bench.post_office_settings"


def child_env(smtp_port: int | None = None) -> dict[str, str]:
    base = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/emailhub")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": urlunsplit(base._replace(path=f"/{DATABASE}")),
    }
    if smtp_port is not None:
        env["SMTP_PORT"] = str(smtp_port)
    return env


def prepare() -> None:
    """Create and migrate post_office's database (once; later runs only check)."""
    env = child_env()
    for argv in (["scripts/ensure_db.py"], ["manage.py", "migrate", "--noinput", "-v0"]):
        subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, check=True)


def _child(*argv: str, smtp_port: int | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(CHILD_SCRIPT), *argv],
        cwd=ROOT, env=child_env(smtp_port), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"post_office_ref {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def run(count: int, sink: Any) -> dict[str, Any]:
    """Queue `count` emails, send them with `send_queued_mail --processes 2` to `sink` (a started
    bench.lib.smtp_sink sink); emails/s, elapsed, CPU of the command and its processes, checks."""
    _child("enqueue", str(count))
    received_before = sink.count()
    with tempfile.TemporaryDirectory(prefix="post-office-lock-") as lock_dir:
        argv = [
            sys.executable, "manage.py", "send_queued_mail", "--processes", "2",
            "--lockfile", str(Path(lock_dir) / "post_office"),
        ]  # fmt: skip
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        started = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, env=child_env(sink.port), capture_output=True, text=True)
        elapsed = time.monotonic() - started
        usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"send_queued_mail failed:\n{done.stderr[-3000:]}")
    sent, other = (int(x) for x in _child("count").split())
    received = sink.count() - received_before
    if not (sent == received == count and other == 0):
        raise RuntimeError(
            f"post_office: {sent} sent and {other} not sent in its database, sink received {received}, "
            f"expected {count}:\n{done.stderr[-2000:]}"
        )
    cpu = (usage_after.ru_utime + usage_after.ru_stime) - (usage_before.ru_utime + usage_before.ru_stime)
    return {"emails_per_s": sent / elapsed, "elapsed": elapsed, "sent": sent, "load": load, "cpu": cpu}
