"""Start-up checks of the layer below the apps."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from core import outbox


@checks.register(checks.Tags.compatibility)
def outbox_publish_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The outbox's publisher may build task messages itself (fastpaths/publish.py), for the
    Celery settings this project uses; a setting it would silently not apply stops the process."""
    return [checks.Error(problem, id="core.E001") for problem in outbox.publisher().configuration_problems()]


@checks.register(checks.Tags.security, deploy=True)
def trusted_proxies_behind_https(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: EMAILHUB_HTTPS means a TLS-terminating proxy in front; without
    trusting it, every client address (core/client_ip.py) is that proxy's."""
    if settings.HTTPS and not settings.EMAILHUB_TRUSTED_PROXIES:
        return [
            checks.Warning(
                "EMAILHUB_HTTPS is on but EMAILHUB_TRUSTED_PROXIES is empty: tracking hits, the login "
                "lockout and the /metrics allow-list see the proxy's address, not the client's",
                hint="set EMAILHUB_TRUSTED_PROXIES to the address or network of the proxy",
                id="core.W001",
            )
        ]
    return []
