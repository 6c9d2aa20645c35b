"""`manage.py import_contacts FILE.csv --list NAME`: stream a CSV of contacts into the database.

Semantics (duplicates, empty cells, what a failure mid-file leaves) are those of
campaigns.importing.import_contacts; this command adds a progress bar and the report.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from campaigns.importing import ImportFileError, ImportReport, import_contacts


class Command(BaseCommand):
    help = (
        "Import contacts from a UTF-8 CSV file with a header row: email (required), name, timezone; "
        "other columns become attributes. Bad rows are reported with their line and skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="path of the CSV file")
        parser.add_argument(
            "--list", dest="list_name", help="add every imported contact to this list (created if missing)"
        )

    def handle(self, *args: Any, file: str, list_name: str | None, **options: Any) -> None:
        path = Path(file)
        if not path.is_file():
            raise CommandError(f"{file}: no such file; give the path of a CSV file")
        if list_name is not None and not (0 < len(list_name.strip()) <= 200):
            raise CommandError("--list must be a list name of 1 to 200 characters")
        try:
            # utf-8-sig: Excel's "CSV UTF-8" starts with a BOM. newline="": csv handles line endings.
            with path.open(encoding="utf-8-sig", newline="") as stream:
                report = self._import(stream, path.stat().st_size, list_name and list_name.strip())
        except ImportFileError as exc:
            if exc.report is not None:
                self._print_report(exc.report)
            raise CommandError(f"{file}: {exc}") from None
        except OSError as exc:
            raise CommandError(
                f"{file}: cannot read it ({exc.strerror}); check the path and its permissions"
            ) from None
        self._print_report(report)

    def _import(self, stream: TextIO, size: int, list_name: str | None) -> ImportReport:
        # The bar goes to stderr, so stdout holds only the report. It follows the bytes consumed
        # from the file (exact to within the decoder's read-ahead of a few kilobytes).
        console = Console(file=getattr(self.stderr, "_out", sys.stderr))
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("importing", total=size)

            def on_progress(report: ImportReport) -> None:
                progress.update(
                    task,
                    completed=stream.buffer.tell(),
                    description=f"{report.rows:,} rows, {report.rejected:,} rejected",
                )

            return import_contacts(stream, list_name=list_name, on_progress=on_progress)

    def _print_report(self, report: ImportReport) -> None:
        write = self.stdout.write
        for issue in report.rejected_rows:
            write(f"line {issue.line}: rejected: {issue.reason}")
            if issue.excerpt:
                write(f"    {issue.excerpt}")
        if report.rejected > len(report.rejected_rows):
            write(f"… and {report.rejected - len(report.rejected_rows):,} more rejected rows")
        for issue in report.duplicate_rows:
            write(f"line {issue.line}: {issue.reason}")
        if report.duplicates > len(report.duplicate_rows):
            write(f"… and {report.duplicates - len(report.duplicate_rows):,} more duplicate rows")
        summary = (
            f"{report.rows:,} rows: {report.created:,} contacts created, {report.updated:,} updated, "
            f"{report.duplicates:,} duplicate rows merged, {report.rejected:,} rejected"
        )
        if report.list_name is not None:
            summary += f"; {report.added_to_list:,} added to list {report.list_name!r}"
        write(summary, self.style.SUCCESS if not report.rejected else self.style.WARNING)
