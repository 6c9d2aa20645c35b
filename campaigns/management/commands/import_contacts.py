"""`manage.py import_contacts FILE.csv --list NAME`: import a CSV of contacts, with a progress bar.

The same service as `POST /api/v1/contacts/import` (campaigns.import_jobs): the file is stored as
an import job and run here, in this process; the report lists every rejected row. If this
process dies, the job is resumed by a worker (the stalled-import sweep), so `GET
/api/v1/imports/{id}` shows how it ended.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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

from campaigns import import_jobs
from campaigns.exceptions import ImportFileError
from campaigns.importing import ImportReport, Position
from campaigns.models import ImportIssue, ImportJob


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
            with path.open("rb") as stream:
                job = import_jobs.create_import_job(
                    stream, filename=path.name, list_name=list_name and list_name.strip(), publish=False
                )
        except ImportFileError as exc:
            raise CommandError(f"{file}: {exc}") from None
        except OSError as exc:
            raise CommandError(
                f"{file}: cannot read it ({exc.strerror}); check the path and its permissions"
            ) from None
        self._run(job)
        job.refresh_from_db()
        self._print_report(job)
        if job.status != ImportJob.Status.COMPLETED:
            raise CommandError(f"import {job.pk} {job.status}: {job.error or 'taken over by a worker'}")

    def _run(self, job: ImportJob) -> None:
        # The bar goes to stderr, so stdout holds only the report; it follows the bytes read.
        console = Console(file=getattr(self.stderr, "_out", sys.stderr))
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(f"import {job.pk}", total=job.size)

            def on_progress(report: ImportReport, position: Position) -> None:
                progress.update(
                    task,
                    completed=position.offset,
                    description=f"{report.rows:,} rows, {report.rejected:,} rejected",
                )

            import_jobs.run_import_job(job.pk, on_progress=on_progress)

    def _print_report(self, job: ImportJob) -> None:
        write = self.stdout.write
        for issue in import_jobs.rejections(job):
            write(f"line {issue.line}: rejected: {issue.reason}")
            if issue.excerpt:
                write(f"    {issue.excerpt}")
        for issue in import_jobs.rejections(job, ImportIssue.Kind.DUPLICATE):
            write(f"line {issue.line}: {issue.reason}")
        summary = (
            f"{job.rows_read:,} rows: {job.rows_created:,} contacts created, {job.rows_updated:,} updated, "
            f"{job.rows_duplicate:,} duplicate rows merged, {job.rows_rejected:,} rejected"
        )
        if job.contact_list is not None:
            summary += f"; {job.added_to_list:,} added to list {job.contact_list.name!r}"
        summary += f" (import {job.pk})"
        write(summary, self.style.SUCCESS if not job.rows_rejected else self.style.WARNING)
