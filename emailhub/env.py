"""Typed readers for environment variables.

Every setting comes from the environment with a local default that works on a developer machine.
A value that cannot be parsed stops start-up with a message that names the variable, so a typo in
production fails loudly instead of running with a silent fallback.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of true/false/1/0/yes/no, got {value!r}")


def env_list(name: str, default: list[str], *, allowed: set[str] | None = None) -> list[str]:
    value = _raw(name)
    items = default if value is None else [part.strip() for part in value.split(",") if part.strip()]
    if allowed is not None:
        unknown = [item for item in items if item not in allowed]
        if unknown:
            raise ImproperlyConfigured(
                f"{name} has unknown value(s) {', '.join(unknown)}; choose from {', '.join(sorted(allowed))}"
            )
    return items


def env_seconds_list(name: str, default: list[float]) -> list[float]:
    """A comma-separated list of seconds (each a number, 0 or more), at least one."""
    items = env_list(name, [str(s) for s in default])
    try:
        seconds = [float(item) for item in items]
    except ValueError:
        raise ImproperlyConfigured(
            f"{name} must be numbers of seconds separated by commas, got {items!r}"
        ) from None
    if not seconds or any(s < 0 for s in seconds):
        raise ImproperlyConfigured(
            f"{name} must list at least one number of seconds, none negative, got {items!r}"
        )
    return seconds


def env_database_url(name: str, default: str) -> dict[str, object]:
    """Turn ``postgres://user:pass@host:port/dbname`` into a Django DATABASES entry."""
    url = env_str(name, default)
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            f"{name} must be a postgres:// URL (e.g. postgres://postgres@127.0.0.1:5432/emailhub), got {url!r}"
        )
    database = parts.path.lstrip("/")
    if not database:
        raise ImproperlyConfigured(f"{name} must name a database after the host, got {url!r}")
    try:
        port = parts.port or 5432
    except ValueError:
        raise ImproperlyConfigured(f"{name} has an invalid port: {url!r}") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(database),
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(port),
    }


def env_redis_url(name: str, default: str) -> str:
    url = env_str(name, default)
    if urlsplit(url).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(
            f"{name} must be a redis:// URL (e.g. redis://127.0.0.1:6379/0), got {url!r}"
        )
    return url


def env_networks(name: str, default: list[str]) -> list[str]:
    """Comma-separated CIDRs (`10.0.0.0/8,::1`, a bare address is a /32 or /128), each checked;
    `none` for the empty list (an empty variable means the default, as everywhere here)."""
    value = _raw(name)
    if value is not None and value.lower() == "none":
        return []
    items = default if value is None else [part.strip() for part in value.split(",") if part.strip()]
    networks = []
    for item in items:
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP network (CIDR) or address") from None
    return networks
