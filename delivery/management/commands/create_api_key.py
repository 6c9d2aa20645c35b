from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from delivery.authentication import create_api_key
from delivery.models import ApiKey, ApiKeyScope, default_api_key_scopes


class Command(BaseCommand):
    help = (
        "Create an API key. The key is printed once; only its hash is stored. "
        f"Scopes: {', '.join(ApiKeyScope.values)}; default {','.join(default_api_key_scopes())}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="a name to recognise the key by, e.g. billing-service")
        parser.add_argument(
            "--scopes",
            default=",".join(default_api_key_scopes()),
            help=(
                "comma-separated: send (POST messages), read (its own messages), manage (everything "
                "else and every key's messages); default %(default)s"
            ),
        )

    def handle(self, *args: Any, name: str, scopes: str, **options: Any) -> None:
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters, e.g. `create_api_key billing-service`")
        chosen = [s.strip() for s in scopes.split(",") if s.strip()]
        if not chosen:
            raise CommandError(f"--scopes needs at least one of {', '.join(ApiKeyScope.values)}")
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"an API key named {name!r} exists already; choose another name")
        try:
            _, raw = create_api_key(name, chosen)
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        self.stdout.write(raw)
