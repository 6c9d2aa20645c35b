"""Open pixels and tracked links answered before Django's stack (switch: `tracking`).

**Replaces.** Django's handler for two URLs: a pixel request through Django runs nine middleware
(sessions, CSRF, auth, messages, the API error shape...), URL resolution and the request and
response objects, none of which a pixel needs (no session, no cookie, no database). Profiled in
one process, that stack was most of a hit's CPU besides the RPUSH. `TrackingFastPath`
(emailhub/wsgi.py wraps Django's application in it) answers a well-formed GET itself, calling
the tracking app's own functions (`Hits`, filled by delivery/tracking/serve.py: the same ones
the Django views call), and passes everything else to Django: other paths, other methods
(Django's 405), a click token that does not verify (Django's 404 page), a Host that is not in
ALLOWED_HOSTS (Django's 400), a request Django would redirect to https, a non-ASCII path. Its
answers carry the headers Django's SecurityMiddleware and XFrameOptionsMiddleware would add, and
always a Content-Length, so a keep-alive connection stays usable. It uses no private API; it is
here because it stands in for Django's stack.

**Gain.** bench/tracking.py: 2,636–2,869 hits/s through this path against 950 hits/s through
Django (with a sync worker) in the same run (docs/performance.md, the targets table and
"tracking"); `--django-only` serves `emailhub.wsgi:django_application` for the reference.

**Pinned by** tests/test_tracking_fastpath.py: its answers (status, headers, body) equal the
Django views', it queues the same hit, writes nothing to the database, and passes everything
else on; the gunicorn tests there run with the switch on and off.

**Switch.** `tracking` in EMAILHUB_FAST_PATHS; off, Django's views answer every hit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.encoding import iri_to_uri

from core.client_ip import NetworkSet, client_address, networks

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class Hits:
    """What the fast path answers and whom it asks: the tracking app's URLs and functions."""

    open_prefix: str
    click_prefix: str
    open_hit: Callable[[str, str, str], None]  # (token, user agent, address)
    click_hit: Callable[[str, str, str], str | None]  # the URL to send the reader to, or None
    pixel: bytes
    cache_control: str


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
    """A WSGI wrapper: answers `GET <open prefix><token>` and genuine `GET <click prefix><token>`
    itself (see the module docstring), passes every other request to `app`."""

    def __init__(self, app: WsgiApp, hits: Hits) -> None:
        self.app = app
        self.hits = hits
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
            ("Cache-Control", self.hits.cache_control),
            ("Content-Length", str(len(self.hits.pixel))),
            *common,
        ]
        self._redirect_headers = [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Cache-Control", self.hits.cache_control),
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
        hits = self.hits
        if environ.get("REQUEST_METHOD") != "GET":
            return self.app(environ, start_response)
        if path.startswith(hits.open_prefix):
            token = path[len(hits.open_prefix) :]
        elif path.startswith(hits.click_prefix):
            token = path[len(hits.click_prefix) :]
        else:
            return self.app(environ, start_response)
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
        if path.startswith(hits.open_prefix):
            hits.open_hit(token, agent, ip)
            start_response("200 OK", self._pixel_headers)
            return [hits.pixel]
        url = hits.click_hit(token, agent, ip)
        if url is None:
            return self.app(environ, start_response)  # Django's 404 page, as for any other path
        start_response("302 Found", [("Location", iri_to_uri(url)), *self._redirect_headers])
        return [b""]
