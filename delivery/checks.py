"""Start-up checks: a provider chain that cannot work stops the process with the setting to fix;
`check --deploy` refuses development and test values that must not reach production."""

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


@checks.register(checks.Tags.security, deploy=True)
def sns_cert_fetch_override_unset(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check --deploy`: EMAILHUB_SNS_CERT_FETCH_OVERRIDE fetches the SNS signing
    certificates from somewhere other than AWS (the tests' loopback server). In production the
    SES webhook would then trust any notification signed by whatever key that place serves."""
    override = settings.EMAILHUB_SNS_CERT_FETCH_OVERRIDE
    if override:
        return [
            checks.Error(
                "EMAILHUB_SNS_CERT_FETCH_OVERRIDE is set "
                f"({', '.join(f'{prefix}={base}' for prefix, base in override.items())}): it is for tests "
                "only and makes the SES webhook fetch SNS signing certificates from that place "
                "instead of AWS; unset it",
                id="delivery.E002",
            )
        ]
    return []
