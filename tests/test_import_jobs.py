"""CSV imports as jobs (issue 8, items 12, 13 and the CSV part of 7), against real PostgreSQL and Redis.

The upload is stored in PostgreSQL and answered with a 202; the job runs on a worker (here in
this process through the same service, and once on a real Celery worker); every rejected row is
kept and listed; a run that dies resumes without duplicating anything.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
import redis as redis_lib
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from campaigns import import_jobs, importing
from campaigns.import_jobs import create_import_job, resume_stalled_imports, run_import_job
from campaigns.models import Contact, ContactList, ImportChunk, ImportIssue, ImportJob, ListMembership
from scripts.stack import Stack
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db


def upload(api: APIClient, data: bytes, query: str = "") -> dict:
    response = api.post(
        f"/api/v1/contacts/import{query}",
        {"file": SimpleUploadedFile("contacts.csv", data, content_type="text/csv")},
        format="multipart",
    )
    assert response.status_code == 202, response.content
    assert response["Location"].endswith(f"/api/v1/imports/{response.json()['id']}")
    assert response.json()["status"] == "pending"
    return response.json()


def job_report(api: APIClient, job_id: int) -> dict:
    response = api.get(f"/api/v1/imports/{job_id}")
    assert response.status_code == 200
    return response.json()


def all_rejections(api: APIClient, job_id: int, page_size: int = 500) -> list[dict]:
    rows, url = [], f"/api/v1/imports/{job_id}/rejections?page_size={page_size}"
    while url:
        page = api.get(url).json()
        rows += page["results"]
        url = page["next"]
    return rows


def test_invalid_utf8_byte_mid_file_rejects_that_row_at_its_real_line_and_imports_every_later_row(
    api: APIClient,
) -> None:
    # BOM, CRLF and a quoted field spanning two lines before the bad byte: each shifts naive counts.
    head = b'\xef\xbb\xbfemail,name,address\r\nann@example.com,Ann,"1 Main St\r\nSpringfield"\r\n'
    before = b"".join(b"b%d@example.com,B,x\r\n" % i for i in range(3_000))  # lines 4..3003
    bad = b"bad@example.com,Zo\xeb,x\r\n"  # line 3004, Latin-1
    after = b"".join(b"a%d@example.com,A,x\r\n" % i for i in range(5_144))  # lines 3005..8148
    job = upload(api, head + before + bad + after)
    run_import_job(job["id"], batch_size=1_000)
    report = job_report(api, job["id"])
    assert report["status"] == "completed"
    assert (report["rows"], report["created"], report["rejected"]) == (8_146, 8_145, 1)
    [rejection] = all_rejections(api, job["id"])
    assert rejection["line"] == 3_004
    assert rejection["reason"].startswith("line 3004 is not valid UTF-8 (byte 0xeb at character 19)")
    assert rejection["excerpt"] == "bad@example.com,Zo\ufffd,x"
    assert Contact.objects.filter(email__regex=r"^a[0-9]+@").count() == 5_144
    assert Contact.objects.get(email="ann@example.com").attributes == {"address": "1 Main St\r\nSpringfield"}
    assert not ImportChunk.objects.exists()  # the stored file is gone once the job finished


def test_line_numbers_are_the_files_real_lines_with_lf_crlf_and_lone_cr_endings(db: None) -> None:
    text = b'email,note\n"bad\xff@x",A\r\nno-at,B\rok@example.com,"two\nlines"\nalso-bad,C\n'
    report = importing.import_contacts(io.BytesIO(text))
    assert [(issue.line, issue.reason.split(" (")[0]) for issue in report.rejected_rows] == [
        (2, "line 2 is not valid UTF-8"),
        (3, "'no-at' is not a valid email address"),
        (6, "'also-bad' is not a valid email address"),
    ]
    assert Contact.objects.get().attributes == {"note": "two\nlines"}


def test_a_nul_byte_rejects_only_its_row_naming_the_column_and_the_list_is_complete(api: APIClient) -> None:
    data = (
        b"email,name,plan\nann@example.com,Ann,gold\nbob@example.com,B\x00b,gold\ncy@example.com,Cy,x\x00\n"
    )
    job = upload(api, data, "?list=vip")
    run_import_job(job["id"])
    report = job_report(api, job["id"])
    assert (report["status"], report["created"], report["rejected"], report["added_to_list"]) == (
        "completed",
        1,
        2,
        1,
    )
    assert [(r["line"], r["reason"]) for r in all_rejections(api, job["id"])] == [
        (3, "column 'name' contains a NUL character (0x00), which cannot be stored: remove it"),
        (4, "column 'plan' contains a NUL character (0x00), which cannot be stored: remove it"),
    ]
    assert all_rejections(api, job["id"])[0]["excerpt"] == "bob@example.com,B\ufffdb,gold"
    assert list(ListMembership.objects.values_list("contact__email", flat=True)) == ["ann@example.com"]


def test_a_nul_byte_in_the_header_is_a_400_that_stores_nothing(api: APIClient) -> None:
    response = api.post(
        "/api/v1/contacts/import?list=x", b"email,na\x00me\na@example.com,A\n", content_type="text/csv"
    )
    assert response.status_code == 400
    assert "NUL" in json.dumps(response.json())
    assert (
        not ImportJob.objects.exists() and not ContactList.objects.exists() and not Contact.objects.exists()
    )


def test_more_than_1000_rejected_rows_are_all_listed_paginated_and_as_csv(api: APIClient) -> None:
    lines = [f"bad{i}" if i % 2 else f"u{i}@example.com" for i in range(5_000)]
    job = upload(api, ("email\n" + "\n".join(lines) + "\n").encode())
    run_import_job(job["id"], batch_size=700)
    report = job_report(api, job["id"])
    assert (report["rows"], report["created"], report["rejected"]) == (5_000, 2_500, 2_500)
    listed = all_rejections(api, job["id"], page_size=400)
    assert [row["line"] for row in listed] == list(range(3, 5_002, 2))  # line 1 is the header
    assert listed[-1] == {
        "line": 5_001,
        "reason": "'bad4999' is not a valid email address",
        "excerpt": "bad4999",
    }
    response = api.get(f"/api/v1/imports/{job['id']}/rejections.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["line", "reason", "excerpt"] and len(rows) == 2_501
    assert rows[1] == ["3", "'bad1' is not a valid email address", "bad1"]


def test_a_crashed_run_resumes_at_its_last_batch_without_duplicating_contacts_or_rejections(db: None) -> None:
    lines = [f"u{i}@example.com" if i % 10 else f"bad{i}" for i in range(6_000)]
    data = ("email\n" + "\n".join(lines) + "\n").encode()
    job = create_import_job(io.BytesIO(data), filename="c.csv", list_name="l", publish=False)

    class WorkerKilled(Exception):
        pass

    def die_after_3000_rows(report: importing.ImportReport, position: importing.Position) -> None:
        if report.rows >= 3_000:
            raise WorkerKilled

    with pytest.raises(WorkerKilled):
        run_import_job(job.pk, batch_size=1_000, on_progress=die_after_3000_rows)
    job.refresh_from_db()
    assert job.status == "running" and 0 < job.rows_read < 6_000
    assert run_import_job(job.pk) is None  # still claimed: a redelivered task does nothing
    assert resume_stalled_imports(stale_seconds=0) == 1  # the sweep hands it back
    finished = run_import_job(job.pk, batch_size=1_000)
    assert finished is not None and finished.status == "completed" and finished.attempts == 2
    assert (finished.rows_read, finished.rows_created, finished.rows_rejected) == (6_000, 5_400, 600)
    assert (finished.rows_updated, finished.rows_duplicate, finished.added_to_list) == (0, 0, 5_400)
    assert Contact.objects.count() == 5_400 and ListMembership.objects.count() == 5_400
    assert ImportIssue.objects.filter(job=job).count() == 600


def test_a_run_that_was_handed_over_stops_at_its_next_batch_and_writes_nothing_more(db: None) -> None:
    data = ("email\n" + "".join(f"u{i}@example.com\n" for i in range(3_000))).encode()
    job = create_import_job(io.BytesIO(data), publish=False)
    outcome: dict[str, object] = {}

    def slow_run_is_taken_over(report: importing.ImportReport, position: importing.Position) -> None:
        if report.rows == 1_000 and not outcome:
            resume_stalled_imports(stale_seconds=0)  # this run looked dead
            outcome["second"] = run_import_job(job.pk, batch_size=500)

    assert run_import_job(job.pk, batch_size=500, on_progress=slow_run_is_taken_over) is None
    second = outcome["second"]
    assert isinstance(second, ImportJob) and second.status == "completed"
    job.refresh_from_db()
    assert (job.status, job.rows_read, job.rows_created, job.rows_duplicate) == ("completed", 3_000, 3_000, 0)
    assert Contact.objects.count() == 3_000


def test_a_job_never_published_is_published_by_the_sweep(
    db: None,
    redis: redis_lib.Redis,
    django_capture_on_commit_callbacks,  # noqa: ANN001
) -> None:
    job = create_import_job(io.BytesIO(b"email\na@example.com\n"), publish=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert resume_stalled_imports(stale_seconds=3_600) == 0  # not stale yet
        assert resume_stalled_imports(stale_seconds=0) == 1
    [task] = [json.loads(raw) for raw in redis.lrange("campaigns", 0, -1)]
    assert task["headers"]["task"] == "campaigns.run_import" and task["headers"]["argsrepr"] == f"[{job.pk}]"


def test_an_upload_over_the_import_limit_is_a_413_naming_the_limit(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_IMPORT_MAX_BYTES = 4_096
    data = ("email\n" + "".join(f"u{i}@example.com\n" for i in range(1_000))).encode()
    response = api.post("/api/v1/contacts/import", data, content_type="text/csv")
    assert response.status_code == 413
    assert "EMAILHUB_IMPORT_MAX_BYTES" in json.dumps(response.json())
    assert not ImportJob.objects.exists() and not Contact.objects.exists()


def test_unknown_import_is_a_404(api: APIClient) -> None:
    for suffix in ("", "/rejections", "/rejections.csv", "/duplicates"):
        assert api.get(f"/api/v1/imports/999999{suffix}").status_code == 404


def test_import_routes_need_an_api_key_and_are_in_the_schema(api: APIClient) -> None:
    assert APIClient().get("/api/v1/imports/1").status_code == 401
    assert APIClient().get("/api/v1/imports/1/rejections.csv").status_code == 401
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    for route in (
        "/api/v1/imports/{id}",
        "/api/v1/imports/{id}/rejections",
        "/api/v1/imports/{id}/rejections.csv",
    ):
        assert route in schema


@pytest.mark.processes
def test_a_celery_worker_runs_the_uploaded_import(
    transactional_db: None, stack: Stack, api_key: tuple
) -> None:
    stack.start("worker-bulk")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
    job = upload(api, ("email\n" + "".join(f"w{i}@example.com\n" for i in range(4_500))).encode(), "?list=w")
    wait_until(
        lambda: ImportJob.objects.get(pk=job["id"]).status == "completed", 60, "the import to complete"
    )
    report = job_report(api, job["id"])
    assert (report["rows"], report["created"], report["added_to_list"]) == (4_500, 4_500, 4_500)
    assert import_jobs.rejections(ImportJob.objects.get(pk=job["id"])).__next__ is not None
