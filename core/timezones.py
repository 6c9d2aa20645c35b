"""IANA timezone names, validated against the zoneinfo database that ships with tzdata."""

from __future__ import annotations

import zoneinfo
from functools import lru_cache

from django.core.exceptions import ValidationError


@lru_cache(maxsize=1)
def known_timezones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def validate_timezone(value: str) -> None:
    if value not in known_timezones():
        raise ValidationError(
            f"{value!r} is not an IANA timezone name (for example Europe/London or America/New_York).",
            code="invalid_timezone",
        )
