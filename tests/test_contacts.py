"""Contacts, lists, suppressions and the streaming CSV import, against real PostgreSQL."""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from campaigns import importing
from campaigns.exceptions import ImportFileError
from campaigns.importing import ImportReport, import_contacts
from campaigns.models import Campaign, Contact, ContactList, ListMembership, Suppression, Template

pytestmark = pytest.mark.django_db

# The done-criterion file: Excel-style (BOM, CRLF), field columns in any case, two attributes.
DONE_CSV = (
    "\ufeff"
    + "\r\n".join(
        [
            "Email,Name,Timezone,plan,company",  # 1
            "ann@example.com,Ann,Europe/London,gold,Acme",  # 2 good
            "not-an-address,Bad,UTC,gold,Acme",  # 3 bad address
            "bob@example.com,Bob,Mars/Olympus,silver,Acme",  # 4 unknown timezone
            "",  # 5 empty line
            "CAROL@Example.COM,Carol,,silver,",  # 6 good: lower-cased, UTC, no company
            "ann@example.com,,America/New_York,platinum,",  # 7 duplicate of 2: merged, later wins
            'dave@example.com,"Dave,UTC,bronze,Initech',  # 8 stray quote, never properly closed
            "erin@example.com,Erin,Asia/Tokyo,gold,Globex",  # 9 good, swallowed by 8 then re-read
            'frank@example.com,"Frank" Jr,UTC,gold,Globex',  # 10 text after a closing quote
            "grace@example.com,Grace,UTC,gold",  # 11 one field short
            'ivan@example.com,"Ivan, PhD",UTC,gold,"Main St 1',  # 12 good, a quoted field
            'Springfield"',  # 13 … spanning two lines
            "judy@,Judy,UTC,gold,Acme",  # 14 bad address, numbered after the two-line record
        ]
    )
    + "\r\n"
)

DONE_REJECTED = {
    3: "'not-an-address' is not a valid email address",
    4: "unknown timezone 'Mars/Olympus'",
    5: "empty line",
    8: "a quoted field starting on this line runs on to line 10",
    10: "malformed quoting",
    11: "expected 5 fields as in the header, found 4",
    14: "'judy@' is not a valid email address",
}


def write(tmp_path: Path, text: str, name: str = "contacts.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def run_import(path: Path, **kwargs: object) -> ImportReport:
    with path.open("rb") as stream:
        return import_contacts(stream, **kwargs)


def fields_of(body: dict) -> dict:
    """The field errors of an /api/ error (the common shape: {"error": {"fields": …}})."""
    return body["error"]["fields"] if "error" in body else body


def run_uploaded_job(api: APIClient, response: object) -> dict:
    """The worker's part, in this process: run the job a 202 announced and return its report."""
    from campaigns.import_jobs import run_import_job

    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    assert response["Location"].endswith(f"/api/v1/imports/{job_id}")
    run_import_job(job_id)
    report = api.get(f"/api/v1/imports/{job_id}").json()
    assert report["status"] == "completed", report
    for key, kind in (("rejected_rows", "rejections"), ("duplicate_rows", "duplicates")):
        report[key] = api.get(f"/api/v1/imports/{job_id}/{kind}").json()["results"]
    return report


def assert_done_file_imported(list_name: str = "newsletter") -> None:
    contacts = {c.email: c for c in Contact.objects.all()}
    assert sorted(contacts) == [
        "ann@example.com",
        "carol@example.com",
        "erin@example.com",
        "ivan@example.com",
    ]
    ann = contacts["ann@example.com"]
    # Line 7 merged over line 2: its timezone and plan win; its empty name and company change nothing.
    assert (ann.name, ann.timezone) == ("Ann", "America/New_York")
    assert ann.attributes == {"plan": "platinum", "company": "Acme"}
    carol = contacts["carol@example.com"]
    assert (carol.name, carol.timezone, carol.attributes) == ("Carol", "UTC", {"plan": "silver"})
    assert contacts["erin@example.com"].attributes == {"plan": "gold", "company": "Globex"}
    ivan = contacts["ivan@example.com"]
    assert ivan.name == "Ivan, PhD" and ivan.attributes["company"] == "Main St 1\r\nSpringfield"
    assert all(c.status == Contact.Status.ACTIVE for c in contacts.values())
    members = ListMembership.objects.filter(contact_list__name=list_name)
    assert sorted(members.values_list("contact__email", flat=True)) == sorted(contacts)


def assert_done_report(report: dict) -> None:
    assert {k: report[k] for k in ("rows", "created", "updated", "duplicates", "rejected")} == {
        "rows": 12,
        "created": 4,
        "updated": 0,
        "duplicates": 1,
        "rejected": 7,
    }
    assert report["added_to_list"] == 4
    rejected = {row["line"]: row["reason"] for row in report["rejected_rows"]}
    assert sorted(rejected) == sorted(DONE_REJECTED)
    for line, reason in DONE_REJECTED.items():
        assert rejected[line].startswith(reason), (line, rejected[line])
    [duplicate] = report["duplicate_rows"]
    assert duplicate["line"] == 7 and duplicate["reason"].startswith("duplicate of line 2 (ann@example.com)")


# --- the import service and command -------------------------------------------------------------


def test_done_file_imports_the_good_rows_and_reports_each_bad_one_with_line_and_reason(
    tmp_path: Path,
) -> None:
    report = run_import(write(tmp_path, DONE_CSV), list_name="newsletter")
    assert_done_report(
        {
            **vars(report),
            "rejected_rows": [vars(r) for r in report.rejected_rows],
            "duplicate_rows": [vars(r) for r in report.duplicate_rows],
        }
    )
    assert report.rejected_rows[0].excerpt == "not-an-address,Bad,UTC,gold,Acme"
    assert report.rows == report.created + report.updated + report.duplicates + report.rejected
    assert_done_file_imported()


def test_command_imports_the_done_file_and_prints_each_rejected_line(tmp_path: Path) -> None:
    out, err = StringIO(), StringIO()
    call_command(
        "import_contacts", str(write(tmp_path, DONE_CSV)), "--list", "newsletter", stdout=out, stderr=err
    )
    printed = out.getvalue()
    for line, reason in DONE_REJECTED.items():
        assert f"line {line}: rejected: {reason}" in printed
    assert "line 7: duplicate of line 2 (ann@example.com)" in printed
    assert (
        "12 rows: 4 contacts created, 0 updated, 1 duplicate rows merged, 7 rejected; "
        "4 added to list 'newsletter'" in printed
    )
    size = len(DONE_CSV.encode())
    assert "12 rows, 7 rejected" in err.getvalue() and f"{size}/{size} bytes" in err.getvalue()  # the bar
    assert_done_file_imported()


def test_reimport_updates_attributes_and_adds_no_membership_twice(tmp_path: Path) -> None:
    run_import(write(tmp_path, DONE_CSV), list_name="newsletter")
    again = run_import(write(tmp_path, DONE_CSV), list_name="newsletter")
    assert (again.created, again.updated, again.duplicates, again.added_to_list) == (0, 4, 1, 0)
    change = "email,plan,tier\r\nAnn@Example.com,diamond,1\r\n"
    report = run_import(write(tmp_path, change, "change.csv"), list_name="newsletter")
    assert (report.created, report.updated, report.added_to_list) == (0, 1, 0)
    ann = Contact.objects.get(email="ann@example.com")
    # Merged: plan replaced, tier added, company kept; no name or timezone column keeps both.
    assert ann.attributes == {"plan": "diamond", "company": "Acme", "tier": "1"}
    assert (ann.name, ann.timezone) == ("Ann", "America/New_York")
    assert Contact.objects.count() == 4
    assert ListMembership.objects.count() == 4


def test_empty_cells_keep_stored_values_and_new_contacts_default_to_utc(tmp_path: Path) -> None:
    Contact.objects.create(email="ann@example.com", name="Ann", timezone="Asia/Tokyo", attributes={"a": "1"})
    path = write(tmp_path, "email,name,timezone,a\nann@example.com,,,\nzoe@example.com,,,\n")
    report = run_import(path)
    assert (report.created, report.updated) == (1, 1)
    ann = Contact.objects.get(email="ann@example.com")
    assert (ann.name, ann.timezone, ann.attributes) == ("Ann", "Asia/Tokyo", {"a": "1"})
    zoe = Contact.objects.get(email="zoe@example.com")
    assert (zoe.name, zoe.timezone, zoe.attributes) == ("", "UTC", {})


def test_duplicate_in_a_later_batch_is_reported_and_merged_not_counted_as_an_update(tmp_path: Path) -> None:
    Contact.objects.create(email="old@example.com", attributes={"kept": "yes"})
    rows = ["a", "b", "old", "c", "a", "d"]
    text = "email,plan\n" + "".join(f"{r}@example.com,p{i}\n" for i, r in enumerate(rows))
    report = run_import(write(tmp_path, text), batch_size=2)
    assert (report.created, report.updated, report.duplicates, report.rejected) == (4, 1, 1, 0)
    [duplicate] = report.duplicate_rows
    assert duplicate.line == 6 and duplicate.reason.startswith("duplicate of an earlier row (a@example.com)")
    assert Contact.objects.get(email="a@example.com").attributes == {"plan": "p4"}
    assert Contact.objects.get(email="old@example.com").attributes == {"kept": "yes", "plan": "p2"}


def test_stray_quote_never_closed_rejects_one_line_and_the_rest_still_imports(tmp_path: Path) -> None:
    good = [f"u{i}@example.com,User {i}" for i in range(100)]
    text = 'email,name\n"bad@example.com,Bad\n' + "\n".join(good) + "\n"
    report = run_import(write(tmp_path, text))
    assert [(r.line, r.reason) for r in report.rejected_rows] == [
        (2, "a quoted field starting on this line is not closed within 32 lines (a stray quote?)")
    ]
    assert report.created == 100 and Contact.objects.count() == 100
    tail = run_import(write(tmp_path, 'email,name\nz@example.com,"Zed\nu1@example.com,One\n', "tail.csv"))
    assert [(r.line, r.reason) for r in tail.rejected_rows] == [
        (2, "a quoted field starting on this line is never closed (a stray quote?)")
    ]
    assert tail.updated == 1


def test_quote_inside_an_unquoted_field_is_kept_literally(tmp_path: Path) -> None:
    report = run_import(write(tmp_path, 'email,name\nbob@example.com,Bo"b\n'))
    assert report.created == 1 and report.rejected == 0
    assert Contact.objects.get().name == 'Bo"b'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name,timezone\nAnn,UTC\n", "the header row has no email column (found: name, timezone)"),
        ("", "the file is empty"),
        ("\nemail\n", "line 1 is empty"),
        ("email,plan,Plan,plan\na@example.com,1,2,3\n", "column 'plan' appears twice"),
        ("Email,EMAIL\na@example.com,b@example.com\n", "column 'EMAIL' appears twice"),
        ("email,,plan\na@example.com,,1\n", "column 2 of the header row has no name"),
    ],
)
def test_a_bad_header_is_an_error_naming_the_fix_and_writes_nothing(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ImportFileError, match=re.escape(message)):
        run_import(write(tmp_path, text), list_name="newsletter")
    assert Contact.objects.count() == 0
    assert ContactList.objects.count() == 0


def test_command_refuses_a_missing_email_column_a_missing_file_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no email column"):
        call_command("import_contacts", str(write(tmp_path, "name\nAnn\n")), "--list", "x", stderr=StringIO())
    with pytest.raises(CommandError, match="no such file"):
        call_command("import_contacts", str(tmp_path / "missing.csv"))
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("email,näme\nzoe@example.com,Zoe\n".encode("latin-1"))
    with pytest.raises(CommandError, match="header row is unreadable: line 1 is not valid UTF-8.*save"):
        call_command("import_contacts", str(latin1), stderr=StringIO())
    assert Contact.objects.count() == 0 and ContactList.objects.count() == 0


def test_invalid_utf8_mid_file_rejects_that_row_at_its_line_and_imports_every_other(tmp_path: Path) -> None:
    # Well past any decoder read-ahead (the old reader stopped here and named a line 145 early).
    good = "".join(f"u{i}@example.com\n" for i in range(2_000)).encode()
    path = tmp_path / "mixed.csv"
    path.write_bytes(b"email\n" + good + b"late@example.com\xe9\n" + b"x@example.com\n")
    report = run_import(path, batch_size=500)
    [issue] = report.rejected_rows
    assert issue.line == 2_002
    assert issue.reason.startswith("line 2002 is not valid UTF-8 (byte 0xe9 at character 17)")
    assert (report.rows, report.created, report.rejected) == (2_002, 2_001, 1)
    assert Contact.objects.filter(email="x@example.com").exists()


def test_a_database_failure_mid_file_keeps_earlier_batches_and_a_rerun_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Let a 300-character name past validation so PostgreSQL (varchar 200) fails the second batch.
    monkeypatch.setattr(importing, "NAME_MAX_LENGTH", 1_000)
    rows = [f"u{i}@example.com,User {i}" for i in range(4)] + ["u4@example.com," + "x" * 300]
    with pytest.raises(DataError):
        run_import(write(tmp_path, "email,name\n" + "\n".join(rows) + "\n"), list_name="l", batch_size=3)
    assert sorted(Contact.objects.values_list("email", flat=True)) == [f"u{i}@example.com" for i in range(3)]
    assert ListMembership.objects.count() == 3
    rows[-1] = "u4@example.com,Fixed"
    report = run_import(write(tmp_path, "email,name\n" + "\n".join(rows) + "\n"), list_name="l", batch_size=3)
    assert (report.created, report.updated, report.added_to_list) == (2, 3, 2)
    assert Contact.objects.count() == 5 and ListMembership.objects.count() == 5


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.csv"
    zones = ["UTC", "Europe/London", "America/New_York", "Asia/Tokyo"]
    with path.open("w", encoding="utf-8", newline="") as out:
        out.write("email,name,timezone,plan,city\n")
        for i in range(50_000):
            out.write(f"user{i}@example.com,User {i},{zones[i % 4]},plan{i % 7},City {i % 1000}\n")
    return path


def test_a_50000_row_import_streams_in_bounded_memory(big_csv: Path) -> None:
    tracemalloc.start()
    try:
        report = run_import(big_csv, list_name="big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (report.rows, report.created, report.added_to_list) == (50_000, 50_000, 50_000)
    # The file is 2.9 MB; its rows as Python lists take 21 MB. Streaming peaks at about 2.6 MB.
    assert peak < 12 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


def test_a_50000_row_import_issues_two_statements_per_batch(big_csv: Path) -> None:
    with CaptureQueriesContext(connection) as queries:
        report = run_import(big_csv, list_name="big")
    assert report.created == 50_000
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    batches = 50_000 // importing.BATCH_SIZE
    upserts = [s for s in statements if "INSERT INTO campaigns_contact AS c" in s]
    memberships = [s for s in statements if "INSERT INTO campaigns_listmembership" in s]
    assert len(upserts) == len(memberships) == batches
    assert len(statements) <= 2 * batches + 4  # + the list's get_or_create and the clock


# --- the import endpoint ------------------------------------------------------------------------


def test_api_upload_imports_the_done_file_like_the_command(api: APIClient) -> None:
    upload = SimpleUploadedFile("contacts.csv", DONE_CSV.encode(), content_type="text/csv")
    response = api.post("/api/v1/contacts/import?list=newsletter", {"file": upload}, format="multipart")
    report = run_uploaded_job(api, response)
    assert_done_report(report)
    assert report["list_name"] == "newsletter"
    assert_done_file_imported()


def test_api_csv_body_spooled_to_disk_imports_the_done_file(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 64  # force the temporary-file upload handler
    response = api.generic(
        "POST", "/api/v1/contacts/import?list=newsletter", DONE_CSV.encode(), content_type="text/csv"
    )
    assert_done_report(run_uploaded_job(api, response))
    assert_done_file_imported()


def test_api_upload_without_email_column_is_a_400_and_writes_nothing(api: APIClient) -> None:
    upload = SimpleUploadedFile("c.csv", b"name,timezone\nAnn,UTC\n", content_type="text/csv")
    response = api.post("/api/v1/contacts/import", {"file": upload, "list": "new"}, format="multipart")
    assert response.status_code == 400
    assert "no email column" in fields_of(response.json())["file"][0]
    assert Contact.objects.count() == 0 and ContactList.objects.count() == 0


@pytest.mark.parametrize(
    ("send", "field"),
    [
        (lambda api: api.post("/api/v1/contacts/import", {}, format="multipart"), "file"),
        (lambda api: api.post("/api/v1/contacts/import", b"", content_type="text/csv"), "file"),
        (
            lambda api: api.post(
                "/api/v1/contacts/import?list=" + "x" * 201,
                b"email\na@example.com\n",
                content_type="text/csv",
            ),
            "list",
        ),
    ],
)
def test_api_import_without_a_file_or_with_a_bad_list_name_is_a_400(
    api: APIClient, send: Callable[[APIClient], object], field: str
) -> None:
    response = send(api)
    assert response.status_code == 400 and field in fields_of(response.json()), response.json()
    assert Contact.objects.count() == 0


def test_api_import_of_json_is_refused_as_unsupported_media(api: APIClient) -> None:
    response = api.post("/api/v1/contacts/import", {"email": "a@example.com"}, format="json")
    assert response.status_code == 415


# --- contacts -----------------------------------------------------------------------------------


def test_contact_is_created_lower_cased_with_defaults(api: APIClient) -> None:
    response = api.post(
        "/api/v1/contacts", {"email": " Ann@Example.COM", "attributes": {"plan": "gold"}}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["email"], body["timezone"], body["status"], body["name"]) == (
        "ann@example.com",
        "UTC",
        "active",
        "",
    )
    assert body["attributes"] == {"plan": "gold"} and body["created_at"]
    assert Contact.objects.get(pk=body["id"]).email == "ann@example.com"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "not-an-address"}, "email"),
        ({"email": "ANN@example.com"}, "email"),  # taken, whatever the case
        ({"email": "new@example.com", "timezone": "Mars/Olympus"}, "timezone"),
        ({"email": "new@example.com", "attributes": ["a"]}, "attributes"),
        ({"email": "new@example.com", "attributes": "plan=gold"}, "attributes"),
        ({"email": "new@example.com", "status": "asleep"}, "status"),
        ({"email": "new@example.com", "name": "A\r\nBcc: x@example.com"}, "name"),
        ({"email": "new@example.com", "name": "x" * 201}, "name"),
        ({"name": "no address"}, "email"),
    ],
)
def test_bad_contact_is_a_400_naming_the_field_and_writes_nothing(
    api: APIClient, body: dict, field: str
) -> None:
    Contact.objects.create(email="ann@example.com")
    response = api.post("/api/v1/contacts", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"], response.json()
    assert Contact.objects.count() == 1


def test_contacts_are_listed_newest_first_by_cursor_and_filtered(api: APIClient) -> None:
    news = ContactList.objects.create(name="news")
    contacts = [Contact.objects.create(email=f"c{i}@example.com") for i in range(5)]
    ListMembership.objects.create(contact_list=news, contact=contacts[1])
    ListMembership.objects.create(contact_list=news, contact=contacts[3])
    Contact.objects.filter(pk=contacts[3].pk).update(status=Contact.Status.BOUNCED)

    first = api.get("/api/v1/contacts", {"page_size": 3}).json()
    assert [c["email"] for c in first["results"]] == ["c4@example.com", "c3@example.com", "c2@example.com"]
    second = api.get(first["next"]).json()
    assert [c["email"] for c in second["results"]] == ["c1@example.com", "c0@example.com"]

    def emails(**params: object) -> list[str]:
        return [c["email"] for c in api.get("/api/v1/contacts", params).json()["results"]]

    assert emails(email="C2@Example.com") == ["c2@example.com"]
    assert emails(list=news.pk) == ["c3@example.com", "c1@example.com"]
    assert emails(list=news.pk, status="active") == ["c1@example.com"]
    assert emails(list=news.pk + 1000) == []


@pytest.mark.parametrize(("params", "field"), [({"list": "news"}, "list"), ({"status": "asleep"}, "status")])
def test_bad_contact_filter_is_a_400_naming_it(api: APIClient, params: dict, field: str) -> None:
    response = api.get("/api/v1/contacts", params)
    assert response.status_code == 400 and field in response.json()["error"]["fields"]


def test_contact_is_read_patched_and_deleted_with_its_memberships(api: APIClient) -> None:
    contact = Contact.objects.create(email="ann@example.com", attributes={"plan": "gold"})
    Contact.objects.create(email="bob@example.com")
    ListMembership.objects.create(contact_list=ContactList.objects.create(name="l"), contact=contact)
    url = f"/api/v1/contacts/{contact.pk}"
    assert api.get(url).json()["email"] == "ann@example.com"
    patched = api.patch(
        url, {"name": "Ann", "timezone": "Europe/Paris", "status": "unsubscribed"}, format="json"
    )
    assert patched.status_code == 200
    contact.refresh_from_db()
    assert (contact.name, contact.timezone, contact.status) == ("Ann", "Europe/Paris", "unsubscribed")
    assert contact.attributes == {"plan": "gold"}
    assert api.patch(url, {"email": "BOB@example.com"}, format="json").json()["error"]["fields"].keys() == {
        "email"
    }
    assert api.patch(url, {"email": "ANN@example.com"}, format="json").status_code == 200  # its own
    assert api.put(url, {"email": "x@example.com"}, format="json").status_code == 405
    assert api.delete(url).status_code == 204
    # Erased by anonymising, never removed (campaigns.erasure; tests/test_erasure.py).
    assert Contact.objects.get(pk=contact.pk).email == f"erased-{contact.pk}@invalid"
    assert ListMembership.objects.count() == 0


# --- lists --------------------------------------------------------------------------------------


def test_list_is_created_with_a_unique_name_and_shows_its_member_count(api: APIClient) -> None:
    created = api.post("/api/v1/lists", {"name": "news", "description": "weekly"}, format="json")
    assert created.status_code == 201 and created.json()["member_count"] == 0
    list_id = created.json()["id"]
    duplicate = api.post("/api/v1/lists", {"name": "news"}, format="json")
    assert duplicate.status_code == 400 and "name" in duplicate.json()["error"]["fields"]
    assert api.post("/api/v1/lists", {"name": ""}, format="json").json()["error"]["fields"].keys() == {"name"}
    ids = [Contact.objects.create(email=f"c{i}@example.com").pk for i in range(3)]
    added = api.post(f"/api/v1/lists/{list_id}/members", {"contact_ids": ids + ids[:1]}, format="json")
    assert added.json() == {"added": 3, "member_count": 3}
    again = api.post(f"/api/v1/lists/{list_id}/members", {"contact_ids": ids[:2]}, format="json")
    assert again.json() == {"added": 0, "member_count": 3}
    assert api.get(f"/api/v1/lists/{list_id}").json()["member_count"] == 3
    assert [row["member_count"] for row in api.get("/api/v1/lists").json()["results"]] == [3]
    removed = api.delete(
        f"/api/v1/lists/{list_id}/members", {"contact_ids": [ids[0], 999_999]}, format="json"
    )
    assert removed.json() == {"removed": 1, "member_count": 2}
    renamed = api.patch(f"/api/v1/lists/{list_id}", {"name": "weekly"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["member_count"] == 2
    assert Contact.objects.count() == 3  # removing members never deletes contacts


def test_adding_unknown_contact_ids_is_a_400_and_adds_nothing(api: APIClient) -> None:
    news = ContactList.objects.create(name="news")
    known = Contact.objects.create(email="a@example.com").pk
    for body in ({"contact_ids": [known, 999_999]}, {"contact_ids": []}, {"contact_ids": ["x"]}, {}):
        response = api.post(f"/api/v1/lists/{news.pk}/members", body, format="json")
        assert response.status_code == 400 and "contact_ids" in response.json()["error"]["fields"], body
    assert ListMembership.objects.count() == 0


def test_list_used_by_a_campaign_cannot_be_deleted_until_the_campaign_is_gone(api: APIClient) -> None:
    news = ContactList.objects.create(name="news")
    template = Template.objects.create(name="welcome", subject="Hi", text="Hello")
    campaign = Campaign.objects.create(name="Spring", template=template, contact_list=news)
    response = api.delete(f"/api/v1/lists/{news.pk}")
    assert response.status_code == 409
    message = response.json()["error"]["message"]
    assert "Spring" in message and "point them at another list" in message
    assert ContactList.objects.filter(pk=news.pk).exists()
    campaign.delete()
    ListMembership.objects.create(contact_list=news, contact=Contact.objects.create(email="a@example.com"))
    assert api.delete(f"/api/v1/lists/{news.pk}").status_code == 204
    assert ListMembership.objects.count() == 0 and Contact.objects.count() == 1


# --- suppressions -------------------------------------------------------------------------------


def test_suppression_is_added_listed_filtered_and_deleted(api: APIClient) -> None:
    created = api.post(
        "/api/v1/suppressions",
        {"email": "Ann@Example.com", "reason": "complained", "detail": "FBL"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert (created.json()["email"], created.json()["reason"]) == ("ann@example.com", "complained")
    api.post("/api/v1/suppressions", {"email": "bob@example.com", "reason": "manual"}, format="json")
    listed = api.get("/api/v1/suppressions").json()["results"]
    assert [s["email"] for s in listed] == ["bob@example.com", "ann@example.com"]
    assert [
        s["email"] for s in api.get("/api/v1/suppressions", {"reason": "complained"}).json()["results"]
    ] == ["ann@example.com"]
    assert len(api.get("/api/v1/suppressions", {"email": "ANN@example.com"}).json()["results"]) == 1
    assert api.delete(f"/api/v1/suppressions/{created.json()['id']}").status_code == 204
    assert list(Suppression.objects.values_list("email", flat=True)) == ["bob@example.com"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "BOB@example.com", "reason": "manual"}, "email"),  # suppressed already
        ({"email": "nope", "reason": "manual"}, "email"),
        ({"email": "new@example.com", "reason": "bored"}, "reason"),
        ({"email": "new@example.com"}, "reason"),
        ({"email": "new@example.com", "reason": "manual", "detail": "x" * 2001}, "detail"),
    ],
)
def test_bad_suppression_is_a_400_naming_the_field(api: APIClient, body: dict, field: str) -> None:
    Suppression.objects.create(email="bob@example.com", reason="bounced")
    response = api.post("/api/v1/suppressions", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"], response.json()
    assert Suppression.objects.count() == 1


# --- ids and authentication ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/contacts/999999"),
        ("patch", "/api/v1/contacts/999999"),
        ("delete", "/api/v1/contacts/999999"),
        ("get", "/api/v1/lists/999999"),
        ("patch", "/api/v1/lists/999999"),
        ("delete", "/api/v1/lists/999999"),
        ("post", "/api/v1/lists/999999/members"),
        ("delete", "/api/v1/lists/999999/members"),
        ("delete", "/api/v1/suppressions/999999"),
    ],
)
def test_unknown_id_is_404(api: APIClient, method: str, url: str) -> None:
    response = getattr(api, method)(url, {"contact_ids": [1], "name": "x"}, format="json")
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/contacts"),
        ("post", "/api/v1/contacts"),
        ("get", "/api/v1/contacts/1"),
        ("post", "/api/v1/contacts/import"),
        ("get", "/api/v1/lists"),
        ("delete", "/api/v1/lists/1"),
        ("post", "/api/v1/lists/1/members"),
        ("get", "/api/v1/suppressions"),
        ("delete", "/api/v1/suppressions/1"),
    ],
)
def test_every_contact_endpoint_needs_an_api_key(method: str, url: str) -> None:
    assert getattr(APIClient(), method)(url, {}, format="json").status_code == 401


def test_contact_endpoints_are_in_the_openapi_schema(api: APIClient) -> None:
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    for route in ("/api/v1/contacts/import", "/api/v1/lists/{id}/members", "/api/v1/suppressions/{id}"):
        assert route in schema
