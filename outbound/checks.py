"""Start-up checks of the outbound webhooks' settings: an event must fit its 20 kB, and
`check --deploy` refuses the development switches that let endpoints reach private addresses."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

EVENT_BUDGET_BYTES = 20 * 1024
# What an event holds besides tags and metadata, at most: the error (1,000), a click's URL
# (2,048), the address (254), ids, timestamps and the keys' names.
_REST_BYTES = 4096


@checks.register(checks.Tags.compatibility)
def events_fit_their_budget(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Tags and metadata are echoed on every event: their limits must leave an event ≤ 20 kB."""
    tags = settings.EMAILHUB_MESSAGE_MAX_TAGS * (settings.EMAILHUB_TAG_MAX_LENGTH + 4)
    largest = tags + settings.EMAILHUB_METADATA_MAX_BYTES + _REST_BYTES
    if largest > EVENT_BUDGET_BYTES:
        return [
            checks.Warning(
                f"a webhook event may reach {largest} bytes, over its {EVENT_BUDGET_BYTES}: lower "
                "EMAILHUB_METADATA_MAX_BYTES, EMAILHUB_MESSAGE_MAX_TAGS or EMAILHUB_TAG_MAX_LENGTH",
                id="outbound.W001",
            )
        ]
    return []


@checks.register(checks.Tags.security, deploy=True)
def private_endpoints_refused(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: with either switch on, an API key can make the webhooks worker
    call into the operator's own network (plain http, loopback, private or metadata addresses)."""
    found = [
        name
        for name in ("EMAILHUB_WEBHOOKS_ALLOW_HTTP", "EMAILHUB_WEBHOOKS_ALLOW_PRIVATE")
        if getattr(settings, name)
    ]
    if found:
        return [
            checks.Error(
                f"{' and '.join(found)} on: webhook endpoints may name http or private addresses "
                "(development and tests only); unset it in production",
                id="outbound.E001",
            )
        ]
    return []
