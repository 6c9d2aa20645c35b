"""Limits every peer has (issue 18, item 15): a scheduling horizon for every future instant a
client can give, and key-count and size limits for a message's `context` and a contact's
`attributes`, each a 400 naming the limit in the error's `limit` member, writing nothing; the
admin's JSON field and the CSV import apply the same limits."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.import_jobs import run_import_job
from campaigns.models import Campaign, Contact, ImportIssue
from core.limits import beyond_horizon
from core.models import OutboxTask
from delivery.models import Message
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db

VALID = {"to": "ann@example.com", "subject": "Your code", "text": "123456"}
HORIZON = {"name": "EMAILHUB_SCHEDULE_HORIZON_DAYS", "value": 365}


def limit_error(response: Any, field: str, limit: dict[str, Any]) -> dict[str, Any]:
    """The 400 of a hit limit: `code` limit_exceeded, the field named, the limit in `limit`."""
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded" and error["limit"] == limit, error
    assert field in _flat_fields(error["fields"]), error
    return error


def _flat_fields(fields: dict[str, Any], prefix: str = "") -> set[str]:
    names = set()
    for name, value in fields.items():
        names.add(prefix + name)
        if isinstance(value, dict):
            names |= _flat_fields(value, f"{prefix}{name}.")
    return names


def iso(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


# --- the scheduling horizon -------------------------------------------------------------------


def test_the_horizon_is_inclusive_and_read_against_the_given_clock() -> None:
    now = datetime(2030, 1, 1, 12, tzinfo=UTC)
    assert beyond_horizon(now + timedelta(days=365), now=now) is None
    refusal = beyond_horizon(now + timedelta(days=365, microseconds=1), now=now)
    assert refusal is not None and "365 days" in refusal and "EMAILHUB_SCHEDULE_HORIZON_DAYS" in refusal


@pytest.mark.parametrize("send_at", ["9999-12-31T23:59:59Z", "later"])
def test_a_message_send_at_beyond_the_horizon_is_a_400_naming_it(api: APIClient, send_at: str) -> None:
    if send_at == "later":
        send_at = iso(timezone.now() + timedelta(days=400))
    limit_error(
        api.post("/api/v1/messages", {**VALID, "send_at": send_at}, format="json"), "send_at", HORIZON
    )
    assert not Message.objects.exists() and not OutboxTask.objects.exists()
    within = api.post(
        "/api/v1/messages", {**VALID, "send_at": iso(timezone.now() + timedelta(days=300))}, format="json"
    )
    assert within.status_code == 202 and within.json()["status"] == "scheduled"


def test_a_batch_item_beyond_the_horizon_is_refused_by_index_in_both_modes(api: APIClient) -> None:
    far = {**VALID, "send_at": "9999-12-31T23:59:59Z"}
    whole = api.post("/api/v1/messages/batch", {"messages": [VALID, far]}, format="json")
    limit_error(whole, "messages.1.send_at", HORIZON)
    assert not Message.objects.exists()
    partial = api.post("/api/v1/messages/batch", {"messages": [VALID, far], "partial": True}, format="json")
    assert partial.status_code == 202 and partial.json()["accepted"] == 1
    error = partial.json()["results"][1]["error"]
    assert error["code"] == "limit_exceeded" and error["limit"] == HORIZON and "send_at" in error["fields"]


@pytest.fixture
def draft(db: Any) -> Campaign:  # noqa: ARG001 — the database
    return make_campaign(make_audience(2))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "at", "scheduled_at": "9999-12-31T23:59:59Z"}, "scheduled_at"),
        ({"type": "local_time", "local_date": "9000-01-01", "local_time": "09:00"}, "local_date"),
        ({"type": "optimized", "window_start": "9999-01-01T00:00:00Z"}, "window_start"),
    ],
)
def test_a_campaign_schedule_beyond_the_horizon_is_a_400_naming_it_and_changes_nothing(
    api: APIClient, draft: Campaign, body: dict[str, Any], field: str
) -> None:
    limit_error(api.post(f"/api/v1/campaigns/{draft.pk}/schedule", body, format="json"), field, HORIZON)
    draft.refresh_from_db()
    assert draft.status == "draft" and not Message.objects.exists()


def test_a_campaign_at_within_the_horizon_is_scheduled(api: APIClient, draft: Campaign) -> None:
    at = iso(timezone.now() + timedelta(days=300))
    response = api.post(
        f"/api/v1/campaigns/{draft.pk}/schedule", {"type": "at", "scheduled_at": at}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "scheduled"


def test_the_horizon_follows_its_setting(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_SCHEDULE_HORIZON_DAYS = 7
    send_at = iso(timezone.now() + timedelta(days=8))
    limit_error(
        api.post("/api/v1/messages", {**VALID, "send_at": send_at}, format="json"),
        "send_at",
        {"name": "EMAILHUB_SCHEDULE_HORIZON_DAYS", "value": 7},
    )


# --- context and attributes ------------------------------------------------------------------

CONTEXT_KEYS = {"name": "EMAILHUB_CONTEXT_MAX_KEYS", "value": 1000}
CONTEXT_BYTES = {"name": "EMAILHUB_CONTEXT_MAX_BYTES", "value": 65536}
ATTRIBUTES_KEYS = {"name": "EMAILHUB_ATTRIBUTES_MAX_KEYS", "value": 1000}
ATTRIBUTES_BYTES = {"name": "EMAILHUB_ATTRIBUTES_MAX_BYTES", "value": 65536}


def many_keys(count: int) -> dict[str, int]:
    return {f"k{i}": i for i in range(count)}


def test_a_context_with_10000_keys_is_refused_naming_the_key_limit(api: APIClient) -> None:
    body = {"to": "ann@example.com", "subject": "s", "text": "t", "context": many_keys(10_000)}
    error = limit_error(api.post("/api/v1/messages", body, format="json"), "context", CONTEXT_KEYS)
    assert "10000 keys" in error["fields"]["context"][0]
    assert not Message.objects.exists()
    at_limit = api.post("/api/v1/messages", {**body, "context": many_keys(1000)}, format="json")
    assert at_limit.status_code == 202


def test_a_context_larger_than_its_size_limit_is_refused_naming_it(api: APIClient) -> None:
    body = {**VALID, "context": {"blob": "x" * 70_000}}
    limit_error(api.post("/api/v1/messages", body, format="json"), "context", CONTEXT_BYTES)
    batch = api.post("/api/v1/messages/batch", {"messages": [body]}, format="json")
    limit_error(batch, "messages.0.context", CONTEXT_BYTES)
    assert not Message.objects.exists()


def test_the_size_limit_counts_the_stored_utf8_bytes(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_CONTEXT_MAX_BYTES = 1024  # the setting's minimum
    # {"k":"ééé…"}: 8 bytes of JSON around 508 two-byte characters is 1,024 bytes; one more, 1,026.
    assert (
        api.post("/api/v1/messages", {**VALID, "context": {"k": "é" * 508}}, format="json").status_code == 202
    )
    limit_error(
        api.post("/api/v1/messages", {**VALID, "context": {"k": "é" * 509}}, format="json"),
        "context",
        {"name": "EMAILHUB_CONTEXT_MAX_BYTES", "value": 1024},
    )


def test_a_template_preview_context_has_the_same_limits(api: APIClient, draft: Campaign) -> None:
    url = f"/api/v1/templates/{draft.template_id}/preview"
    limit_error(api.post(url, {"context": many_keys(1001)}, format="json"), "context", CONTEXT_KEYS)


def test_contact_attributes_over_their_limits_are_refused_on_create_and_update(api: APIClient) -> None:
    body = {"email": "ann@example.com", "attributes": many_keys(1001)}
    limit_error(api.post("/api/v1/contacts", body, format="json"), "attributes", ATTRIBUTES_KEYS)
    assert not Contact.objects.exists()
    created = api.post(
        "/api/v1/contacts", {"email": "ann@example.com", "attributes": {"plan": "gold"}}, format="json"
    )
    assert created.status_code == 201
    url = f"/api/v1/contacts/{created.json()['id']}"
    limit_error(
        api.patch(url, {"attributes": {"bio": "x" * 70_000}}, format="json"), "attributes", ATTRIBUTES_BYTES
    )
    assert Contact.objects.get().attributes == {"plan": "gold"}


def test_the_admin_contact_form_applies_the_attribute_limits(admin_client: Client, settings: Any) -> None:
    settings.EMAILHUB_ATTRIBUTES_MAX_KEYS = 2
    form = {"email": "ann@example.com", "name": "", "timezone": "UTC", "attributes": json.dumps(many_keys(3))}
    response = admin_client.post("/admin/campaigns/contact/add/", form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["attributes"]
    assert "EMAILHUB_ATTRIBUTES_MAX_KEYS" in errors[0]
    assert not Contact.objects.exists()


def test_a_csv_import_applies_the_attribute_limits(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_ATTRIBUTES_MAX_KEYS = 2
    wide = b"email,a,b,c\nann@example.com,1,2,3\n"
    response = api.post(
        "/api/v1/contacts/import",
        {"file": SimpleUploadedFile("contacts.csv", wide, content_type="text/csv")},
        format="multipart",
    )
    assert (
        response.status_code == 400
        and "EMAILHUB_ATTRIBUTES_MAX_KEYS" in response.json()["error"]["fields"]["file"][0]
    )

    settings.EMAILHUB_ATTRIBUTES_MAX_BYTES = 1024
    data = b"email,a,b\nann@example.com,short,x\nbob@example.com," + b"y" * 1100 + b",x\n"
    job = api.post(
        "/api/v1/contacts/import",
        {"file": SimpleUploadedFile("contacts.csv", data, content_type="text/csv")},
        format="multipart",
    ).json()
    run_import_job(job["id"])
    assert list(Contact.objects.values_list("email", flat=True)) == ["ann@example.com"]
    (issue,) = ImportIssue.objects.filter(job_id=job["id"], kind=ImportIssue.Kind.REJECTED)
    assert issue.line == 3 and "EMAILHUB_ATTRIBUTES_MAX_BYTES" in issue.reason
