"""Start-up checks: a provider chain that cannot work stops the process with the setting to fix."""

from __future__ import annotations

from typing import Any

from django.core import checks

from delivery.exceptions import ProviderConfigurationError


@checks.register(checks.Tags.compatibility)
def provider_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from delivery.services.sending import check_provider_settings

    try:
        check_provider_settings()
    except ProviderConfigurationError as exc:
        return [checks.Error(str(exc), id="delivery.E001")]
    return []
