"""The django-post_office reference of `bench/campaign.py --compare`.

The same N emails, the same template shape (per-recipient variables in subject, HTML and text,
rendered at delivery: `render_on_delivery`, as emailhub renders at send time), the same Postfix
smtp-sink, sent by post_office's own command the way the issue measured it:

    manage.py send_queued_mail --processes 2      (POST_OFFICE = {"BATCH_SIZE": 1000})

with bench/post_office_settings.py, on a database of its own (emailhub_bench_post_office).
Queueing the emails (one bulk_create) is not timed; the clock runs from starting the command to
its exit, when the queue is empty. Checks: every email `sent` in its database and the sink's
count equal to N.

This script is the child that runs under post_office's settings (`post_office_ref.py enqueue N`,
`post_office_ref.py count`); bench/lib/post_office.py is the side bench/campaign.py calls
(`prepare()`, `run()`), which starts it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lib.audience import HTML, SUBJECT, TEXT  # noqa: E402
from bench.lib.post_office import SETTINGS  # noqa: E402

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
    sys.exit(main())
