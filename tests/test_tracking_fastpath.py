"""The WSGI fast path for /t/o and /t/c (fastpaths/tracking.py): it answers pixels and clicks
itself, with Django's answers (status, headers, body), queues the same hit the views queue, writes
nothing to the database, and leaves everything else to Django. The gunicorn tests run with every
fast path on and with every one off (Django's views answer): the same outcomes."""

from __future__ import annotations

import http.client
import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from delivery.models import EmailEvent
from delivery.services.tracking import drain_hits
from delivery.tracking import hits
from delivery.tracking.serve import HITS, PIXEL
from delivery.tracking.tokens import click_token, open_token
from fastpaths.tracking import TrackingFastPath

pytestmark = pytest.mark.django_db(transaction=True)

BROWSER = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"
APPLE_MPP = "Mozilla/5.0"  # Mail Privacy Protection's bare user agent (delivery/tracking/classify.py)
# Headers that legitimately differ between two answers (the server's, and the clock's).
VARYING = {"date", "server", "connection"}


class NotDjango:
    """Stands in for Django's application: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        self.paths.append(environ["PATH_INFO"])
        start_response("418 I'm a teapot", [("Content-Length", "0")])
        return [b""]


def call(
    app: TrackingFastPath, path: str, *, method: str = "GET", host: str = "127.0.0.1"
) -> tuple[str, dict]:
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer.update(status=status, headers=dict(headers))

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "HTTP_HOST": host,
        "SERVER_NAME": host,
        "SERVER_PORT": "80",
        "HTTP_USER_AGENT": BROWSER,
        "REMOTE_ADDR": "203.0.113.5",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
    }
    body = b"".join(app(environ, start_response))
    return answer["status"], {**answer["headers"], "body": body}


def test_fast_path_answers_hits_itself_and_passes_everything_else_on(redis) -> None:  # noqa: ANN001
    django = NotDjango()
    app = TrackingFastPath(django, HITS)
    status, answer = call(app, f"/t/o/{open_token(12)}")
    assert status == "200 OK" and answer["body"] == PIXEL and answer["Content-Type"] == "image/gif"
    assert call(app, "/t/o/not-a-token")[0] == "200 OK"  # no oracle, and nothing queued
    url = "https://shop.example.com/spring?a=1"
    status, answer = call(app, f"/t/c/{click_token(12, 2, url)}")
    assert status == "302 Found" and answer["Location"] == url and answer["Content-Length"] == "0"
    assert django.paths == []
    # Django's: other paths and methods, a forged click (its 404 page), a Host it would refuse.
    forged = click_token(12, 2, url)[:-3] + "AAA"
    for path, kwargs in [
        ("/healthz", {}),
        (f"/t/o/{open_token(12)}", {"method": "POST"}),
        (f"/t/o/{open_token(12)}", {"method": "HEAD"}),
        (f"/t/o/{open_token(12)}/", {}),
        (f"/t/c/{forged}", {}),
        (f"/t/o/{open_token(12)}", {"host": "evil.example.net"}),
        ("/t/o/", {}),
    ]:
        assert call(app, path, **kwargs)[0].startswith("418"), (path, kwargs)
    assert len(django.paths) == 7
    queued = [hits.decode(raw) for raw in redis.lrange(settings.EMAILHUB_TRACKING_QUEUE, 0, -1)]
    assert [(h.kind, h.message_id, h.link, h.url, h.user_agent, h.ip) for h in queued] == [
        (hits.OPEN, 12, None, "", BROWSER, "203.0.113.5"),
        (hits.CLICK, 12, 2, url, BROWSER, "203.0.113.5"),
    ]


def test_fast_path_answers_match_the_django_views(redis) -> None:  # noqa: ANN001
    app = TrackingFastPath(NotDjango(), HITS)
    client = Client(HTTP_HOST="127.0.0.1")
    for path in [f"/t/o/{open_token(3)}", "/t/o/unknown", f"/t/c/{click_token(3, 0, 'https://a.example/é')}"]:
        response = client.get(path, HTTP_USER_AGENT=BROWSER)
        status, fast = call(app, path)
        assert status.split()[0] == str(response.status_code), path
        assert fast.pop("body") == response.content, path
        django_headers = {k.lower(): v for k, v in response.headers.items()} | {
            "content-length": str(len(response.content))
        }
        assert {k.lower(): v for k, v in fast.items()} == django_headers, path
    assert redis.llen(settings.EMAILHUB_TRACKING_QUEUE) == 4  # two opens and a click, each twice


@pytest.mark.parametrize("switched", ["tracking", "none"])
def test_the_switch_decides_what_emailhub_wsgi_serves(switched: str) -> None:
    from tests.conftest import process_env

    env = {**os.environ, **process_env(25), "EMAILHUB_FAST_PATHS": switched}
    done = subprocess.run(
        [sys.executable, "-c", "import emailhub.wsgi as w; print(type(w.application).__name__)"],
        env=env, capture_output=True, text=True, cwd=settings.BASE_DIR,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        "TrackingFastPath" if switched == "tracking" else "WSGIHandler"
    )


@pytest.mark.usefixtures("fast_paths")
def test_pixel_and_click_through_gunicorn(stack, web_port: int) -> None:  # noqa: ANN001
    stack.start_web(web_port, workers=1, extra_env={"EMAILHUB_SECRET_KEY": settings.SECRET_KEY})
    url = "https://shop.example.com/spring"
    token = click_token(77, 1, url)
    # A new connection per request, as separate mail clients open them; headers checked.
    answers = []
    for path in [
        f"/t/o/{open_token(77)}",
        "/t/o/unknown",
        f"/t/c/{token}?url=https://evil.example.net/",
        f"/t/c/{token[:-2]}",
        "/t/c/?url=https://evil.example.net/",
    ]:
        conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
        try:
            conn.request("GET", path, headers={"User-Agent": BROWSER})
            response = conn.getresponse()
            answers.append((response.status, dict(response.getheaders()), response.read()))
        finally:
            conn.close()
    (s1, h1, b1), (s2, h2, b2), (s3, h3, _), (s4, h4, _), (s5, _, _) = answers
    assert (s1, s2, b1, b2) == (200, 200, PIXEL, PIXEL)
    for headers in (h1, h2, h3, h4):
        assert "Set-Cookie" not in headers
    assert h1["Content-Type"] == "image/gif" and h1["Cache-Control"] == "no-store, private"
    assert h1["Content-Length"] == "43"
    assert s3 == 302 and h3["Location"] == url and h3["Cache-Control"] == "no-store, private"
    assert (s4, s5) == (404, 404) and h4["Content-Type"].startswith("text/html")  # Django's page
    # Keep-alive (the web command's gthread worker): many hits on one connection, none closed.
    conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
    sockets = []
    try:
        for path in ["/t/o/unknown", f"/t/c/{token}", "/t/o/unknown"]:
            conn.request("GET", path, headers={"User-Agent": BROWSER})
            response = conn.getresponse()
            response.read()
            assert response.status in (200, 302) and response.getheader("Connection") != "close"
            sockets.append(conn.sock)  # None once the server has closed the connection
        assert sockets[0] is not None and all(sock is sockets[0] for sock in sockets)
    finally:
        conn.close()
    # No INSERT in the requests: the open and the genuine click are queued, nothing else.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_emailevent")
        assert cursor.fetchone()[0] == 0
    queued = [json.loads(raw) for raw in stack_queue()]
    assert [(entry[1], entry[2], entry[3], entry[5], entry[6]) for entry in queued] == [
        (hits.OPEN, 77, None, BROWSER, "127.0.0.1"),
        (hits.CLICK, 77, 1, BROWSER, "127.0.0.1"),
        (hits.CLICK, 77, 1, BROWSER, "127.0.0.1"),
    ]
    assert drain_hits().hits == 3
    assert sorted(EmailEvent.objects.values_list("kind", flat=True)) == ["clicked", "clicked", "opened"]


def hit(port: int, path: str, forwarded_for: list[str], *, source: str = "127.0.0.1") -> int:
    """One GET from `source` (any 127.0.0.0/8 address reaches the server on Linux's loopback),
    with each X-Forwarded-For header sent separately, as a chain of proxies may send them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.putrequest("GET", path)
        conn.putheader("User-Agent", APPLE_MPP)
        for value in forwarded_for:
            conn.putheader("X-Forwarded-For", value)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.usefixtures("fast_paths")
def test_behind_a_trusted_proxy_a_hit_records_the_forwarded_client(stack, web_port: int) -> None:  # noqa: ANN001
    # The proxy is 127.0.0.1 (trusted); 127.0.0.2 is a client reaching gunicorn directly.
    stack.start_web(
        web_port,
        workers=1,
        extra_env={"EMAILHUB_SECRET_KEY": settings.SECRET_KEY, "EMAILHUB_TRUSTED_PROXIES": "127.0.0.1"},
    )
    pixel = f"/t/o/{open_token(5)}"
    url = "https://shop.example.com/spring"
    assert hit(web_port, pixel, ["17.58.1.2"]) == 200  # Apple's proxy, forwarded by ours
    assert hit(web_port, pixel, ["17.58.1.2"], source="127.0.0.2") == 200  # the same header, spoofed
    # Two headers: joined in order, the rightmost (written by our proxy) is the client.
    assert hit(web_port, pixel, ["198.51.100.7", "17.58.1.3"]) == 200
    # A client's own X-Forwarded-For left of what our proxy appended is not believed.
    assert hit(web_port, f"/t/c/{click_token(5, 0, url)}", ["17.58.1.4, 198.51.100.8"]) == 302
    assert [json.loads(raw)[6] for raw in stack_queue()] == [
        "17.58.1.2",
        "127.0.0.2",
        "17.58.1.3",
        "198.51.100.8",
    ]
    assert drain_hits().hits == 4
    recorded = EmailEvent.objects.values_list("kind", "payload__ip", "classification")
    assert sorted(recorded) == sorted(
        [
            ("opened", "17.58.1.2", "machine"),  # Apple Mail Privacy Protection, not a person
            ("opened", "127.0.0.2", "bot"),  # a bare Mozilla/5.0 from outside Apple
            ("opened", "17.58.1.3", "machine"),
            ("clicked", "198.51.100.8", "bot"),
        ]
    )


def stack_queue() -> list[bytes]:
    from core import redis_clients

    return list(redis_clients.send_path().lrange(settings.EMAILHUB_TRACKING_QUEUE, 0, -1))
