"""Attachments (issue 21, part 4): refused with a 400 or 413 naming the field or the limit and
storing nothing; each distinct content stored once however many messages attach it; shown
without their content; sent as MIME through SMTP and SES and as SendGrid's `attachments`, each
file's bytes received unchanged (the real clients against the local servers)."""

from __future__ import annotations

import base64
import hashlib
import os
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import pytest
from rest_framework.test import APIClient

from campaigns import fanout
from core.models import OutboxTask
from delivery.attachments import BLOCKED_EXTENSIONS
from delivery.models import AttachmentContent, Message
from delivery.providers.base import Attachment, OutgoingEmail
from delivery.providers.mime import render
from delivery.services.sending import by_attachment_bytes, send_messages
from delivery.services.transitions import claim
from delivery.testing.sendgrid_server import SendGridTestServer
from delivery.testing.ses_server import SESTestServer
from delivery.testing.smtp_server import SMTPTestServer
from tests import factories

pytestmark = pytest.mark.django_db

# Bytes no text transfer would leave alone: every byte value, CR and LF among them.
PDF = b"%PDF-1.4\r\n" + bytes(range(256)) * 40 + b"\n%%EOF\r\n"
LOGO = b"\x89PNG\r\n\x1a\n" + bytes(reversed(range(256))) * 3


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def file(filename: str = "receipt.pdf", data: bytes = PDF, **fields: Any) -> dict[str, Any]:
    return {"filename": filename, "content_type": "application/pdf", "content": b64(data), **fields}


LOGO_FILE = {"filename": "logo.png", "content_type": "image/png", "content": b64(LOGO), "content_id": "logo"}
VALID = {
    "to": "ann@example.com",
    "subject": "Your receipt",
    "text": "Attached.",
    "html": '<p>Attached.</p><img src="cid:logo">',
    "priority": "high",
}
NAMES = "Rechnung für Müller — März 2026 (Kopie) — with a name long enough for RFC 2231 pieces.pdf"


def post(api: APIClient, body: dict[str, Any]) -> Any:
    return api.post("/api/v1/messages", body, format="json")


def nothing_stored() -> bool:
    return (
        Message.objects.count() == 0
        and OutboxTask.objects.count() == 0
        and not AttachmentContent.objects.exists()
    )


# --- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attachment", "field"),
    [
        (file(content="not base64!"), "content"),
        (file(content="QUJD\nREVG"), "content"),  # a line break: one line only
        (file(content="QUJ"), "content"),  # unpadded
        (file(content="QUJDé==="), "content"),  # non-ASCII
        (file(content=""), "content"),
        (file(content=5), "content"),
        (file(filename=""), "filename"),
        (file(filename="../../etc/passwd"), "filename"),
        (file(filename="C:\\Users\\a.pdf"), "filename"),
        (file(filename="a\r\nBcc: spy@example.com.pdf"), "filename"),
        (file(filename="tab\there.pdf"), "filename"),
        (file(filename="x" * 252 + ".pdf"), "filename"),
        (file(filename=". ."), "filename"),
        (file(filename=["a.pdf"]), "filename"),
        (file(filename="invoice.EXE"), "filename"),
        (file(filename="invoice.pdf.js"), "filename"),
        (file(filename="setup.msi. . "), "filename"),  # Windows drops trailing dots and spaces
        (file(content_type="pdf"), "content_type"),
        (file(content_type="multipart/mixed"), "content_type"),
        (file(content_type="text/plain; charset=utf-8"), "content_type"),
        (file(content_id="<logo>"), "content_id"),
        (file(content_id=""), "content_id"),
        (file(size=3), "size"),  # an unknown key: a typo must not pass
        ({"filename": "a.pdf", "content_type": "application/pdf"}, "content"),
    ],
)
def test_a_bad_attachment_is_a_400_naming_its_field_and_stores_nothing(
    api: APIClient, attachment: dict[str, Any], field: str
) -> None:
    response = post(api, {**VALID, "attachments": [file("ok.pdf"), attachment]})
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert list(fields) == ["attachments"] and list(fields["attachments"]) == ["1"], fields
    assert list(fields["attachments"]["1"]) == [field], fields
    assert nothing_stored()


@pytest.mark.parametrize("extension", sorted(BLOCKED_EXTENSIONS))
def test_every_type_gmail_blocks_is_refused_naming_the_attachment(api: APIClient, extension: str) -> None:
    response = post(api, {**VALID, "attachments": [file(), file(), file(f"tool.{extension}")]})
    assert response.status_code == 400
    [why] = response.json()["error"]["fields"]["attachments"]["2"]["filename"]
    assert f".{extension}" in why and "executable" in why
    assert nothing_stored()


def test_attachments_must_be_a_list_of_objects(api: APIClient) -> None:
    for value, says in ((file(), "must be an array"), (["a.pdf"], "must be an object")):
        response = post(api, {**VALID, "attachments": value})
        assert response.status_code == 400 and says in str(response.json()["error"]["fields"]["attachments"])
    assert nothing_stored()


def test_two_inline_images_with_one_content_id_are_refused(api: APIClient) -> None:
    response = post(api, {**VALID, "attachments": [LOGO_FILE, file(), {**LOGO_FILE, "filename": "b.png"}]})
    assert response.status_code == 400
    assert "repeats attachment 0" in str(response.json()["error"]["fields"]["attachments"]["2"]["content_id"])
    assert nothing_stored()


def test_more_attachments_than_the_setting_is_a_400_naming_it(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_ATTACHMENTS_MAX_COUNT = 2
    response = post(api, {**VALID, "attachments": [file("a.pdf"), file("b.pdf"), file("c.pdf")]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["limit"] == {"name": "EMAILHUB_ATTACHMENTS_MAX_COUNT", "value": 2}
    assert list(error["fields"]) == ["attachments"]
    assert nothing_stored()


def test_attachments_larger_in_all_than_the_setting_are_a_413_naming_it(api: APIClient, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_ATTACHMENTS_MAX_BYTES = len(PDF) * 2 - 1  # decoded bytes count, not base64
    response = post(api, {**VALID, "attachments": [file("a.pdf"), file("b.pdf")]})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["limit"] == {"name": "EMAILHUB_ATTACHMENTS_MAX_BYTES", "value": len(PDF) * 2 - 1}
    assert f"{len(PDF) * 2} bytes decoded" in error["message"]
    assert nothing_stored()
    settings.EMAILHUB_ATTACHMENTS_MAX_BYTES = len(PDF) * 2  # the limit itself is accepted
    assert post(api, {**VALID, "attachments": [file("a.pdf"), file("b.pdf")]}).status_code == 202


def test_a_batch_item_with_a_bad_attachment_is_refused_by_its_index(api: APIClient) -> None:
    items = [{**VALID, "attachments": [file()]}, {**VALID, "attachments": [file(), file("run.bat")]}]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code == 400
    assert "executable" in str(
        response.json()["error"]["fields"]["messages"]["1"]["attachments"]["1"]["filename"]
    )
    assert nothing_stored()


def test_a_batch_item_with_too_large_attachments_is_a_413_naming_the_item_and_the_limit(
    api: APIClient,
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_ATTACHMENTS_MAX_BYTES = len(PDF)
    items = [{**VALID, "attachments": [file()]}, {**VALID, "attachments": [file(), file("b.pdf")]}]
    response = api.post("/api/v1/messages/batch", {"messages": items, "partial": True}, format="json")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["limit"]["name"] == "EMAILHUB_ATTACHMENTS_MAX_BYTES" and error["message"].startswith(
        "messages.1:"
    )
    assert nothing_stored()


# --- stored once, shown without content ---------------------------------------------------------


def test_a_batch_of_1000_with_the_same_pdf_stores_it_once(api: APIClient) -> None:
    items = [
        {**VALID, "to": f"u{n}@example.com", "priority": "normal", "attachments": [file()]}
        for n in range(1000)
    ]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code == 202 and response.json()["accepted"] == 1000
    [stored] = AttachmentContent.objects.all()
    assert stored.sha256 == hashlib.sha256(PDF).hexdigest() and bytes(stored.content) == PDF
    assert stored.size == len(PDF)
    described = {"filename": "receipt.pdf", "content_type": "application/pdf", "size": len(PDF),
                 "sha256": stored.sha256, "content_id": None}  # fmt: skip
    assert list(Message.objects.values_list("attachments", flat=True)) == [[described]] * 1000
    # Another message with the same file later: still one row.
    assert post(api, {**VALID, "attachments": [file("copy.pdf")]}).status_code == 202
    assert AttachmentContent.objects.count() == 1


def test_a_message_shows_its_attachments_metadata_never_their_content(api: APIClient) -> None:
    response = post(api, {**VALID, "attachments": [file(NAMES), LOGO_FILE]})
    assert response.status_code == 202, response.json()
    shown = api.get(f"/api/v1/messages/{response.json()['id']}").json()
    assert shown["attachments"] == response.json()["attachments"] == [
        {"filename": NAMES, "content_type": "application/pdf", "size": len(PDF),
         "sha256": hashlib.sha256(PDF).hexdigest(), "content_id": None},
        {"filename": "logo.png", "content_type": "image/png", "size": len(LOGO),
         "sha256": hashlib.sha256(LOGO).hexdigest(), "content_id": "logo"},
    ]  # fmt: skip
    assert b64(PDF) not in str(shown)
    without = post(api, VALID).json()
    assert without["attachments"] == [] and Message.objects.get(pk=without["id"]).attachments is None


def test_campaign_messages_carry_no_attachments() -> None:
    campaign = factories.sending_campaign(factories.make_audience(3, prefix="att-"))
    fanout.fan_out(campaign.pk)
    assert list(Message.objects.filter(campaign=campaign).values_list("attachments", flat=True)) == [None] * 3


# --- MIME ---------------------------------------------------------------------------------------


def attachment(filename: str, content_type: str, data: bytes, content_id: str | None = None) -> Attachment:
    return Attachment(filename, content_type, data, hashlib.sha256(data).hexdigest(), content_id)


def outgoing(*files: Attachment, html: str = VALID["html"]) -> OutgoingEmail:
    return OutgoingEmail(
        7, "ann@example.com", "shop@example.com", "Receipt", "Attached.", html, attachments=files
    )


def tree(part: EmailMessage) -> Any:
    if part.is_multipart():
        return (part.get_content_type(), [tree(inner) for inner in part.iter_parts()])
    return part.get_content_type()


def test_mime_nests_mixed_alternative_and_related_with_76_character_base64_lines() -> None:
    files = (attachment(NAMES, "application/pdf", PDF), attachment("logo.png", "image/png", LOGO, "logo"))
    _, data = render(outgoing(*files), message_id_domain="example.com")
    parsed = message_from_bytes(data, policy=policy.default)
    assert tree(parsed) == (
        "multipart/mixed",
        [
            ("multipart/alternative", ["text/plain", ("multipart/related", ["text/html", "image/png"])]),
            "application/pdf",
        ],
    )
    assert all(not part.defects for part in parsed.walk())
    [pdf] = parsed.iter_attachments()
    assert pdf.get_filename() == NAMES and pdf.get_content() == PDF
    assert pdf.get_content_disposition() == "attachment"
    [logo] = [part for part in parsed.walk() if part.get("Content-ID")]
    assert logo["Content-ID"] == "<logo>" and logo.get_content_disposition() == "inline"
    assert logo.get_content() == LOGO
    assert max(len(line) for line in data.split(b"\r\n")) <= 78
    base64_lines = [line for line in data.split(b"\r\n") if len(line) == 76]
    assert len(base64_lines) > len(PDF) * 4 // 3 // 76 - 1  # the PDF's lines are all full ones


def test_mime_without_html_puts_the_text_and_files_in_a_mixed() -> None:
    _, data = render(
        outgoing(attachment("a.csv", "text/csv", b"a,b\r\n1,2\r\n"), html=""), message_id_domain="x.org"
    )
    parsed = message_from_bytes(data, policy=policy.default)
    assert tree(parsed) == ("multipart/mixed", ["text/plain", "text/csv"])
    [csv] = parsed.iter_attachments()
    assert (
        csv.get_content().encode() == b"a,b\r\n1,2\r\n" or csv.get_payload(decode=True) == b"a,b\r\n1,2\r\n"
    )


# --- through every provider ---------------------------------------------------------------------


def accept_and_send(api: APIClient, count: int = 1) -> list[int]:
    items = [
        {**VALID, "to": f"r{n}@example.com", "attachments": [file(NAMES), LOGO_FILE]} for n in range(count)
    ]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert response.status_code == 202, response.json()
    ids = [result["id"] for result in response.json()["results"]]
    assert send_messages(ids).sent == count
    return ids


def received_files(parsed: EmailMessage) -> list[tuple[str | None, str, str | None, bytes]]:
    """(filename, type, Content-ID, bytes) of each non-text part, in order."""
    return [
        (part.get_filename(), part.get_content_type(), part.get("Content-ID"), part.get_payload(decode=True))
        for part in parsed.walk()
        if not part.is_multipart() and part.get_content_maintype() != "text"
    ]


SENT = [(NAMES, "application/pdf", None, PDF), ("logo.png", "image/png", "<logo>", LOGO)]


def in_mime_order(files: list[tuple[str | None, str, str | None, bytes]]) -> list[Any]:
    return sorted(files, key=lambda f: f[2] is None)  # the inline image sits with the HTML, first


def test_attachments_reach_the_smtp_server_byte_for_byte(
    api: APIClient, through: Any, smtp: SMTPTestServer
) -> None:
    through("smtp")
    accept_and_send(api)
    [received] = smtp.messages
    parsed = message_from_bytes(received.data, policy=policy.default)
    assert received_files(parsed) == in_mime_order(SENT)


def test_attachments_reach_ses_byte_for_byte_in_the_raw_mime(
    api: APIClient, through: Any, ses_server: SESTestServer
) -> None:
    through("ses")
    accept_and_send(api)
    [(_, parsed)] = ses_server.sent()
    assert received_files(parsed) == in_mime_order(SENT)


def test_attachments_reach_sendgrid_once_per_request_byte_for_byte(
    api: APIClient, through: Any, sendgrid_server: SendGridTestServer
) -> None:
    through("sendgrid")
    accept_and_send(api, count=3)
    [request] = sendgrid_server.requests  # three recipients of the same files: one request
    assert len(request["personalizations"]) == 3
    assert [entry["disposition"] for entry in request["attachments"]] == ["attachment", "inline"]
    assert {d.to: d.attachments for d in sendgrid_server.delivered} == {
        f"r{n}@example.com": (
            (NAMES, "application/pdf", "attachment", None, PDF),
            ("logo.png", "image/png", "inline", "logo", LOGO),
        )
        for n in range(3)
    }


def test_sendgrid_sends_emails_with_different_files_in_different_requests(
    api: APIClient, through: Any, sendgrid_server: SendGridTestServer
) -> None:
    through("sendgrid")
    items = [
        {**VALID, "to": f"d{n}@example.com", "attachments": [file(f"n{n}.pdf", PDF + bytes([n]))]}
        for n in range(2)
    ]
    response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
    assert send_messages([r["id"] for r in response.json()["results"]]).sent == 2
    assert sorted((d.to, d.attachments[0][0], d.attachments[0][4]) for d in sendgrid_server.delivered) == [
        (f"d{n}@example.com", f"n{n}.pdf", PDF + bytes([n])) for n in range(2)
    ]


def test_a_batch_is_sent_in_parts_bounded_by_attachment_bytes_and_each_message_once(
    settings,  # noqa: ANN001
    smtp: SMTPTestServer,
) -> None:
    """EMAILHUB_SEND_PART_BYTES: a claimed batch is composed and sent a part at a time, so a
    worker never holds a whole batch's files and MIME; every message still goes once."""
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    settings.EMAILHUB_SEND_PART_BYTES = 2 * 1024 * 1024
    api, _ = factories.api_client("send", "read")
    files = [os.urandom(700 * 1024) for _ in range(5)]  # five distinct 700 KiB files
    ids = [
        api.post(
            "/api/v1/messages",
            {"to": f"p{n}@example.com", "subject": "s", "text": "t", "priority": "high",
             "attachments": [{"filename": f"f{n}.bin", "content_type": "application/octet-stream",
                              "content": base64.b64encode(files[n]).decode()}]},
            format="json",
        ).json()["id"]
        for n in range(5)
    ]  # fmt: skip
    claimed = claim(ids)
    assert [[m.id for m in part] for part in by_attachment_bytes(claimed, 2 * 1024 * 1024)] == [
        ids[:2],
        ids[2:4],
        ids[4:],
    ]
    Message.objects.filter(pk__in=ids).update(status="queued")
    assert send_messages(ids).sent == 5
    got = {m.rcpt_tos[0]: m.parsed() for m in smtp.messages}
    for n in range(5):
        [part] = [p for p in got[f"p{n}@example.com"].iter_attachments()]
        assert part.get_content() == files[n]
    assert by_attachment_bytes([], 1) == []
