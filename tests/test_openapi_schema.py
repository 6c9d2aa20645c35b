"""The OpenAPI schema: generated without one drf-spectacular warning, valid OpenAPI, and true to
the API in the ways clients rely on (core/api_schema.py; tests/test_api_schemathesis.py checks
it against a live server)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.utils import timezone
from drf_spectacular.drainage import GENERATOR_STATS
from openapi_spec_validator import validate
from rest_framework.test import APIClient

from campaigns import segment_schema
from campaigns.import_jobs import create_import_job
from core.api_errors import error_body
from core.api_schema import ERROR_SCHEMA
from tests.factories import make_audience, make_campaign


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`manage.py spectacular --validate --fail-on-warn`: any warning or error fails here."""
    path = Path(tmp_path_factory.mktemp("schema")) / "openapi.json"
    GENERATOR_STATS.reset()
    stderr = StringIO()
    try:
        call_command(
            "spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", str(path),
            stderr=stderr,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 — the command's own error, with what it printed
        pytest.fail(f"schema generation failed: {exc}\n{stderr.getvalue()}")
    return json.loads(path.read_text())


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The schema a `$ref` (or drf-spectacular's one-item `allOf` around one) points to."""
    while "$ref" in node or len(node.get("allOf", [])) == 1:
        node = node["allOf"][0] if "allOf" in node else node
        if "$ref" in node:
            node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_the_schema_is_generated_without_warnings_and_is_valid_openapi(schema: dict[str, Any]) -> None:
    validate(schema)
    assert schema["openapi"].startswith("3.")
    assert "/api/schema/" not in schema["paths"]  # the schema documents the API, not itself
    assert len(operations(schema)) >= 50


def test_every_keyed_operation_declares_the_bearer_scheme_and_the_webhook_none(
    schema: dict[str, Any],
) -> None:
    scheme = schema["components"]["securitySchemes"]["ApiKey"]
    assert scheme == {**scheme, "type": "http", "scheme": "bearer"}
    for path, method, operation in operations(schema):
        if path == "/api/v1/webhooks/{provider}":
            assert operation["security"] == [] and "401" not in operation["responses"]
        else:
            assert operation["security"] == [{"ApiKey": []}], (method, path)
            assert {"401", "403"} <= operation["responses"].keys(), (method, path)


def test_every_error_response_has_the_one_error_shape(schema: dict[str, Any]) -> None:
    for path, method, operation in operations(schema):
        responses = operation["responses"]
        assert "400" in responses and "500" not in responses, (method, path)
        if "{" in path:
            assert "404" in responses, (method, path)
        if "requestBody" in operation:
            assert {"411", "413"} <= responses.keys(), (method, path)
        for code, response in responses.items():
            if code[0] in "45" and code != "414":  # 414 is gunicorn's own HTML page
                assert response["content"] == {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                }, (method, path, code)


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("put", "/api/v1/campaigns/{id}", "409"),
        ("patch", "/api/v1/campaigns/{id}", "409"),
        ("post", "/api/v1/campaigns/{id}/schedule", "409"),
        ("post", "/api/v1/campaigns/{id}/pause", "409"),
        ("post", "/api/v1/campaigns/{id}/resume", "409"),
        ("post", "/api/v1/campaigns/{id}/cancel", "409"),
        ("delete", "/api/v1/templates/{id}", "409"),
        ("delete", "/api/v1/lists/{id}", "409"),
        ("delete", "/api/v1/segments/{id}", "409"),
        ("get", "/api/v1/segments/{id}/count", "409"),
        ("get", "/api/v1/segments/{id}/count", "422"),
        ("get", "/api/v1/segments/{id}/sample", "422"),
        ("post", "/api/v1/segments/preview", "422"),
        ("post", "/api/v1/messages", "422"),
        ("post", "/api/v1/contacts", "415"),
        ("post", "/api/v1/contacts/import", "415"),
        ("post", "/api/v1/webhooks/{provider}", "503"),
        ("get", "/api/v1/contacts", "414"),
    ],
)
def test_operations_document_the_errors_only_they_answer(
    schema: dict[str, Any], method: str, path: str, code: str
) -> None:
    assert code in schema["paths"][path][method]["responses"]


def test_the_webhook_reads_no_body_format_so_it_documents_no_415(schema: dict[str, Any]) -> None:
    assert "415" not in schema["paths"]["/api/v1/webhooks/{provider}"]["post"]["responses"]


def test_request_bodies_are_documented_as_accepted(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    for action in ("pause", "resume", "cancel"):
        assert "requestBody" not in paths[f"/api/v1/campaigns/{{id}}/{action}"]["post"]
    body = paths["/api/v1/campaigns/{id}/schedule"]["post"]["requestBody"]["content"]["application/json"]
    request = resolve(schema, body["schema"])
    assert request["discriminator"]["propertyName"] == "type"
    variants = {
        ref.rsplit("/", 1)[1]: resolve(schema, {"$ref": ref})
        for ref in request["discriminator"]["mapping"].values()
    }
    assert set(request["discriminator"]["mapping"]) == {"immediate", "at", "local_time", "optimized"}
    assert "scheduled_at" in variants["ScheduleAtRequest"]["required"]
    assert {"local_date", "local_time"} <= set(variants["ScheduleLocalTimeRequest"]["required"])
    assert variants["ScheduleOptimizedRequest"]["properties"]["window_hours"]["maximum"] == 168
    for method in ("post", "delete"):
        members = paths["/api/v1/lists/{id}/members"][method]["requestBody"]["content"]["application/json"]
        assert resolve(schema, members["schema"])["required"] == ["contact_ids"]
    imported = paths["/api/v1/contacts/import"]["post"]["requestBody"]["content"]
    assert set(imported) == {"multipart/form-data", "text/csv"}


def test_responses_are_typed_where_the_shape_is_known(schema: dict[str, Any]) -> None:
    def success(path: str, method: str = "get") -> dict[str, Any]:
        responses = schema["paths"][path][method]["responses"]
        code = next(code for code in responses if code.startswith("2"))
        return resolve(schema, responses[code]["content"]["application/json"]["schema"])

    providers = success("/api/v1/providers")
    assert set(providers["properties"]) == {"chains", "providers"}
    provider = resolve(schema, providers["properties"]["providers"]["items"])
    assert resolve(schema, provider["properties"]["circuit"])["properties"]["state"]
    dashboard = success("/api/v1/schedules")
    assert {"schedules", "queue_snapshot", "count"} <= set(dashboard["properties"])
    snapshot = resolve(schema, dashboard["properties"]["queue_snapshot"])
    assert set(snapshot["properties"]) == {"critical", "high", "normal", "low"}
    report = success("/api/v1/campaigns/{id}/report")
    assert {"open_rate", "click_rate", "open_hits", "lift"} <= set(report["properties"])
    assert set(success("/api/v1/templates/{id}/preview", "post")["properties"]) == {"subject", "html", "text"}
    campaign = success("/api/v1/campaigns/{id}")
    assert "percent_done" in resolve(schema, campaign["properties"]["progress"])["properties"]
    assert {"received", "skipped"} <= set(success("/api/v1/webhooks/{provider}", "post")["properties"])


def test_addresses_enums_and_idempotency_headers_are_declared(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    assert components["MessageCreateRequest"]["properties"]["to"]["format"] == "email"
    for name in ("Contact", "ContactRequest", "Suppression", "SuppressionRequest"):
        assert components[name]["properties"]["email"]["format"] == "email", name
    assert components["PriorityEnum"]["enum"] == ["critical", "high", "normal", "low"]
    assert components["ScheduleTypeEnum"]["enum"] == ["immediate", "at", "local_time", "optimized"]
    assert "ScheduleType496Enum" not in components
    send = schema["paths"]["/api/v1/messages"]["post"]
    (header,) = [p for p in send["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header" and header["schema"]["maxLength"] == 255
    assert "Idempotent-Replayed" in send["responses"]["202"]["headers"]


def test_the_error_schema_describes_the_bodies_the_api_answers(api: APIClient) -> None:
    bodies = [
        error_body(413, "too big", limit={"name": "EMAILHUB_API_MAX_BODY_BYTES", "value": 10}),
        api.post("/api/v1/messages", {"to": "nope"}, format="json").json(),  # fields
        api.post("/api/v1/lists/1/members", {"contact_ids": [1, "x"]}, format="json").json(),  # 404
        api.post("/api/v1/lists", {"name": ["x"]}, format="json").json(),
        api.get("/api/v1/messages?cursor=bogus").json(),
        APIClient().get("/api/v1/messages").json(),  # 401
        # A segment filter refused by path, and for a limit (`limit_exceeded` with `limit`).
        api.post("/api/v1/segments", {"name": "s", "filter": {"or": [1]}}, format="json").json(),
        api.post(
            "/api/v1/segments/preview",
            {"filter": {"or": [{"not": {"field": "name", "op": "exists"}}] * 51}},
            format="json",
        ).json(),  # fmt: skip
    ]
    for body in bodies:
        jsonschema.validate(body, ERROR_SCHEMA)
    assert bodies[4]["error"]["fields"] == {
        "cursor": ["invalid cursor; follow a page's `next` or `previous` link"]
    }
    assert bodies[6]["error"]["fields"] == {
        "filter.or[0]": ["must be an object (a group or a condition); got a number"]
    }
    assert bodies[7]["error"]["code"] == "limit_exceeded"
    assert bodies[7]["error"]["limit"] == {"name": "EMAILHUB_SEGMENT_MAX_CONDITIONS", "value": 50}


def test_accept_is_negotiated_where_documented_and_ignored_where_it_cannot_matter(api: APIClient) -> None:
    # A JSON operation refuses an Accept without JSON (406, documented, in the Error shape)...
    refused = api.get("/api/v1/messages", HTTP_ACCEPT="text/html")
    assert refused.status_code == 406
    jsonschema.validate(refused.json(), ERROR_SCHEMA)
    # ...but the CSV download takes `Accept: text/csv` (it was a 406), its errors still JSON...
    missing = api.get("/api/v1/imports/999999/rejections.csv", HTTP_ACCEPT="text/csv")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # ...and a provider's odd Accept does not make its webhook refuse the batch.
    webhook = api.post(
        "/api/v1/webhooks/sendgrid", b"[]", content_type="application/json", HTTP_ACCEPT="text/html"
    )
    assert webhook.status_code != 406 and webhook["Content-Type"] == "application/json"


def test_the_csv_download_streams_csv_for_accept_text_csv(api: APIClient) -> None:
    upload = SimpleUploadedFile("c.csv", b"email\nnot-an-address\nada@example.com\n", content_type="text/csv")
    job = create_import_job(upload, filename="c.csv", publish=False)
    response = api.get(f"/api/v1/imports/{job.pk}/rejections.csv", HTTP_ACCEPT="text/csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert b"".join(response.streaming_content).startswith(b"line,reason,excerpt")


def test_every_json_operation_documents_406(schema: dict[str, Any]) -> None:
    for path, method, operation in operations(schema):
        ignores_accept = path in ("/api/v1/imports/{id}/rejections.csv", "/api/v1/webhooks/{provider}")
        assert ("406" in operation["responses"]) is not ignores_accept, (method, path)


def test_the_batch_envelope_is_closed_as_the_view_enforces(schema: dict[str, Any], api: APIClient) -> None:
    assert schema["components"]["schemas"]["BatchRequest"]["additionalProperties"] is False
    assert "BatchRequestRequest" not in schema["components"]["schemas"]
    extra = api.post("/api/v1/messages/batch", {"messages": [], "priority": "high"}, format="json")
    assert extra.status_code == 400 and "priority" in extra.json()["error"]["fields"]


def request_schema(schema: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return resolve(schema, body)


def prop(schema: dict[str, Any], node: dict[str, Any], name: str) -> dict[str, Any]:
    return resolve(schema, node["properties"][name])


def test_a_campaigns_local_time_is_declared_as_the_wall_time_it_is(
    schema: dict[str, Any], api: APIClient
) -> None:
    """Issue 18, item 13: `format: time` is an RFC 3339 time *with an offset*; a campaign's
    local_time is a wall time ("02:30:00") read in each recipient's zone."""
    import re

    campaign = success_schema(schema, "/api/v1/campaigns/{id}")
    local_time = campaign["properties"]["local_time"]
    assert "format" not in local_time and "wall time" in local_time["description"]
    assert re.search(local_time["pattern"], "02:30:00") and re.search(
        local_time["pattern"], "02:30:00.250000"
    )
    assert not re.search(local_time["pattern"], "02:30:00Z")
    variants = request_schema(schema, "/api/v1/campaigns/{id}/schedule")["discriminator"]["mapping"]
    taken = resolve(schema, {"$ref": variants["local_time"]})["properties"]["local_time"]
    assert taken["pattern"] == local_time["pattern"] and "format" not in taken
    for wall in ("02:30", "02:30:00"):
        assert re.search(taken["pattern"], wall)
    # The API takes what the schema declares, and refuses the offset it would have dropped.
    draft = make_campaign(make_audience(1))
    soon = (timezone.now() + timedelta(days=30)).date().isoformat()
    body = {"type": "local_time", "local_date": soon, "local_time": "09:00:00+05:00"}
    refused = api.post(f"/api/v1/campaigns/{draft.pk}/schedule", body, format="json")
    assert refused.status_code == 400 and "local_time" in refused.json()["error"]["fields"]


def success_schema(schema: dict[str, Any], path: str, method: str = "get") -> dict[str, Any]:
    responses = schema["paths"][path][method]["responses"]
    code = next(code for code in responses if code.startswith("2"))
    return resolve(schema, responses[code]["content"]["application/json"]["schema"])


def test_request_bodies_declare_the_bounds_the_api_enforces(schema: dict[str, Any]) -> None:
    """Issue 18, item 14: blank names, empty lists, unknown-length objects the API refuses."""
    lists = request_schema(schema, "/api/v1/lists")
    name = prop(schema, lists, "name")
    assert name["minLength"] == 1  # and what DRF strips to blank does not match:
    assert re.search(name["pattern"], " a ") and not re.search(name["pattern"], " \t\x1f\u3000 ")
    template = request_schema(schema, "/api/v1/templates")
    assert prop(schema, template, "subject")["minLength"] == 1
    assert prop(schema, template, "defaults")["type"] == "object"
    campaign = request_schema(schema, "/api/v1/campaigns")
    assert prop(schema, campaign, "template")["minLength"] == 1
    assert prop(schema, campaign, "contact_list")["minimum"] == 1
    recurring = request_schema(schema, "/api/v1/recurring-schedules")
    assert (
        prop(schema, recurring, "cron")["minLength"] == 1
        and prop(schema, recurring, "timezone")["minLength"] == 1
    )
    members = request_schema(schema, "/api/v1/lists/{id}/members")
    assert prop(schema, members, "contact_ids")["minItems"] == 1
    batch = request_schema(schema, "/api/v1/messages/batch")
    assert (prop(schema, batch, "messages")["minItems"], prop(schema, batch, "messages")["maxItems"]) == (
        1,
        1000,
    )
    message = request_schema(schema, "/api/v1/messages")
    assert prop(schema, message, "context")["maxProperties"] == 1000
    contact = request_schema(schema, "/api/v1/contacts")
    attributes = prop(schema, contact, "attributes")
    assert (
        attributes["type"] == "object"
        and attributes["maxProperties"] == 1000
        and not attributes.get("nullable")
    )
    preview = request_schema(schema, "/api/v1/templates/{id}/preview")
    assert prop(schema, preview, "contact")["minimum"] == 1


def test_every_page_size_declares_its_bounds(schema: dict[str, Any]) -> None:
    sizes = [
        (path, parameter["schema"])
        for path, method, operation in operations(schema)
        for parameter in operation.get("parameters", [])
        if parameter["name"] == "page_size"
    ]
    assert len(sizes) >= 10
    for path, size in sizes:
        assert size["type"] == "integer" and size["minimum"] == 1 and size["maximum"] >= 500, path


def test_every_operation_documents_the_503_of_a_dependency_outage_with_its_retry_after(
    schema: dict[str, Any],
) -> None:
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            unavailable = operation["responses"]["503"]
            assert unavailable["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"
            }
            if path != "/api/v1/webhooks/{provider}":  # its own 503 (a signature not checkable now)
                assert unavailable["headers"]["Retry-After"]["schema"]["type"] == "integer", (method, path)


def test_the_segment_filter_language_is_documented_node_by_node(schema: dict[str, Any]) -> None:
    """campaigns/segment_schema.py's components, as they are, behind every `filter` field."""
    components = schema["components"]["schemas"]
    for name, component in segment_schema.components().items():
        assert components[name] == json.loads(json.dumps(component)), name
    for name in ("Segment", "SegmentRequest", "PatchedSegmentRequest", "SegmentPreviewRequest"):
        assert resolve(schema, components[name]["properties"]["filter"]) == components["SegmentFilter"], name
    assert set(request_schema(schema, "/api/v1/segments")["required"]) == {"name", "filter"}
    assert request_schema(schema, "/api/v1/segments")["additionalProperties"] is False


def test_segment_reads_declare_their_parameters_and_answers(schema: dict[str, Any], settings: Any) -> None:
    sample = schema["paths"]["/api/v1/segments/{id}/sample"]["get"]
    parameters = {p["name"]: p["schema"] for p in sample["parameters"]}
    assert parameters["size"] == {
        **parameters["size"],
        "minimum": 1,
        "maximum": settings.EMAILHUB_SEGMENT_SAMPLE_MAX,
    }
    assert parameters["contact_list"]["minimum"] == 1
    preview = request_schema(schema, "/api/v1/segments/preview")
    assert preview["required"] == ["filter"]
    assert prop(schema, preview, "sample_size")["maximum"] == settings.EMAILHUB_SEGMENT_SAMPLE_MAX
    assert set(success_schema(schema, "/api/v1/segments/{id}/count")["properties"]) == {"count", "as_of"}
    assert set(success_schema(schema, "/api/v1/segments/{id}/sample")["properties"]) == {"contacts"}
    result = success_schema(schema, "/api/v1/segments/preview", "post")
    assert set(result["properties"]) == {"count", "sample", "as_of"}
    contact = resolve(schema, result["properties"]["sample"]["items"])
    assert set(contact["properties"]) == {
        "id",
        "email",
        "name",
        "timezone",
        "status",
        "attributes",
        "created_at",
    }
