"""The OpenAPI schema's shared parts: the one `Error` shape, and which errors each operation documents.

drf-spectacular builds each operation with `AutoSchema` (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS).
This subclass adds, to every operation, the error responses it can really answer, all with the
`Error` schema of `core/api_errors.py`, decided from the operation itself rather than
copied into each view:

- 400 everywhere: a bad field, query parameter or header (`ApiErrorMiddleware` refuses NUL in
  any query or header before a view runs);
- 401 and 403 where the operation takes an API key (no or unknown key; a key without the scope);
- 404 where the path has a parameter (no such object);
- 406 unless the view answers whatever `Accept` says (core.api_negotiation.IgnoreAccept);
- 411 and 413 where it takes a body (chunked without Content-Length; larger than the limit);
  415 where DRF parses that body (a Content-Type none of the view's parsers reads);
- 414 where it takes query parameters: gunicorn's own answer to an overlong request line;
- 503 everywhere: PostgreSQL, Redis or the broker briefly unreachable (a restart, a failover),
  with `Retry-After` (core/api_errors.py; docs/architecture.md, "Dependency outages").

What only some operations answer (409 from a state conflict, 422 from an idempotency key reused
with another body) a view declares with `error_response(409, "why")` in its `extend_schema`
responses. An operation that takes no key says `security: []` instead of staying silent.

A PATCH view that validates its whole body says so with `required_on_patch = True` on its
serializer (its required fields stay required in the schema). A serializer whose view refuses
fields it does not declare says so with `refuses_unknown_fields
= True` (the request schema gets `additionalProperties: false`).

Request bodies are their own components (`COMPONENT_SPLIT_REQUEST`: `ContactRequest`,
`PatchedContactRequest` beside the response's `Contact`), so they can state what the API takes:
`minLength: 1` on every string that may not be blank (drf-spectacular), and here a pattern
asking for one non-whitespace character on those DRF strips first, `minimum: 1` on an id naming another object, `minLength: 1` on a name
naming one. What no schema can state (an unknown name, a taken one, a date that has passed) is
listed, with the reason, in tests/test_api_schemathesis.py's UNEXPRESSIBLE.

A `DELETE` that reads a body says so with `delete_takes_body = True` on its view (`DELETE
/lists/{id}/members` takes `contact_ids`); drf-spectacular documents bodies for PUT, PATCH and
POST only.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular import openapi
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from core.api_negotiation import IgnoreAccept
from core.validators import ONE_LINE

ERROR_COMPONENT = "Error"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}

# The body of core.api_errors.error_body; a test holds them together (tests/test_openapi_schema.py).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error under /api/ has this shape, whatever raised it.",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "code", "message", "fields"],
            "additionalProperties": False,
            "properties": {
                "status": {"type": "integer", "minimum": 400, "maximum": 599, "example": 400},
                "code": {
                    "type": "string",
                    "example": "invalid",
                    "description": "machine-readable: invalid, not_authenticated, missing_scope, "
                    "not_found, conflict, request_too_large, unsupported_media_type, …",
                },
                "message": {"type": "string", "description": "what went wrong and what to do"},
                "fields": {
                    "type": "object",
                    "description": "errors by field name (or item index); empty when no field is at "
                    "fault. A nested field's errors are an object of the same kind.",
                    "additionalProperties": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object"}]
                    },
                },
                "limit": {
                    "type": "object",
                    "description": "the setting and value of a limit that was hit (413, JSON depth)",
                    "required": ["name", "value"],
                    "properties": {"name": {"type": "string"}, "value": {"type": "number"}},
                },
            },
        }
    },
}

ERROR_DESCRIPTIONS = {
    400: "bad input: `fields` names each field, query parameter or header at fault",
    401: "no API key, or an unknown or revoked one (`Authorization: Bearer <api key>`)",
    403: "the API key lacks the scope this operation needs",
    404: "no such object (or one this key may not see)",
    406: "an Accept header that excludes application/json",
    409: "the object's state does not allow this",
    411: "a chunked body without Content-Length (it would not be read)",
    413: "the body is larger than the limit `limit` names",
    415: "a Content-Type this operation does not read",
    422: "the request is well-formed but cannot be applied",
    429: "too many requests",
    503: "a service emailhub depends on (PostgreSQL, Redis, the broker) is briefly unreachable; "
    "nothing was stored: send the same request again after `Retry-After` seconds",
}

# The header every dependency-outage 503 carries (api_errors.UNAVAILABLE_RETRY_AFTER_SECONDS).
RETRY_AFTER_HEADER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 1},
        "description": "seconds to wait before sending the request again",
    }
}


# The one error emailhub does not answer itself: gunicorn refuses a request line longer than its
# --limit-request-line (4,094 bytes by default) with its own small HTML page, before any
# middleware runs. Long query values (non-ASCII text is 6-9 bytes a character once encoded)
# reach it.
URI_TOO_LONG = {
    "description": "the request line is longer than the web server accepts (gunicorn: 4,094 bytes); "
    "answered by gunicorn itself, in HTML, before emailhub sees the request",
    "content": {"text/html": {"schema": {"type": "string"}}},
}


def _not_whitespace_class() -> str:
    """A regex class of one character str.strip() keeps. Spelled out, not `\\S`: regex engines
    disagree on \\s (Python strips U+001C..U+001F, which ECMA's and Rust's \\s do not match),
    and a generator reading the schema must produce only what the API takes."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive whitespace code points
    for code in (code for code in range(0x110000) if chr(code).isspace()):
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "[^" + "".join(f"\\u{a:04x}" + (f"-\\u{b:04x}" if b != a else "") for a, b in runs) + "]"


# A string DRF does not strip to blank: it holds one character that is not whitespace.
NOT_ONLY_WHITESPACE = _not_whitespace_class()


def error_response(status_code: int, description: str | None = None) -> OpenApiResponse:
    """An error response with the `Error` schema, for an `extend_schema(responses=…)`."""
    return OpenApiResponse(ERROR_REF, description=description or ERROR_DESCRIPTIONS[status_code])


@extend_schema_field({"type": "string", "format": "email", "maxLength": 254})
class EmailAddressField(serializers.CharField):
    """An address CharField (give it max_length=254) that the schema shows as `format: email`;
    the serializer's own validation decides, as before (validate_email, lower-casing, no CR/LF)."""


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's AutoSchema with the error responses and `security` described above."""

    def get_operation(
        self, path: str, path_regex: str, path_prefix: str, method: str, registry: Any
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        registry.register_on_missing(
            ResolvedComponent(
                name=ERROR_COMPONENT,
                type=ResolvedComponent.SCHEMA,
                object=ERROR_COMPONENT,
                schema=ERROR_SCHEMA,
            )
        )
        keyed = bool(operation.get("security"))
        operation.setdefault("security", [])  # no key: said, not left to a reader's guess
        statuses = [400, 503]
        if not issubclass(self.view.content_negotiation_class, IgnoreAccept):
            statuses.append(406)
        if keyed:
            statuses += [401, 403]
        if "{" in path:
            statuses.append(404)
        if "requestBody" in operation:
            statuses += [411, 413]
            if self.view.parser_classes:
                statuses.append(415)
        responses = operation["responses"]
        for status_code in statuses:
            responses.setdefault(str(status_code), {"description": ERROR_DESCRIPTIONS[status_code]})
        if responses["503"]["description"] == ERROR_DESCRIPTIONS[503]:
            responses["503"]["headers"] = RETRY_AFTER_HEADER
        for code, response in responses.items():
            if code[0] in "45":  # whatever a view declared, the body is the one shape
                response["content"] = {"application/json": {"schema": ERROR_REF}}
        if any(parameter["in"] == "query" for parameter in operation.get("parameters", [])):
            responses["414"] = URI_TOO_LONG
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction != "request" or not isinstance(schema, dict) or "$ref" in schema:
            return schema
        if isinstance(field, serializers.PrimaryKeyRelatedField):
            schema.setdefault("minimum", 1)  # ids start at 1; 0 and below are no object's
        elif isinstance(field, serializers.SlugRelatedField) and not field.allow_null:
            schema.setdefault("minLength", 1)  # a name; "" names nothing (DRF reads it as null)
        elif isinstance(field, serializers.CharField) and not field.allow_blank and field.trim_whitespace:
            # DRF strips the value and then refuses it blank: "   " is as blank as "".
            # (A RegexValidator's pattern, which drf-spectacular adds later, says more: a slug's.)
            if ONE_LINE in field.validators:
                schema["pattern"] = f"^[^\\r\\n]*{NOT_ONLY_WHITESPACE}[^\\r\\n]*$"
            elif "pattern" not in schema and not any(isinstance(v, RegexValidator) for v in field.validators):
                schema["pattern"] = NOT_ONLY_WHITESPACE
        return schema

    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        super()._insert_field_validators(field, schema)
        # A blank-allowed field with a pattern becomes oneOf [that pattern, maxLength 0]; when the
        # pattern matches "" too (one line: `^[^\r\n]*$`), "" matches both and oneOf refuses it.
        # The pattern alone then says it all.
        branches = schema.get("oneOf")
        if (
            isinstance(branches, list)
            and len(branches) == 2
            and branches[1] == {"type": "string", "maxLength": 0}
            and re.search(branches[0].get("pattern", "(?!)"), "")
        ):
            schema.update(schema.pop("oneOf")[0])

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False  # the view answers 400 for any other field
        if direction == "request" and getattr(serializer, "exactly_one_field", False):
            schema["minProperties"] = schema["maxProperties"] = 1  # one of its fields, alone
        return schema

    def _get_request_for_media_type(self, serializer: Any, direction: Any = "request") -> Any:
        if self.method == "PATCH" and getattr(serializer, "required_on_patch", False):
            # A PATCH whose view validates the whole body (not DRF's partial update): its
            # required fields stay required, as for POST (`PATCH /messages/{id}`: send_at).
            self.method = "POST"
            try:
                return self._get_request_for_media_type(serializer, direction)
            finally:
                self.method = "PATCH"
        schema, required = super()._get_request_for_media_type(serializer, direction)
        if isinstance(serializer, PolymorphicProxySerializer):
            required = True  # each variant requires its discriminator (`…/schedule`: `type`)
        if getattr(serializer, "exactly_one_field", False):
            required = True  # a body of one field, so a body
        return schema, required

    def _get_request_body(self, direction: Any = "request") -> dict[str, Any] | None:
        if self.method != "DELETE" or not getattr(self.view, "delete_takes_body", False):
            return super()._get_request_body(direction)
        self.method = "POST"  # what drf-spectacular documents a body for
        try:
            return super()._get_request_body(direction)
        finally:
            self.method = "DELETE"
