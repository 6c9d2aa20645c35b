"""Start-up checks of the campaigns settings: the unsubscribe links must be reachable URLs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


@checks.register(checks.Tags.compatibility)
def public_url_wellformed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """EMAILHUB_PUBLIC_URL is an absolute http(s) URL with no query or fragment, or every
    unsubscribe link emailhub sends is broken."""
    url = settings.EMAILHUB_PUBLIC_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return [
            checks.Error(
                f"EMAILHUB_PUBLIC_URL {url!r} must be an absolute http(s) URL such as "
                "https://mail.example.com (no query or fragment): unsubscribe links are built on it",
                id="campaigns.E001",
            )
        ]
    return []


@checks.register(checks.Tags.security, deploy=True)
def public_url_https(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: RFC 8058 §3.1 requires the one-click URI to be HTTPS, and the
    local default would send every recipient's unsubscribe link to their own machine."""
    parts = urlsplit(settings.EMAILHUB_PUBLIC_URL)
    if parts.scheme != "https" or (parts.hostname or "") in _LOCAL_HOSTS:
        return [
            checks.Error(
                f"EMAILHUB_PUBLIC_URL is {settings.EMAILHUB_PUBLIC_URL!r}; set it to this deployment's "
                "public https:// address (RFC 8058 one-click unsubscribe requires HTTPS)",
                id="campaigns.E002",
            )
        ]
    return []
