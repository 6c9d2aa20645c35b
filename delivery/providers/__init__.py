"""The provider registry: plug-ins named by `EMAILHUB_PROVIDER_CLASSES`, one instance per name
per process (each worker process keeps its own connections).

Adding a provider is one module with a `Provider` subclass (its `name`, its `from_settings()`)
plus its dotted path in `EMAILHUB_PROVIDER_CLASSES`; the chains
(`EMAILHUB_PROVIDERS_TRANSACTIONAL`, `EMAILHUB_PROVIDERS_BULK`) then may name it.
"""

from __future__ import annotations

from django.conf import settings

from delivery.exceptions import ProviderConfigurationError
from delivery.plugins import named_classes
from delivery.providers.base import UNGUARDED, Attachment, Guard, Outcome, OutgoingEmail, Provider, SendResult

__all__ = [
    "CHAIN_SETTINGS",
    "UNGUARDED",
    "Attachment",
    "Guard",
    "Outcome",
    "OutgoingEmail",
    "Provider",
    "SendResult",
    "check_provider_settings",
    "close_all",
    "get_provider",
    "provider_classes",
]

# The settings that list provider names, in the order they are tried.
CHAIN_SETTINGS = ("EMAILHUB_PROVIDERS_TRANSACTIONAL", "EMAILHUB_PROVIDERS_BULK")

_instances: dict[str, Provider] = {}


def provider_classes() -> dict[str, type[Provider]]:
    """name → class of every provider in `EMAILHUB_PROVIDER_CLASSES`. Read on each call (only
    when a provider is built or the settings are checked), so a settings override takes effect."""
    return named_classes("EMAILHUB_PROVIDER_CLASSES", Provider, "provider")


def get_provider(name: str) -> Provider:
    provider = _instances.get(name)
    if provider is None:
        classes = provider_classes()
        if name not in classes:
            raise ProviderConfigurationError(
                f"unknown provider {name!r}; fix {' / '.join(CHAIN_SETTINGS)} "
                "or add its class to EMAILHUB_PROVIDER_CLASSES"
            )
        provider = _instances[name] = classes[name].from_settings()
    return provider


def check_provider_settings() -> None:
    """Every chain names registered providers, and each builds: run by `manage.py check`
    (delivery.E001) and at worker start-up, so a bad setting stops the process, named."""
    known = provider_classes()
    for setting in CHAIN_SETTINGS:
        chain = list(getattr(settings, setting))
        if not chain:
            raise ProviderConfigurationError(f"{setting} is empty; name at least one provider")
        unknown = [name for name in chain if name not in known]
        if unknown:
            raise ProviderConfigurationError(
                f"{setting} has unknown value(s) {', '.join(unknown)}; choose from "
                f"{', '.join(sorted(known))} (or add a provider to EMAILHUB_PROVIDER_CLASSES)"
            )
    for setting in CHAIN_SETTINGS:
        for name in getattr(settings, setting):
            get_provider(name)


def close_all() -> None:
    """Close and forget every provider instance of this process; the next lookup builds afresh
    from the settings. Called when a worker process starts or stops, and by tests after they
    change provider settings."""
    while _instances:
        _, provider = _instances.popitem()
        provider.close()
