from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from delivery.models import ApiKey


class Command(BaseCommand):
    help = "List API keys: name, prefix, scopes, created, revoked. Keys themselves are never stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--active", action="store_true", help="only keys that are not revoked")

    def handle(self, *args: Any, active: bool, **options: Any) -> None:
        keys = ApiKey.objects.order_by("name").only("name", "prefix", "scopes", "created_at", "revoked_at")
        if active:
            keys = keys.filter(revoked_at__isnull=True)
        rows = [("NAME", "PREFIX", "SCOPES", "CREATED", "REVOKED")]
        for key in keys:
            rows.append(
                (
                    key.name,
                    key.prefix,
                    ",".join(key.scopes),
                    key.created_at.isoformat(timespec="seconds"),
                    key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )
