"""The django-post_office reference of `bench/campaign.py --compare`.

The same N emails, the same template shape (per-recipient variables in subject, HTML and text,
rendered at delivery: `render_on_delivery`, as emailhub renders at send time), the same Postfix
smtp-sink, sent by post_office's own command the way the issue measured it:

    manage.py send_queued_mail --processes 2      (POST_OFFICE = {"BATCH_SIZE": 1000})

with bench/post_office_settings.py, on a database of its own (emailhub_bench_post_office).
Queueing the emails (one bulk_create) is not timed; the clock runs from starting the command to
its exit, when the queue is empty. Checks: every email `sent` in its database and the sink's
count equal to N.

Used by bench/campaign.py (`run()`); as a script it is the child that runs under post_office's
settings: `post_office_ref.py enqueue N` / `post_office_ref.py count`.
"""

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

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "emailhub_bench_post_office"
SETTINGS = "bench.post_office_settings"

# The same content as bench/fanout.py's bench_template, in Django's template language (which
# these few tags share with core/templating).
SUBJECT = "{{ first_name }}, your monthly update"
HTML = (
    "<html><body><h1>Hello {{ first_name }}</h1>"
    '<p>Here is what happened this month on your {{ plan|default:"free" }} plan.</p>'
    + "<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.</p>"
    * 10
    + '<p><a href="https://example.com/unsubscribe?e={{ email }}">Unsubscribe</a></p>'
    "</body></html>"
)
TEXT = (
    "Hello {{ first_name }},\n\nHere is what happened this month on your "
    '{{ plan|default:"free" }} plan.\n\n'
    + "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n" * 10
    + "\nUnsubscribe: https://example.com/unsubscribe?e={{ email }}\n"
)


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
        [sys.executable, str(Path(__file__)), *argv],
        cwd=ROOT, env=child_env(smtp_port), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"post_office_ref {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def run(count: int, sink: Any) -> dict[str, Any]:
    """Queue `count` emails, send them with `send_queued_mail --processes 2` to `sink` (a started
    bench.smtp_sink sink); emails/s, elapsed, CPU of the command and its processes, checks."""
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


# --- the child, under post_office's settings -----------------------------------------------------


def _enqueue(count: int) -> None:
    from django.db import connection, transaction
    from post_office.models import PRIORITY, STATUS, Email, EmailTemplate

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE post_office_log, post_office_email CASCADE")
        template, _ = EmailTemplate.objects.update_or_create(
            name="bench-newsletter",
            language="",
            default_template=None,
            defaults={"subject": SUBJECT, "content": TEXT, "html_content": HTML},
        )
        step = 10_000
        for start in range(0, count, step):
            Email.objects.bulk_create(
                [
                    Email(
                        from_email="Bench <bench@example.com>",
                        to=[f"po{i}@example.com"],
                        template=template,
                        context={"first_name": f"Reader{i}", "email": f"po{i}@example.com"},
                        status=STATUS.queued,
                        priority=PRIORITY.medium,
                    )
                    for i in range(start, min(count, start + step))
                ]
            )


def _count() -> str:
    from post_office.models import STATUS, Email

    sent = Email.objects.filter(status=STATUS.sent).count()
    return f"{sent} {Email.objects.exclude(status=STATUS.sent).count()}"


def main() -> int:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    django.setup()
    command, *rest = sys.argv[1:]
    if command == "enqueue":
        _enqueue(int(rest[0]))
    elif command == "count":
        print(_count())
    else:
        print(f"unknown command {command!r} (enqueue N | count)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
