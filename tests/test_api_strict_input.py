"""A value of the wrong JSON type is a 400 naming the field, never coerced (issue 18, item 14):
`{"name": 0}` was stored as "0", `"track_clicks": 0` read as false, `"window_hours": "24"` as
24. Query parameters are text by nature; there a `page_size` that is no integer in range, or a
filter given without a value, is a 400 naming it instead of being ignored."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from campaigns.models import Campaign, Contact, ContactList, Template
from delivery.models import Message
from scheduling.models import RecurringSchedule
from tests.factories import make_audience, make_campaign

pytestmark = pytest.mark.django_db

VALID = {"to": "ann@example.com", "subject": "Your code", "text": "123456"}


@pytest.fixture
def objects(db: Any) -> dict[str, Any]:  # noqa: ARG001 — the database
    audience = make_audience(1)
    campaign = make_campaign(audience)
    return {"list": audience.pk, "contact": audience.contacts.get().pk, "campaign": campaign.pk,
            "template": campaign.template_id}  # fmt: skip


def stored() -> tuple[int, ...]:
    return (
        Message.objects.count(),
        ContactList.objects.count(),
        Contact.objects.count(),
        Template.objects.count(),
        Campaign.objects.count(),
        RecurringSchedule.objects.count(),
    )


# (url, body, the field the 400 must name, what it must say); `{list}`-style names are filled in.
WRONG_TYPES = [
    ("/api/v1/lists", {"name": 0}, "name", "must be a string, not a number"),
    ("/api/v1/lists", {"name": True}, "name", "must be a string, not a boolean"),
    ("/api/v1/lists", {"name": "n", "description": ["x"]}, "description", "must be a string, not an array"),
    ("/api/v1/messages", {**VALID, "subject": 5}, "subject", "must be a string, not a number"),
    ("/api/v1/messages", {**VALID, "track_clicks": 0}, "track_clicks", "must be true or false, not a number"),
    ("/api/v1/messages", {**VALID, "unsubscribe": "true"}, "unsubscribe", "must be true or false, not a string"),
    ("/api/v1/messages", {**VALID, "from": 7}, "from", "must be a string, not a number"),
    ("/api/v1/messages", {**VALID, "send_at": 1767225600}, "send_at", "must be a string, not a number"),
    ("/api/v1/messages/batch", {"messages": [{**VALID, "text": 123}]}, "messages", "must be a string"),
    ("/api/v1/contacts", {"email": "ann@example.com", "name": 12}, "name", "must be a string, not a number"),
    ("/api/v1/templates", {"name": "t", "subject": 1, "text": "x"}, "subject", "must be a string, not a number"),
    ("/api/v1/campaigns", {"name": "c", "template": "newsletter", "contact_list": "{list}"}, "contact_list",
     "must be an integer, not a string"),
    ("/api/v1/campaigns", {"name": "c", "template": "newsletter", "contact_list": True}, "contact_list",
     "must be an integer, not a boolean"),
    ("/api/v1/campaigns", {"name": "c", "template": "newsletter", "contact_list": 0, "track_opens": "yes"},
     "track_opens", "must be true or false, not a string"),
    ("/api/v1/recurring-schedules", {"name": "r", "cron": "0 9 * * *", "timezone": "UTC",
     "template": "newsletter", "contact_list": 0, "active": 1}, "active", "must be true or false, not a number"),
    ("/api/v1/lists/{list}/members", {"contact_ids": ["{contact}"]}, "contact_ids", "must be an integer, not a string"),
    ("/api/v1/campaigns/{campaign}/schedule", {"type": "optimized", "window_hours": "24"}, "window_hours",
     "must be an integer, not a string"),
    ("/api/v1/campaigns/{campaign}/schedule", {"type": "optimized", "holdout_percent": True}, "holdout_percent",
     "must be an integer, not a boolean"),
    ("/api/v1/templates/{template}/preview", {"contact": "{contact}"}, "contact", "must be an integer, not a string"),
]  # fmt: skip


def _fill(value: Any, objects: dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("{") and value.endswith("}") and value[1:-1] in objects:
        return str(objects[value[1:-1]])  # a real id, as a string: the wrong type for an id
    if isinstance(value, dict):
        return {k: _fill(v, objects) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, objects) for v in value]
    return value


@pytest.mark.parametrize(("url", "body", "field", "says"), WRONG_TYPES)
def test_a_value_of_the_wrong_json_type_is_a_400_naming_the_field(
    api: APIClient, objects: dict[str, Any], url: str, body: dict[str, Any], field: str, says: str
) -> None:
    before = stored()
    response = api.post(url.format(**objects), _fill(body, objects), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert says in str(error["fields"][field]), error
    assert stored() == before
    Campaign.objects.filter(pk=objects["campaign"], status="draft").get()  # not scheduled


def test_a_patch_with_the_wrong_type_changes_nothing(api: APIClient, objects: dict[str, Any]) -> None:
    url = f"/api/v1/contacts/{objects['contact']}"
    response = api.patch(url, {"name": 0, "timezone": "UTC"}, format="json")
    assert response.status_code == 400 and set(response.json()["error"]["fields"]) == {"name"}
    assert Contact.objects.get().name != "0"


def test_values_of_the_right_type_are_taken_as_before(api: APIClient, objects: dict[str, Any]) -> None:
    assert api.post("/api/v1/lists", {"name": "n", "description": "d"}, format="json").status_code == 201
    assert api.post("/api/v1/messages", {**VALID, "track_clicks": True}, format="json").status_code == 202
    optimized = {"type": "optimized", "window_hours": 24, "holdout_percent": 0}
    assert (
        api.post(f"/api/v1/campaigns/{objects['campaign']}/schedule", optimized, format="json").status_code
        == 200
    )


@pytest.mark.parametrize("page_size", ["abc", "null", "1.5", "0", "-3", "1001", "99999999999999999999"])
def test_a_page_size_that_is_no_integer_in_range_is_a_400_naming_it(api: APIClient, page_size: str) -> None:
    response = api.get(f"/api/v1/messages?page_size={page_size}")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["page_size"]
    assert "1 to 1000" in response.json()["error"]["fields"]["page_size"][0]


def test_a_page_size_in_range_sets_the_page(api: APIClient) -> None:
    for i in range(3):
        api.post("/api/v1/messages", {**VALID, "to": f"u{i}@example.com"}, format="json")
    page = api.get("/api/v1/messages?page_size=2").json()
    assert len(page["results"]) == 2 and page["next"]


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/api/v1/contacts?status=", "status"),
        ("/api/v1/suppressions?reason=", "reason"),
        ("/api/v1/events?until=", "until"),
        ("/api/v1/contacts?list=", "list"),
    ],
)
def test_a_filter_given_without_a_value_is_a_400_naming_it(api: APIClient, url: str, name: str) -> None:
    response = api.get(url)
    assert response.status_code == 400 and name in response.json()["error"]["fields"], response.content
