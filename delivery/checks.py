"""Start-up checks: a provider chain that cannot work stops the process with the setting to fix."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from delivery.exceptions import ProviderConfigurationError
from delivery.providers import check_provider_settings


@checks.register(checks.Tags.compatibility)
def provider_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        check_provider_settings()
    except ProviderConfigurationError as exc:
        return [checks.Error(str(exc), id="delivery.E001")]
    return []


@checks.register(checks.Tags.security, deploy=True)
def secret_key_set(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: the development secret key must not reach production."""
    if not settings.DEBUG and settings.SECRET_KEY.startswith("dev-only-"):
        return [
            checks.Error("EMAILHUB_SECRET_KEY is not set; set it to a long random value", id="emailhub.E002")
        ]
    return []
