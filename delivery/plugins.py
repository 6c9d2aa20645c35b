"""Loading the plug-in classes a setting names (providers, webhooks), the way django-anymail
names its backends: dotted paths, each class declaring its own `name`."""

from __future__ import annotations

from typing import TypeVar

from django.conf import settings
from django.utils.module_loading import import_string

from delivery.exceptions import ProviderConfigurationError

T = TypeVar("T")


def named_classes(setting: str, base: type[T], kind: str) -> dict[str, type[T]]:
    """name → class of every dotted path in `settings.<setting>`, each a subclass of `base` with a
    `name`. Read on each call, so a settings override takes effect. Misconfiguration raises
    ProviderConfigurationError naming the setting."""
    classes: dict[str, type[T]] = {}
    for path in getattr(settings, setting):
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ProviderConfigurationError(f"{setting}: cannot import {path!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, base)) or not getattr(cls, "name", ""):
            raise ProviderConfigurationError(
                f"{setting}: {path!r} is not a {base.__name__} subclass with a name"
            )
        name: str = getattr(cls, "name")  # noqa: B009 - checked above; T is unbounded
        if name in classes:
            raise ProviderConfigurationError(
                f"{setting}: {path!r} and {classes[name].__module__} both declare the {kind} name {name!r}"
            )
        classes[name] = cls
    return classes
