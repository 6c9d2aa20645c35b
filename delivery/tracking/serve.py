"""What a tracking hit does, and the WSGI fast path that answers hits without Django's stack.

`open_hit` and `click_hit` are the one implementation of `GET /t/o/<token>` and `GET /t/c/<token>`:
the Django views (delivery/tracking/views.py) and `TrackingFastPath` both call them, so the token
check, the queued entry and the answer cannot drift apart.

Why a fast path: a pixel request through Django runs nine middleware (sessions, CSRF, auth,
messages, the API error shape...), URL resolution and the request/response objects, none of which
a pixel needs (no session, no cookie, no database). Profiled in one process, that stack was most
of a hit's CPU besides the RPUSH; `TrackingFastPath` (emailhub/wsgi.py wraps Django's application
in it) answers a well-formed GET itself and passes everything else to Django: other paths, other
methods (Django's 405), a click token that does not verify (Django's 404 page), a Host that is not
in ALLOWED_HOSTS (Django's 400), a non-ASCII path. Its answers carry the headers Django's
SecurityMiddleware and XFrameOptionsMiddleware would add, and always a Content-Length, so a
keep-alive connection stays usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.encoding import iri_to_uri

from core import metrics
from core.client_ip import NetworkSet, client_address, networks
from delivery.tracking import hits
from delivery.tracking.tokens import InvalidToken, read_click_token, read_open_token

# The smallest transparent GIF: 1×1, one transparent colour (43 bytes).
PIXEL = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
# Every open must reach us (a cached pixel is a lost open) and no shared cache may keep it.
NO_STORE = "no-store, private"
OPEN_PREFIX = "/t/o/"
CLICK_PREFIX = "/t/c/"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def open_hit(token: str, user_agent: str, ip: str) -> None:
    """Queue the open of a genuine token; an unknown one is ignored (the answer is the same)."""
    try:
        message_id = read_open_token(token)
    except InvalidToken:
        metrics.count_tracking_request("open", "unknown_token")
        return
    queued = hits.push(
        hits.encode(hits.OPEN, message_id, link=None, url="", user_agent=user_agent, ip=ip, at=time.time())
    )
    metrics.count_tracking_request("open", "queued" if queued else "not_queued")


def click_hit(token: str, user_agent: str, ip: str) -> str | None:
    """The URL a genuine click token leads to, its click queued; None for any other token."""
    try:
        target = read_click_token(token)
    except InvalidToken:
        metrics.count_tracking_request("click", "unknown_token")
        return None
    queued = hits.push(
        hits.encode(
            hits.CLICK,
            target.message_id,
            link=target.link,
            url=target.url,
            user_agent=user_agent,
            ip=ip,
            at=time.time(),
        )
    )
    metrics.count_tracking_request("click", "queued" if queued else "not_queued")
    return target.url


def _security_headers() -> list[tuple[str, str]]:
    """The headers SecurityMiddleware and XFrameOptionsMiddleware put on every Django answer."""
    headers = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append(("X-Content-Type-Options", "nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        headers.append(("Referrer-Policy", policy if isinstance(policy, str) else ",".join(policy)))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    headers.append(("X-Frame-Options", getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()))
    return headers


class TrackingFastPath:
    """A WSGI wrapper: answers `GET /t/o/<token>` and genuine `GET /t/c/<token>` itself (see the
    module docstring), passes every other request to `app`."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app
        # Settings are read on the first hit, not at import (wsgi.py is imported before any test
        # or deployment can change them), and kept: a web process's settings do not change.
        self._ready = False
        self._pixel_headers: list[tuple[str, str]] = []
        self._redirect_headers: list[tuple[str, str]] = []
        self._allowed_hosts: list[str] = []
        self._ssl_redirect = False
        self._trusted = NetworkSet(())

    def _prepare(self) -> None:
        common = _security_headers()
        self._pixel_headers = [
            ("Content-Type", "image/gif"),
            ("Cache-Control", NO_STORE),
            ("Content-Length", str(len(PIXEL))),
            *common,
        ]
        self._redirect_headers = [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Cache-Control", NO_STORE),
            ("Content-Length", "0"),
            *common,
        ]
        self._allowed_hosts = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not self._allowed_hosts:  # Django's own DEBUG default
            self._allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
        self._ssl_redirect = bool(settings.SECURE_SSL_REDIRECT)  # Django's redirect to https
        self._trusted = networks(settings.EMAILHUB_TRUSTED_PROXIES)
        self._ready = True

    def _host_allowed(self, environ: dict[str, Any]) -> bool:
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
        domain, _ = split_domain_port(host)
        return bool(domain) and validate_host(domain, self._allowed_hosts)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") != "GET" or not path.startswith((OPEN_PREFIX, CLICK_PREFIX)):
            return self.app(environ, start_response)
        token = path[len(OPEN_PREFIX) :]  # both prefixes are as long
        if not token or "/" in token or not token.isascii():
            return self.app(environ, start_response)
        if not self._ready:
            self._prepare()
        if self._ssl_redirect or not self._host_allowed(environ):
            return self.app(environ, start_response)
        # The socket's peer, or behind EMAILHUB_TRUSTED_PROXIES the client it forwarded: the
        # Apple-range rule of classify.py needs the reader's side, not our proxy's.
        ip = client_address(
            environ.get("REMOTE_ADDR", ""), environ.get("HTTP_X_FORWARDED_FOR", ""), self._trusted
        )
        agent = environ.get("HTTP_USER_AGENT", "")
        if path.startswith(OPEN_PREFIX):
            open_hit(token, agent, ip)
            start_response("200 OK", self._pixel_headers)
            return [PIXEL]
        url = click_hit(token, agent, ip)
        if url is None:
            return self.app(environ, start_response)  # Django's 404 page, as for any other path
        start_response("302 Found", [("Location", iri_to_uri(url)), *self._redirect_headers])
        return [b""]
