"""The segments API (campaigns/api/segments.py): CRUD, count, sample and preview through
campaigns.segments, each refusal in the one error shape; the filter language's JSON Schema
(campaigns/segment_schema.py) agrees with segment_filter.parse; campaigns and recurring schedules
take a segment as their audience."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import jsonschema
import pytest
from rest_framework.test import APIClient

from campaigns import segment_schema
from campaigns.exceptions import InvalidFilter
from campaigns.models import Campaign, Contact, ContactList, Segment
from campaigns.segment_filter import ATTRIBUTE_OPS, EARLIEST, ENGAGEMENTS, FIELD_OPS, LATEST, parse
from scheduling.models import RecurringSchedule
from tests import factories
from tests.locks import table_locked

pytestmark = pytest.mark.django_db

HANOI = {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"}
ADULT = {"attribute": "age", "type": "number", "op": "gte", "value": 18}


def error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    return response.json()["error"]


def create(api: APIClient, filter: Any, name: str = "hanoi", **fields: Any) -> Any:
    return api.post("/api/v1/segments", {"name": name, "filter": filter, **fields}, format="json")


@pytest.fixture
def people() -> list[Contact]:
    """Four contacts: two adults in Hanoi (one of them also in list "vip"), a minor in Hanoi, an
    adult in Paris; and an unsubscribed adult in Hanoi, who is in no audience."""
    rows = [
        ("ann@example.com", {"city": "Hanoi", "age": 30}),
        ("bob@example.com", {"city": "Hanoi", "age": 12}),
        ("cat@example.com", {"city": "Paris", "age": 41}),
        ("dan@example.org", {"city": "Hanoi", "age": 50}),
    ]
    contacts = [factories.contact(email, name=email[:3], attributes=attributes) for email, attributes in rows]
    factories.contact("eve@example.com", attributes={"city": "Hanoi", "age": 60}, status="unsubscribed")
    vip = factories.contact_list("vip")
    vip.contacts.add(contacts[3])
    return contacts


# --- create, read, update, delete ---------------------------------------------------------------


def test_a_segment_is_created_listed_read_changed_and_deleted(api: APIClient) -> None:
    created = create(api, {"and": [HANOI, ADULT]}, description="adults in Hanoi")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["name"] == "hanoi" and body["description"] == "adults in Hanoi"
    assert body["filter"] == {"and": [HANOI, ADULT]}
    assert set(body) == {"id", "name", "description", "filter", "created_at", "updated_at"}
    segment_id = body["id"]
    create(api, HANOI, name="second")

    page = api.get("/api/v1/segments?page_size=1")
    assert page.status_code == 200 and len(page.json()["results"]) == 1 and page.json()["next"]
    assert [s["name"] for s in api.get("/api/v1/segments").json()["results"]] == ["second", "hanoi"]
    assert api.get(f"/api/v1/segments/{segment_id}").json() == body

    changed = api.patch(f"/api/v1/segments/{segment_id}", {"filter": ADULT, "name": "adults"}, format="json")
    assert changed.status_code == 200, changed.content
    assert Segment.objects.values_list("name", "filter").get(pk=segment_id) == ("adults", ADULT)

    assert api.delete(f"/api/v1/segments/{segment_id}").status_code == 204
    assert list(Segment.objects.values_list("name", flat=True)) == ["second"]


def test_unknown_ids_are_404_on_every_segment_path(api: APIClient) -> None:
    for method, path in [
        ("get", "/api/v1/segments/999999"),
        ("patch", "/api/v1/segments/999999"),
        ("delete", "/api/v1/segments/999999"),
        ("get", "/api/v1/segments/999999/count"),
        ("get", "/api/v1/segments/999999/sample"),
    ]:
        assert error(getattr(api, method)(path, {}, format="json"), 404)["code"] == "not_found", path


def test_a_taken_name_is_a_400_on_name(api: APIClient) -> None:
    create(api, HANOI)
    taken = error(create(api, ADULT), 400)
    assert set(taken["fields"]) == {"name"}
    other = create(api, ADULT, name="other").json()["id"]
    renamed = error(api.patch(f"/api/v1/segments/{other}", {"name": "hanoi"}, format="json"), 400)
    assert set(renamed["fields"]) == {"name"}
    assert Segment.objects.count() == 2


def test_unknown_fields_are_refused_rather_than_ignored(api: APIClient) -> None:
    segment_id = create(api, HANOI).json()["id"]
    typo = error(api.patch(f"/api/v1/segments/{segment_id}", {"filters": ADULT}, format="json"), 400)
    assert set(typo["fields"]) == {"filters"}
    assert Segment.objects.get().filter == HANOI


def test_deleting_a_segment_in_use_is_a_409_naming_its_users(api: APIClient) -> None:
    segment = Segment.objects.create(name="s", filter=HANOI)
    campaign = Campaign.objects.create(name="spring", template=factories.newsletter(), segment=segment)
    refused = error(api.delete(f"/api/v1/segments/{segment.pk}"), 409)
    assert f"campaign {campaign.pk} (spring)" in refused["message"]
    assert Segment.objects.filter(pk=segment.pk).exists()


# --- refused filters ----------------------------------------------------------------------------


def test_a_bad_node_is_named_by_its_path_under_filter(api: APIClient) -> None:
    bad = {"and": [HANOI, ADULT, {"attribute": "age", "type": "number", "op": "gt", "value": "x"}]}
    refused = error(create(api, bad), 400)
    assert refused["code"] == "invalid" and "limit" not in refused
    assert refused["fields"] == {"filter.and[2].value": ["must be a number; got a string"]}
    assert not Segment.objects.exists()


@pytest.mark.parametrize(
    ("filter", "message"),
    [
        ("city = Hanoi", "must be an object (a group or a condition); got a string"),
        ([HANOI], "must be an object (a group or a condition); got an array"),
        (42, "must be an object (a group or a condition); got a number"),
        ({}, "must have exactly one of"),
        ({"and": [], "or": []}, "must have exactly one of"),
    ],
)
def test_a_filter_that_is_no_node_is_refused_on_filter(api: APIClient, filter: Any, message: str) -> None:
    refused = error(create(api, filter), 400)
    assert list(refused["fields"]) == ["filter"] and refused["fields"]["filter"][0].startswith(message)


def test_a_null_or_missing_filter_is_refused_on_filter(api: APIClient) -> None:
    assert set(error(create(api, None), 400)["fields"]) == {"filter"}
    missing = api.post("/api/v1/segments", {"name": "x"}, format="json")
    assert set(error(missing, 400)["fields"]) == {"filter"}


def test_a_list_or_campaign_that_does_not_exist_is_named(api: APIClient) -> None:
    refused = error(
        create(
            api, {"or": [{"list": 987654, "op": "in"}, {"engagement": "opened", "op": "none", "campaign": 5}]}
        ),
        400,
    )
    assert refused["fields"] == {
        "filter.or[0].list": ["there is no list 987654"],
        "filter.or[1].campaign": ["there is no campaign 5"],
    }


def test_a_filter_nested_too_deep_names_the_setting(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_SEGMENT_MAX_DEPTH = 2
    refused = error(create(api, {"not": {"not": {"not": HANOI}}}), 400)
    assert refused["code"] == "limit_exceeded"
    assert refused["limit"] == {"name": "EMAILHUB_SEGMENT_MAX_DEPTH", "value": 2}
    assert list(refused["fields"]) == ["filter.not.not"]


def test_too_many_conditions_and_too_many_bytes_name_their_settings(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 3
    refused = error(create(api, {"or": [HANOI] * 4}), 400)
    assert refused["code"] == "limit_exceeded"
    assert refused["limit"] == {"name": "EMAILHUB_SEGMENT_MAX_CONDITIONS", "value": 3}
    assert refused["fields"] == {"filter": ["the filter has 4 conditions; at most 3"]}

    settings.EMAILHUB_SEGMENT_MAX_BYTES = 1024
    big = {"field": "name", "op": "in", "value": [f"name {n}" for n in range(200)]}
    refused = error(create(api, big), 400)
    assert refused["limit"] == {"name": "EMAILHUB_SEGMENT_MAX_BYTES", "value": 1024}
    assert list(refused["fields"]) == ["filter"]


def test_json_nested_past_the_apis_depth_limit_is_refused_before_parsing(api: APIClient) -> None:
    deep: Any = HANOI
    for _ in range(40):
        deep = {"not": deep}
    refused = error(create(api, deep), 400)
    assert refused["limit"]["name"] == "EMAILHUB_API_MAX_JSON_DEPTH"


def test_control_characters_and_nul_are_refused_with_a_400(api: APIClient) -> None:
    key = error(create(api, {"attribute": "ci\x07ty", "type": "string", "op": "exists"}), 400)
    assert list(key["fields"]) == ["filter.attribute"]
    nul = error(create(api, {"attribute": "city", "type": "string", "op": "equals", "value": "a\x00b"}), 400)
    assert "filter" in nul["fields"]
    assert not Segment.objects.exists()


@pytest.mark.parametrize(
    ("filter", "path"),
    [
        ({"field": "created_at", "op": "before", "value": "9999-12-31T23:00:00-05:00"}, "filter.value"),
        ({"field": "created_at", "op": "after", "value": "0001-01-01T00:00:00+05:00"}, "filter.value"),
        ({"engagement": "opened", "op": "none", "between": {"to": "9999-12-31"}}, "filter.between.to"),
        ({"field": {}, "op": "equals", "value": "x"}, "filter.field"),
        ({"field": ["email"], "op": "equals", "value": "x"}, "filter.field"),
    ],
    ids=lambda f: json.dumps(f)[:60],
)
def test_out_of_range_instants_and_unhashable_names_are_a_400_not_a_500(
    api: APIClient, filter: Any, path: str
) -> None:
    for response in (
        create(api, filter),
        api.post("/api/v1/segments/preview", {"filter": filter}, format="json"),
    ):
        assert list(error(response, 400)["fields"]) == [path]
    assert not Segment.objects.exists()


def test_a_bad_filter_in_a_patch_changes_nothing(api: APIClient) -> None:
    segment_id = create(api, HANOI).json()["id"]
    refused = error(api.patch(f"/api/v1/segments/{segment_id}", {"filter": {"or": "x"}}, format="json"), 400)
    assert list(refused["fields"]) == ["filter.or"]
    assert Segment.objects.get().filter == HANOI


# --- count and sample ---------------------------------------------------------------------------


def test_count_is_the_audience_now_and_a_list_narrows_it(api: APIClient, people: list[Contact]) -> None:
    segment_id = create(api, {"and": [HANOI, ADULT]}).json()["id"]
    counted = api.get(f"/api/v1/segments/{segment_id}/count")
    assert counted.status_code == 200, counted.content
    assert counted.json()["count"] == 2  # ann and dan; eve is unsubscribed, bob a minor
    assert datetime.fromisoformat(counted.json()["as_of"].replace("Z", "+00:00")).tzinfo is not None
    vip = ContactList.objects.get(name="vip").pk
    assert api.get(f"/api/v1/segments/{segment_id}/count?contact_list={vip}").json()["count"] == 1


@pytest.mark.parametrize("value", ["abc", "1.5", "0", "-3", "99999999999999999999", "", "999999"])
def test_a_bad_contact_list_parameter_is_a_400_naming_it(api: APIClient, value: str) -> None:
    segment_id = create(api, HANOI).json()["id"]
    for path in ("count", "sample"):
        refused = error(api.get(f"/api/v1/segments/{segment_id}/{path}?contact_list={value}"), 400)
        assert set(refused["fields"]) == {"contact_list"}, (path, value)


def test_sample_shows_the_first_contacts_by_id(api: APIClient, people: list[Contact]) -> None:
    segment_id = create(api, HANOI).json()["id"]
    sample = api.get(f"/api/v1/segments/{segment_id}/sample?size=2")
    assert sample.status_code == 200, sample.content
    ann, bob = people[0], people[1]
    assert [c["id"] for c in sample.json()["contacts"]] == [ann.pk, bob.pk]
    first = sample.json()["contacts"][0]
    assert first == {
        "id": ann.pk,
        "email": "ann@example.com",
        "name": "ann",
        "timezone": "UTC",
        "status": "active",
        "attributes": {"city": "Hanoi", "age": 30},
        "created_at": first["created_at"],
    }
    assert len(api.get(f"/api/v1/segments/{segment_id}/sample").json()["contacts"]) == 3  # default 10


def test_a_sample_size_beyond_the_setting_or_not_a_number_is_a_400(api: APIClient, settings: Any) -> None:
    settings.EMAILHUB_SEGMENT_SAMPLE_MAX = 5
    segment_id = create(api, HANOI).json()["id"]
    for size in ("6", "0", "x"):
        refused = error(api.get(f"/api/v1/segments/{segment_id}/sample?size={size}"), 400)
        assert set(refused["fields"]) == {"size"}, size
    assert (
        "EMAILHUB_SEGMENT_SAMPLE_MAX"
        in error(api.get(f"/api/v1/segments/{segment_id}/sample?size=6"), 400)["fields"]["size"][0]
    )


def test_a_saved_filter_beyond_a_lowered_limit_is_a_409_when_read(api: APIClient, settings: Any) -> None:
    segment_id = create(api, {"and": [HANOI, ADULT]}).json()["id"]
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 1
    for path in ("count", "sample"):
        refused = error(api.get(f"/api/v1/segments/{segment_id}/{path}"), 409)
        assert (
            "the filter has 2 conditions; at most 1" in refused["message"] and "PATCH" in refused["message"]
        )


def test_a_list_a_segment_names_cannot_be_deleted_from_under_it(api: APIClient) -> None:
    named = factories.contact_list("named")
    segment_id = create(api, {"list": named.pk, "op": "in"}).json()["id"]
    refused = error(api.delete(f"/api/v1/lists/{named.pk}"), 409)
    assert f"segment {segment_id} (hanoi)" in refused["message"]
    assert api.get(f"/api/v1/segments/{segment_id}/count").json()["count"] == 0


# --- preview ------------------------------------------------------------------------------------


def test_preview_counts_and_samples_an_unsaved_filter(api: APIClient, people: list[Contact]) -> None:
    body = {"filter": {"and": [HANOI, ADULT]}, "sample_size": 1}
    preview = api.post("/api/v1/segments/preview", body, format="json")
    assert preview.status_code == 200, preview.content
    assert preview.json()["count"] == 2 and [c["email"] for c in preview.json()["sample"]] == [
        "ann@example.com"
    ]
    assert set(preview.json()) == {"count", "sample", "as_of"}
    vip = ContactList.objects.get(name="vip").pk
    narrowed = api.post("/api/v1/segments/preview", {**body, "contact_list": vip}, format="json").json()
    assert narrowed["count"] == 1 and [c["email"] for c in narrowed["sample"]] == ["dan@example.org"]
    assert not Segment.objects.exists()


def test_preview_refuses_bad_filters_lists_and_fields(api: APIClient) -> None:
    bad = error(api.post("/api/v1/segments/preview", {"filter": {"not": 1}}, format="json"), 400)
    assert list(bad["fields"]) == ["filter.not"]
    no_list = api.post("/api/v1/segments/preview", {"filter": HANOI, "contact_list": 10**20}, format="json")
    assert set(error(no_list, 400)["fields"]) == {"contact_list"}
    wrong_type = api.post("/api/v1/segments/preview", {"filter": HANOI, "contact_list": "1"}, format="json")
    assert set(error(wrong_type, 400)["fields"]) == {"contact_list"}
    extra = api.post("/api/v1/segments/preview", {"filter": HANOI, "name": "x"}, format="json")
    assert set(error(extra, 400)["fields"]) == {"name"}


def test_a_query_past_the_timeout_is_a_422_naming_the_setting(api: APIClient, settings: Any) -> None:
    """The contacts table is locked by another session, so the count waits until the statement
    timeout stops it: no dependence on how fast the machine is."""
    settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS = 0.2
    segment_id = create(api, HANOI).json()["id"]
    with table_locked("campaigns_contact"):
        for response in (
            api.get(f"/api/v1/segments/{segment_id}/count"),
            api.post("/api/v1/segments/preview", {"filter": HANOI}, format="json"),
        ):
            refused = error(response, 422)
            assert (
                refused["code"] == "query_timeout"
                and "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS" in refused["message"]
            )
            assert refused["limit"] == {"name": "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS", "value": 0.2}


def test_segments_need_the_manage_scope_like_lists_and_campaigns() -> None:
    client, _ = factories.api_client("send", "read")
    for response in (
        client.get("/api/v1/segments"),
        client.post("/api/v1/segments/preview", {"filter": HANOI}, format="json"),
    ):
        refused = error(response, 403)
        assert refused["code"] == "missing_scope" and "manage" in refused["message"]


# --- the filter language's JSON Schema ----------------------------------------------------------

VALID = [
    HANOI,
    {"and": [HANOI, {"not": ADULT}]},
    {"or": [{"field": "email", "op": "domain", "value": "@Example.COM"}, {"field": "name", "op": "exists"}]},
    {"field": "status", "op": "in", "value": ["active", "bounced"]},
    {"field": "email", "op": "domain", "value": "@" + ".".join(["a" * 63] * 3 + ["a" * 61])},  # 253 after @
    {"field": "created_at", "op": "after", "value": "2024-05-01"},
    {"field": "created_at", "op": "before", "value": "2024-05-01T09:30:00+07:00"},
    {"field": "created_at", "op": "within", "value": {"days": 30}},
    {"attribute": "vip", "type": "boolean", "op": "equals", "value": True},
    {"attribute": "born", "type": "date", "op": "in", "value": ["1990-01-01", "2000-02-29"]},
    {"attribute": "score", "type": "number", "op": "lt", "value": -2.5},
    {"attribute": "tags", "op": "exists"},
    {"list": 7, "op": "not_in"},
    {"engagement": "opened", "op": "at_least", "value": 3, "within": {"hours": 48}, "tag": "spring.sale"},
    {"engagement": "clicked", "op": "none", "between": {"from": "2024-01-01", "to": "2024-02-01T00:00:00Z"}},
    {"engagement": "sent", "op": "at_least", "campaign": 12},
]

# Invalid in ways the schema states: each refused by the schema and by parse.
INVALID = [
    "Hanoi",
    {"and": []},
    {"and": [HANOI], "or": [HANOI]},
    {"not": [HANOI]},
    {"field": "phone", "op": "equals", "value": "1"},
    {"field": "name", "op": "domain", "value": "example.com"},
    {"field": "name", "op": "exists", "value": "x"},
    {"field": "email", "op": "domain", "value": "not a domain"},
    {"field": "email", "op": "domain", "value": ".".join(["a" * 63] * 4)},  # 255 characters
    {
        "field": "email",
        "op": "domain",
        "value": "@" + ".".join(["a" * 63] * 3 + ["a" * 62]),
    },  # 254 after the @
    {"field": "status", "op": "equals", "value": "sleepy"},
    {"field": "created_at", "op": "before", "value": "yesterday"},
    {"field": "created_at", "op": "before", "value": "1899-12-31"},
    {"engagement": "opened", "op": "none", "between": {"from": "9999-01-01T00:00:00Z"}},
    {"field": "created_at", "op": "within", "value": {"weeks": 2}},
    {"field": "created_at", "op": "within", "value": {"days": 3651}},
    {"attribute": "age", "type": "number", "op": "gt", "value": "18"},
    {"attribute": "age", "type": "number", "op": "gt", "value": 1e15},
    {"attribute": "age", "type": "number", "op": "contains", "value": 1},
    {"attribute": "vip", "type": "boolean", "op": "equals", "value": 1},
    {"attribute": "born", "type": "date", "op": "equals", "value": "2024-5-1"},
    {"attribute": "", "type": "string", "op": "exists"},
    {"attribute": "a\x1fb", "type": "string", "op": "exists"},
    {"attribute": "city", "type": "text", "op": "equals", "value": "x"},
    {"attribute": "city", "op": "equals", "value": "x"},
    {"attribute": "city", "type": "string", "op": "in", "value": []},
    {"attribute": "city", "type": "string", "op": "equals", "value": "x" * 1001},
    {"list": 0, "op": "in"},
    {"list": "7", "op": "in"},
    {"list": 7, "op": "member"},
    {"engagement": "forwarded", "op": "none"},
    {"engagement": "opened", "op": "none", "value": 1},
    {"engagement": "opened", "op": "at_least", "value": 1001},
    {"engagement": "opened", "op": "at_least", "within": {"days": 1}, "between": {"from": "2024-01-01"}},
    {"engagement": "opened", "op": "at_least", "between": {}},
    {"engagement": "opened", "op": "at_least", "tag": "no spaces"},
    {"engagement": "opened", "op": "at_least", "when": "now"},
]


@pytest.fixture
def validator() -> jsonschema.Draft202012Validator:
    document = segment_schema.document()
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(
        document, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


@pytest.mark.parametrize("filter", VALID, ids=lambda f: json.dumps(f)[:60])
def test_valid_filters_pass_the_schema_and_parse(
    validator: jsonschema.Draft202012Validator, filter: Any
) -> None:
    validator.validate(filter)
    parse(filter)


@pytest.mark.parametrize("filter", INVALID, ids=lambda f: json.dumps(f)[:60])
def test_invalid_filters_fail_the_schema_and_parse(
    validator: jsonschema.Draft202012Validator, filter: Any
) -> None:
    assert not validator.is_valid(filter)
    with pytest.raises(InvalidFilter):
        parse(filter)


def _branches(component: str) -> list[dict[str, Any]]:
    return segment_schema.components()[component]["oneOf"]


def _enum(node: dict[str, Any]) -> list[str]:
    return node["allOf"][0]["enum"]


def test_the_schema_is_built_from_the_languages_constants() -> None:
    fields: dict[str, list[str]] = {}
    for branch in _branches("SegmentFieldCondition"):
        fields.setdefault(_enum(branch["properties"]["field"])[0], []).extend(
            _enum(branch["properties"]["op"])
        )
    assert {name: sorted(ops) for name, ops in fields.items()} == {
        name: sorted(ops) for name, ops in FIELD_OPS.items()
    }
    attributes: dict[str, list[str]] = {}
    for branch in _branches("SegmentAttributeCondition"):
        for kind in _enum(branch["properties"]["type"]):
            attributes.setdefault(kind, []).extend(_enum(branch["properties"]["op"]))
    assert {kind: sorted(ops) for kind, ops in attributes.items()} == {
        kind: sorted(ops) for kind, ops in ATTRIBUTE_OPS.items()
    }
    engagement = _branches("SegmentEngagementCondition")
    assert all(_enum(branch["properties"]["engagement"]) == list(ENGAGEMENTS) for branch in engagement)


def test_the_schemas_years_are_the_ones_parse_takes() -> None:
    dates, instants = (re.compile(branch["pattern"]) for branch in segment_schema.INSTANT["anyOf"])
    years = [year for year in range(10_000) if dates.match(f"{year:04d}-06-15")]
    assert (years[0], years[-1], len(years)) == (EARLIEST.year, LATEST.year, LATEST.year - EARLIEST.year + 1)
    assert [year for year in range(10_000) if instants.match(f"{year:04d}-06-15T12:00:00Z")] == years


def test_the_schemas_bounds_follow_the_settings(settings: Any) -> None:
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 7
    settings.EMAILHUB_TAG_MAX_LENGTH = 20
    components = segment_schema.components()
    assert components["SegmentAnd"]["properties"]["and"]["maxItems"] == 7
    tag = components["SegmentEngagementCondition"]["oneOf"][0]["properties"]["tag"]
    assert tag["pattern"].endswith("{1,20}$")


# --- campaigns and recurring schedules take a segment -------------------------------------------


@pytest.fixture
def audience() -> dict[str, int]:
    factories.newsletter()
    return {
        "segment": Segment.objects.create(name="hanoi", filter=HANOI).pk,
        "contact_list": factories.contact_list("vip").pk,
    }


def test_a_campaign_takes_a_segment_a_list_or_both_but_not_neither(
    api: APIClient, audience: dict[str, int]
) -> None:
    base = {"name": "spring", "template": "newsletter"}
    by_segment = api.post("/api/v1/campaigns", {**base, "segment": audience["segment"]}, format="json")
    assert by_segment.status_code == 201, by_segment.content
    assert (by_segment.json()["segment"], by_segment.json()["contact_list"]) == (audience["segment"], None)
    both = api.post("/api/v1/campaigns", {**base, **audience}, format="json")
    assert both.status_code == 201 and (both.json()["segment"], both.json()["contact_list"]) == (
        audience["segment"],
        audience["contact_list"],
    )
    neither = error(api.post("/api/v1/campaigns", base, format="json"), 400)
    assert neither["fields"] == {"contact_list": ["give at least one of contact_list, segment"]}
    assert Campaign.objects.count() == 2


def test_a_recurring_schedule_takes_a_segment_a_list_or_both_but_not_neither(
    api: APIClient, audience: dict[str, int]
) -> None:
    base = {
        "name": "weekly",
        "cron": "0 9 * * 1",
        "timezone": "UTC",
        "template": "newsletter",
        "active": False,
    }
    by_segment = api.post(
        "/api/v1/recurring-schedules", {**base, "segment": audience["segment"]}, format="json"
    )
    assert by_segment.status_code == 201, by_segment.content
    assert (by_segment.json()["segment"], by_segment.json()["contact_list"]) == (audience["segment"], None)
    both = api.post("/api/v1/recurring-schedules", {**base, "name": "both", **audience}, format="json")
    assert both.status_code == 201, both.content
    neither = error(api.post("/api/v1/recurring-schedules", {**base, "name": "none"}, format="json"), 400)
    assert neither["fields"] == {"contact_list": ["give at least one of contact_list, segment"]}
    assert RecurringSchedule.objects.count() == 2
    # The segment is in use now: deleting it is refused, naming the schedules.
    refused = error(api.delete(f"/api/v1/segments/{audience['segment']}"), 409)
    assert "weekly" in refused["message"] and "both" in refused["message"]
