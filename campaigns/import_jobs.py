"""CSV imports as jobs: the file is stored in PostgreSQL, a worker imports it, progress is kept.

Storing: ``create_import_job`` checks the header (a bad one is refused before anything is
written), then copies the file into ``ImportChunk`` rows CHUNK_BYTES at a time, in the
transaction that creates the job, and publishes ``campaigns.run_import`` after the commit. The
file is in PostgreSQL because web and workers may run on different hosts; it is deleted when the
job finishes.

Running: ``run_import_job`` claims the job with a conditional UPDATE that stores a fresh token;
each batch of contacts commits together with the job's counters, its new ImportIssue rows and
the position of the next record, and only while the token is still the job's. A run that dies
(a killed worker, a lost connection) leaves the job `running` with an old heartbeat;
``resume_stalled_imports`` (beat, every 15 s) hands it back as `pending` and publishes it again,
and the next run resumes at the recorded position. A run still alive when it was handed back
finds its token gone at its next batch and stops with that batch rolled back, so two runs never
both write. Contacts are upserts either way, so nothing is ever duplicated.
"""

from __future__ import annotations

import csv
import functools
import io
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import IO

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from campaigns import importing
from campaigns.exceptions import ImportClaimLost, ImportFileError
from campaigns.importing import ImportReport, Position
from campaigns.models import ContactList, ImportChunk, ImportIssue, ImportJob
from campaigns.selectors import AUDIENCE_TABLES
from core import statistics
from core.sql import literals

logger = logging.getLogger(__name__)

Status = ImportJob.Status
RUN_IMPORT_TASK = "campaigns.run_import"
# A slice of the file per row: 1 MiB keeps each INSERT and each read small (a 60 MB file is 60
# rows) while the per-row overhead stays negligible.
CHUNK_BYTES = 1 << 20
# Runs of one job before it is marked failed: a file that crashes its worker every time (a bug,
# not bad data, which is rejected row by row) must not loop forever.
MAX_ATTEMPTS = 5


def create_import_job(
    file: IO[bytes], *, filename: str = "", list_name: str | None = None, publish: bool = True
) -> ImportJob:
    """Store ``file`` (seekable, binary) as a pending import; publish its task after commit.

    Raises ``ImportFileError`` for a bad header, before anything is written.
    """
    importing.read_header(importing.stream_chunks(file))
    file.seek(0)
    with transaction.atomic():
        job = ImportJob.objects.create(filename=filename[:255], list_name=list_name or "")
        size = 0
        with connection.cursor() as cursor:
            for seq, chunk in enumerate(iter(lambda: file.read(CHUNK_BYTES), b"")):
                cursor.execute(
                    "INSERT INTO campaigns_importchunk (job_id, seq, data) VALUES (%s, %s, %s)",
                    [job.pk, seq, chunk],
                )
                size += len(chunk)
        job.size = size
        job.save(update_fields=["size"])
        if publish:
            job_id = job.pk
            transaction.on_commit(lambda: publish_import(job_id))
    return job


def publish_import(job_id: int) -> None:
    """Publish the job's task; when the broker is away the stalled-import sweep publishes it later."""
    try:
        current_app.send_task(RUN_IMPORT_TASK, args=[job_id], queue="campaigns", retry=False)
    except Exception as exc:  # noqa: BLE001 - the job is committed; the sweep retries
        logger.warning("import %s not published (%s); the stalled-import sweep will publish it", job_id, exc)


def _chunks_from(job_id: int) -> Callable[[int], Iterator[bytes]]:
    def chunks(offset: int) -> Iterator[bytes]:
        seq, skip = divmod(offset, CHUNK_BYTES)
        while True:
            # One chunk per query: a server-side cursor would hold a transaction open across the
            # batches, which commit on their own.
            data = ImportChunk.objects.filter(job_id=job_id, seq=seq).values_list("data", flat=True).first()
            if data is None:
                return
            yield bytes(data)[skip:]
            seq, skip = seq + 1, 0

    return chunks


# Statuses as SQL literals from the model's enum (core.sql): `{JOB.PENDING}` is `'pending'`.
JOB = literals(ImportJob.Status)

_CLAIM_SQL = f"""
UPDATE campaigns_importjob
   SET status = {JOB.RUNNING}, run_token = %s, attempts = attempts + 1, heartbeat_at = now(),
       started_at = COALESCE(started_at, now()), since = COALESCE(since, clock_timestamp()), error = ''
 WHERE id = %s AND status = {JOB.PENDING}
RETURNING attempts
"""

_PROGRESS_SQL = """
UPDATE campaigns_importjob
   SET rows_read = %s, rows_created = %s, rows_updated = %s, rows_duplicate = %s, rows_rejected = %s,
       added_to_list = %s, next_line = %s, next_offset = %s, heartbeat_at = now()
 WHERE id = %s AND run_token = %s
"""

_ISSUES_SQL = """
INSERT INTO campaigns_importissue (job_id, kind, line, reason, excerpt)
SELECT %s, kind, line, reason, excerpt
  FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[]) AS i(kind, line, reason, excerpt)
ON CONFLICT (job_id, kind, line) DO NOTHING
"""


def _finish(job_id: int, token: uuid.UUID, status: str, error: str = "") -> bool:
    with transaction.atomic():
        done = ImportJob.objects.filter(pk=job_id, run_token=token).update(
            status=status,
            error=error,
            run_token=None,
            finished_at=timezone.now(),
            heartbeat_at=timezone.now(),
        )
        if done:
            ImportChunk.objects.filter(job_id=job_id).delete()
    return bool(done)


def run_import_job(
    job_id: int,
    *,
    batch_size: int = importing.BATCH_SIZE,
    on_progress: Callable[[ImportReport, Position], None] | None = None,
) -> ImportJob | None:
    """Run (or resume) a pending job; None when it is not pending (done, or another run has it)."""
    token = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, [token, job_id])
        claimed = cursor.fetchone()
    if claimed is None:
        return None
    job = ImportJob.objects.get(pk=job_id)
    if claimed[0] > MAX_ATTEMPTS:
        _finish(job_id, token, Status.FAILED, f"gave up after {MAX_ATTEMPTS} runs that did not finish")
        return ImportJob.objects.get(pk=job_id)
    chunks = _chunks_from(job_id)
    try:
        columns, first = importing.read_header(chunks(0))
    except ImportFileError as exc:  # the API checked it; the command's file may have changed
        _finish(job_id, token, Status.FAILED, str(exc))
        return ImportJob.objects.get(pk=job_id)
    if job.list_name and job.contact_list_id is None:
        contact_list, _ = ContactList.objects.get_or_create(name=job.list_name)
        ImportJob.objects.filter(pk=job_id, run_token=token).update(contact_list=contact_list)
        job.contact_list = contact_list
    report = _report_of(job)
    start = Position(job.next_line, job.next_offset) if job.next_line else first
    assert job.since is not None  # set by the claim
    try:
        importing.run(
            chunks,
            columns,
            start,
            report,
            job.since,
            batch_size=batch_size,
            on_batch=lambda report, position: _record_progress(job_id, token, report, position),
            on_progress=on_progress,
        )
    except ImportClaimLost:
        logger.warning("import %s: another run took it over; this run stopped", job_id)
        return None
    except Exception as exc:
        # Kept on the job for the operator; the sweep runs it again after the stall time.
        ImportJob.objects.filter(pk=job_id, run_token=token).update(
            error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        raise
    if _finish(job_id, token, Status.COMPLETED):
        # The planner's statistics for the rows just loaded, now: a campaign started right after
        # an import must not wait for autovacuum to learn they exist (core/statistics.py).
        statistics.analyze(AUDIENCE_TABLES)
    return ImportJob.objects.get(pk=job_id)


def _report_of(job: ImportJob) -> ImportReport:
    return ImportReport(
        list_id=job.contact_list_id,
        list_name=job.contact_list.name if job.contact_list else None,
        rows=job.rows_read,
        created=job.rows_created,
        updated=job.rows_updated,
        duplicates=job.rows_duplicate,
        rejected=job.rows_rejected,
        added_to_list=job.added_to_list,
    )


def _record_progress(job_id: int, token: uuid.UUID, report: ImportReport, position: Position) -> None:
    """Inside the batch's transaction: counters, position and issues, or ImportClaimLost."""
    with connection.cursor() as cursor:
        cursor.execute(
            _PROGRESS_SQL,
            [
                report.rows,
                report.created,
                report.updated,
                report.duplicates,
                report.rejected,
                report.added_to_list,
                position.line,
                position.offset,
                job_id,
                token,
            ],
        )
        if cursor.rowcount != 1:
            raise ImportClaimLost(job_id)
        if report.unsaved:
            issues = report.unsaved
            cursor.execute(
                _ISSUES_SQL,
                [
                    job_id,
                    [issue.kind for issue in issues],
                    [issue.line for issue in issues],
                    [issue.reason for issue in issues],
                    [issue.excerpt for issue in issues],
                ],
            )


def resume_stalled_imports(stale_seconds: float | None = None) -> int:
    """Publish again the jobs no run has moved for a while; return how many.

    A running job's heartbeat moves with every batch (at most CHECKPOINT_RECORDS rows apart, a
    second or two); one older than EMAILHUB_IMPORT_STALL_SECONDS has lost its worker, and a
    pending one that old was never published (the broker was away) or its task was lost. The
    job goes back to `pending` without a token, so a run that was only slow stops at its next
    batch and the republished one resumes at the last recorded position.
    """
    stale = settings.EMAILHUB_IMPORT_STALL_SECONDS if stale_seconds is None else stale_seconds
    cutoff = timezone.now() - timedelta(seconds=stale)
    with transaction.atomic():
        stalled = list(
            ImportJob.objects.select_for_update(skip_locked=True)
            .filter(status__in=[Status.PENDING, Status.RUNNING], heartbeat_at__lt=cutoff)
            .values_list("pk", flat=True)[:100]
        )
        ImportJob.objects.filter(pk__in=stalled).update(
            status=Status.PENDING, run_token=None, heartbeat_at=timezone.now()
        )
        for job_id in stalled:
            transaction.on_commit(functools.partial(publish_import, job_id))
    if stalled:
        logger.info("republished %d stalled import(s)", len(stalled))
    return len(stalled)


def rejections(job: ImportJob, kind: str = ImportIssue.Kind.REJECTED) -> Iterator[ImportIssue]:
    """Every issue of one kind, in line order, streamed."""
    return ImportIssue.objects.filter(job=job, kind=kind).order_by("line").iterator(chunk_size=2_000)


def rejections_csv(job: ImportJob) -> Iterator[str]:
    """The rejected rows as CSV (line, reason, excerpt), streamed in pieces of 1,000 rows: the API's
    `rejections.csv` and the admin's download."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["line", "reason", "excerpt"])
    for count, issue in enumerate(rejections(job), start=1):
        writer.writerow([issue.line, issue.reason, issue.excerpt])
        if count % 1_000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()
