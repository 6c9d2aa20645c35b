from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.models import Campaign, Template
from core.models import OutboxTask
from tests.factories import make_audience


@pytest.fixture
def template(db) -> Template:  # noqa: ANN001
    return Template.objects.create(
        name="welcome", subject='Hi {{ first_name|default:"there" }}', text="Plan {{ plan }}"
    )


def create(api: APIClient, template_: Template, **fields: object):  # noqa: ANN201
    audience = make_audience(3)
    body = {"name": "Spring", "template": template_.name, "contact_list": audience.pk, **fields}
    return api.post("/api/v1/campaigns", body, format="json")


def test_template_with_a_bad_placeholder_is_refused_naming_the_field(api: APIClient) -> None:
    response = api.post(
        "/api/v1/templates",
        {"name": "t", "subject": "ok", "html": "<p>{{ user.__class__ }}</p>"},
        format="json",
    )
    assert response.status_code == 400 and "html" in response.json()["error"]["fields"]
    assert "line 1" in response.json()["error"]["fields"]["html"][0]
    assert not Template.objects.exists()


def test_template_subject_with_a_line_break_is_refused(api: APIClient) -> None:
    response = api.post("/api/v1/templates", {"name": "t", "subject": "a\nBcc: x"}, format="json")
    assert response.status_code == 400 and "subject" in response.json()["error"]["fields"]


def test_template_preview_renders_for_a_contact_and_a_context(api: APIClient, template: Template) -> None:
    audience = make_audience(1)
    contact = audience.contacts.get()
    preview = api.post(
        f"/api/v1/templates/{template.pk}/preview",
        {"contact": contact.pk, "context": {"plan": "Pro"}},
        format="json",
    )
    assert preview.json() == {"subject": "Hi Name1", "html": "", "text": "Plan Pro"}
    assert (
        api.post(f"/api/v1/templates/{template.pk}/preview", {"contact": 999999}, format="json").status_code
        == 400
    )


def test_create_then_schedule_immediately_starts_fan_out(
    api: APIClient, template: Template, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    campaign = create(api, template)
    assert campaign.status_code == 201, campaign.json()
    assert campaign.json()["status"] == "draft" and campaign.json()["progress"]["total"] == 0
    response = api.post(
        f"/api/v1/campaigns/{campaign.json()['id']}/schedule", {"type": "immediate"}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "sending"
    assert OutboxTask.objects.filter(kind="fan_out", payload__campaign_id=campaign.json()["id"]).count() == 1


def test_schedule_at_a_future_instant_waits(api: APIClient, template: Template) -> None:
    campaign_id = create(api, template).json()["id"]
    at = f"{(timezone.now() + timedelta(days=30)).date()}T09:00:00Z"  # within the horizon
    response = api.post(
        f"/api/v1/campaigns/{campaign_id}/schedule", {"type": "at", "scheduled_at": at}, format="json"
    )
    assert response.json()["status"] == "scheduled" and response.json()["scheduled_at"] == at
    assert not OutboxTask.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "weekly"}, "type"),
        ({"type": "at"}, "scheduled_at"),
        ({"type": "local_time"}, "local_date"),
        ({"type": "optimized", "window_hours": 0}, "window_hours"),
    ],
)
def test_bad_schedule_is_a_400_and_changes_nothing(
    api: APIClient, template: Template, body: dict, field: str
) -> None:
    campaign_id = create(api, template).json()["id"]
    response = api.post(f"/api/v1/campaigns/{campaign_id}/schedule", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert Campaign.objects.get(pk=campaign_id).status == "draft"


def test_actions_from_the_wrong_state_are_409_and_unknown_ids_404(api: APIClient, template: Template) -> None:
    campaign_id = create(api, template).json()["id"]
    response = api.post(f"/api/v1/campaigns/{campaign_id}/pause", format="json")
    assert response.status_code == 409 and "draft" in response.json()["error"]["message"]
    assert api.post("/api/v1/campaigns/999999/cancel", format="json").status_code == 404
    assert api.post(f"/api/v1/campaigns/{campaign_id}/cancel", format="json").json()["status"] == "cancelled"
    assert api.patch(f"/api/v1/campaigns/{campaign_id}", {"name": "x"}, format="json").status_code == 409


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"template": "nope"}, "template"),
        ({"contact_list": 999999}, "contact_list"),
        ({"priority": "urgent"}, "priority"),
        ({"from_email": "a@b.c\r\nBcc: x"}, "from_email"),
    ],
)
def test_bad_campaign_fields_are_a_400(api: APIClient, template: Template, fields: dict, field: str) -> None:
    response = create(api, template, **fields)
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert not Campaign.objects.exists()


def test_campaign_detail_shows_progress(api: APIClient, template: Template) -> None:
    campaign_id = create(api, template).json()["id"]
    Campaign.objects.filter(pk=campaign_id).update(
        total_count=10, sent_count=6, failed_count=1, suppressed_count=1, fanout_done=True, status="sending"
    )
    progress = api.get(f"/api/v1/campaigns/{campaign_id}").json()["progress"]
    assert progress == {
        "total": 10,
        "queued": 2,
        "sent": 6,
        "failed": 1,
        "suppressed": 1,
        "cancelled": 0,
        "excluded": 0,
        "fanout_done": True,
        "percent_done": 80.0,
    }


@pytest.mark.parametrize("body", [{"contact": "abc"}, {"context": ["x"]}, ["not", "an", "object"]])
def test_template_preview_with_bad_input_is_a_400(api: APIClient, template: Template, body: object) -> None:
    assert api.post(f"/api/v1/templates/{template.pk}/preview", body, format="json").status_code == 400


def test_campaign_from_must_be_a_valid_sender(api: APIClient, template: Template) -> None:
    response = create(api, template, from_email="not an address")
    assert response.status_code == 400 and "from_email" in response.json()["error"]["fields"]


@pytest.mark.django_db(transaction=True)
def test_campaign_mail_goes_out_from_the_campaign_sender(smtp, template: Template) -> None:  # noqa: ANN001
    from campaigns import fanout, lifecycle
    from delivery.services.sending import send_messages
    from tests.broker import queued_tasks

    campaign = Campaign.objects.create(
        name="c", template=template, contact_list=make_audience(1), from_email="Shop <shop@example.com>"
    )
    lifecycle.schedule(campaign.pk, "immediate")
    fanout.fan_out(campaign.pk)
    import redis as redis_lib
    from django.conf import settings

    [(_, [batch])] = [t for t in queued_tasks(redis_lib.Redis.from_url(settings.REDIS_URL), "normal")]
    send_messages(batch)
    [received] = smtp.wait_for(1)
    assert received.parsed()["From"] == "Shop <shop@example.com>" and received.mail_from == "shop@example.com"
