from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from delivery.authentication import find_api_key, revoke_api_key


class Command(BaseCommand):
    help = (
        "Revoke an API key by its name or prefix. Every process refuses it within "
        "EMAILHUB_API_KEY_CACHE_SECONDS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name_or_prefix", help="the key's name or its prefix (see list_api_keys)")

    def handle(self, *args: Any, name_or_prefix: str, **options: Any) -> None:
        try:
            key = find_api_key(name_or_prefix)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        if not revoke_api_key(key):
            # Already revoked: nothing changes, and saying so is not an error (scripts may repeat it).
            self.stdout.write(f"{key} was already revoked at {key.revoked_at:%Y-%m-%d %H:%M:%S%z}")
            return
        self.stdout.write(
            f"revoked {key}; every process refuses it within "
            f"{settings.EMAILHUB_API_KEY_CACHE_SECONDS:g} s (EMAILHUB_API_KEY_CACHE_SECONDS)"
        )
