"""The storm reference for bench/transactional.py: what a Django team writes without emailhub.

A view that stores nothing durable and calls a Celery task with `.delay()`, and the task, which
calls Django's `send_mail` over an SMTP connection each worker process keeps open. No outbox, no
idempotency, no breaker, no failover: a message in the broker when Redis or the worker dies is
gone. It is the bar emailhub's transactional pipeline is measured against (`storm_e2e_ratio`).

Served by gunicorn with emailhub's web command (the bench swaps the WSGI module for this one) and
worked by emailhub's transactional worker command with `-A bench.reference.storm`, on the same
broker and SMTP sink. The only thing it does beyond the naive version is measurement: the task
pushes `(accepted at, sent at)` to one Redis list after the 250, one RPUSH per message, so the
bench can compute the same accept -> 250 latency and end-to-end rate as it does for emailhub.
"""

from __future__ import annotations

import json
import os
import time
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.reference.storm_settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.signals import worker_process_init  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.core.mail import get_connection, send_mail  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

# The Redis list the task reports (accepted at, sent at) to; the bench reads and empties it.
TIMES_KEY = "storm-reference:times"

app = Celery("storm_reference", broker=settings.CELERY_BROKER_URL)
# The queue emailhub's transactional worker command consumes first; no result backend.
app.conf.update(
    task_serializer="json", accept_content=["json"], task_ignore_result=True, task_default_queue="critical"
)

_smtp = None  # this worker process's kept SMTP connection
_times = None


@worker_process_init.connect
def _fresh(**_: object) -> None:
    global _smtp, _times
    _smtp, _times = None, None


@app.task(name="storm_reference.send", acks_late=True)
def send(to: str, subject: str, text: str, html: str | None, accepted_at: float) -> None:
    global _smtp, _times
    if _smtp is None:
        _smtp = get_connection()
        _smtp.open()
    send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [to], html_message=html, connection=_smtp)
    sent_at = time.time()
    if _times is None:
        _times = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    _times.rpush(TIMES_KEY, f"{accepted_at} {sent_at}")


@csrf_exempt
def accept(request: HttpRequest) -> JsonResponse:
    accepted_at = time.time()
    if request.method != "POST":
        return JsonResponse({"error": "POST only"}, status=405)
    try:
        body = json.loads(request.body)
        to, subject, text, html = body["to"], body["subject"], body.get("text", ""), body.get("html")
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "a JSON object with to and subject"}, status=400)
    send.delay(to, subject, text, html, accepted_at)
    return JsonResponse({"id": uuid.uuid4().hex, "status": "queued"}, status=202)


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [path("api/v1/messages", accept), path("healthz", healthz)]

application = WSGIHandler()
