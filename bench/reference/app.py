"""One view: parse the JSON body, one INSERT into a table of its own database, 202 JSON.

Served by gunicorn with emailhub's web command (bench/transactional.py swaps the WSGI module).
The table is created by the bench (`TABLE_SQL` in __init__), so the app needs no migrations.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.reference.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from bench.reference import TABLE_SQL  # noqa: E402, F401 - the table this view writes


@csrf_exempt
def accept(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return JsonResponse({"error": "POST only"}, status=405)
    try:
        body = json.loads(request.body)
        values = [
            body["to"],
            body["subject"],
            body.get("html"),
            body.get("text"),
            body.get("priority", "high"),
        ]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "a JSON object with to and subject"}, status=400)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO reference_message (to_email, subject, html, text, priority)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id, created_at",
            values,
        )
        message_id, created_at = cursor.fetchone()
    return JsonResponse(
        {
            "id": message_id,
            "status": "queued",
            "to": values[0],
            "priority": values[4],
            "created_at": created_at,
        },
        status=202,
    )


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [path("api/v1/messages", accept), path("healthz", healthz)]

application = get_wsgi_application()
