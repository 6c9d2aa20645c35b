"""Start-up checks of the layer below the apps."""

from __future__ import annotations

from typing import Any

from django.core import checks

from core import outbox


@checks.register(checks.Tags.compatibility)
def outbox_publish_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """core.outbox builds its task messages itself, for the Celery settings this project uses;
    a setting it would silently not apply stops the process instead."""
    return [checks.Error(problem, id="core.E001") for problem in outbox.unsupported_publish_settings()]
