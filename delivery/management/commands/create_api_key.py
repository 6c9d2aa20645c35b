from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from delivery.authentication import create_api_key
from delivery.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key. The key is printed once; only its hash is stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="a name to recognise the key by, e.g. billing-service")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters, e.g. `create_api_key billing-service`")
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"an API key named {name!r} exists already; choose another name")
        _, raw = create_api_key(name)
        self.stdout.write(raw)
