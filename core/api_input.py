"""What the API's serializers take: JSON values of the declared type, never coerced.

DRF's fields coerce: a CharField stores `{"name": 0}` as "0", a BooleanField reads 0, "yes" or
"false" as booleans, an IntegerField takes "24", a PrimaryKeyRelatedField looks "5" up. The
OpenAPI schema says `type: string`, `boolean`, `integer`, so a client sending another JSON type
had a bug that was silently hidden (issue 18, item 14). `StrictJSONMixin` refuses such a value
with a 400 naming the field ("must be a string, not a number"), before any field sees it; the
API's serializers take it through `Serializer` and `ModelSerializer` below, in one place rather
than per field. It applies to JSON (dicts the JSON parser made): query parameters and form data
are text by nature and keep DRF's parsing, and Python values a caller passes (the admin's
Schedule page hands `ScheduleSerializer` datetime objects) are not JSON types and go through.

An integer field takes a JSON number and DRF then refuses a fraction ("1.5"), as JSON Schema's
`integer` does (draft 6 on: 24.0 is an integer). A string longer than its field's max_length is
refused as given: DRF measured it after stripping blanks, the schema's maxLength does not.

The fields here are the API's own kinds of value: `JSONObjectField` (an object, with the key and
size limits of core.limits), `TagsField` and `MetadataField` (what an application attaches to a
message or a campaign to recognise it later), `Base64Field` (bytes sent as base64), `WallTimeField` (a time of day without an offset) and `ObjectIdField`
(an existing row's id, `minimum: 1` in the schema).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from datetime import time
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from django.http import QueryDict
from django.utils.dateparse import parse_time
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.relations import ManyRelatedField
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from core import limits
from core.limits import Limit, MaxItems, object_limits
from core.validators import TAG_PATTERN, TAG_RULE, missing_one_of

# Field classes -> the JSON type they take, most specific first (MultipleChoiceField is a
# ChoiceField, ManyRelatedField holds ids).
_EXPECTED: list[tuple[type[serializers.Field], str]] = [
    (serializers.BooleanField, "boolean"),
    (serializers.IntegerField, "integer"),
    (serializers.FloatField, "number"),
    (serializers.DecimalField, "number"),
    (serializers.PrimaryKeyRelatedField, "integer"),
    (serializers.MultipleChoiceField, "array"),
    (serializers.ListField, "array"),
    (ManyRelatedField, "array"),
    (serializers.ListSerializer, "array"),
    (serializers.DictField, "object"),
    (serializers.Serializer, "object"),
    (serializers.CharField, "string"),
    (serializers.SlugRelatedField, "string"),
    (serializers.ChoiceField, "string"),
    (serializers.DateTimeField, "string"),
    (serializers.DateField, "string"),
    (serializers.TimeField, "string"),
    (serializers.DurationField, "string"),
    (serializers.UUIDField, "string"),
]

_SAYS = {
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
}


def _json_type(value: Any) -> str | None:
    """The JSON type of a value the JSON parser made; None for anything else (a Python value)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None  # None (null: the field's allow_null decides), datetime, a model instance…


def _expected(field: serializers.Field) -> str | None:
    for cls, kind in _EXPECTED:
        if isinstance(field, cls):
            if kind == "string" and isinstance(field, serializers.ChoiceField):
                # A choice field of integers would take numbers; ours are all strings.
                if not all(isinstance(key, str) for key in field.choices):
                    return None
            return kind
    return None  # JSONField and the like take any JSON


def schema_mismatch(field: serializers.Field, value: Any) -> Any:
    """The error detail for `value` if it is JSON of another type than `field` takes (for a
    list's or an object's items, by index or key), else None. A string longer than the field's
    max_length counts too: DRF measures it after stripping blanks, the schema's maxLength before."""
    given, expected = _json_type(value), _expected(field)
    if given is None or expected is None:
        return None
    if given != expected and not (expected == "integer" and given == "number"):
        article = "an" if given in ("array", "object") else "a"
        return [f"must be {_SAYS[expected]}, not {article} {given}"]
    limit = getattr(field, "max_length", None)
    if (
        given == "string"
        and isinstance(field, serializers.CharField)
        and limit is not None
        and len(value) > limit
    ):
        return [f"has {len(value)} characters; at most {limit}"]
    child = getattr(field, "child", None) or getattr(field, "child_relation", None)
    if child is None or isinstance(field, serializers.Serializer):
        return None
    items = enumerate(value) if isinstance(value, list) else value.items() if isinstance(value, dict) else ()
    errors = {key: detail for key, item in items if (detail := schema_mismatch(child, item)) is not None}
    return errors or None


# No docstrings on these bases: drf-spectacular would show them as the description of every
# serializer that has none of its own.
class StrictJSONMixin:
    # Refuses a JSON value of the wrong type for a declared field (see the module docstring);
    # every wrong field is reported, together with what the other fields' own validation says.

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping) or isinstance(data, QueryDict):
            return super().to_internal_value(data)  # type: ignore[misc]
        fields = self.fields  # type: ignore[attr-defined]
        wrong = {
            name: detail
            for name, field in fields.items()
            if not field.read_only
            and name in data
            and (detail := schema_mismatch(field, data[name])) is not None
        }
        if not wrong:
            return super().to_internal_value(data)  # type: ignore[misc]
        rest = {key: value for key, value in data.items() if key not in wrong}
        try:
            super().to_internal_value(rest)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            others = exc.detail if isinstance(exc.detail, dict) else {}
            raise serializers.ValidationError({**others, **wrong}) from None
        raise serializers.ValidationError(wrong)


class Serializer(StrictJSONMixin, serializers.Serializer):
    pass  # the API's serializer base: DRF's, refusing wrong JSON types


class ModelSerializer(StrictJSONMixin, serializers.ModelSerializer):
    pass  # the API's model serializer base: DRF's, refusing wrong JSON types


class ClosedFieldsMixin:
    # A request body that takes only its declared fields: any other is a 400 naming it (a typo
    # must not pass as a request that changes nothing), and the schema says
    # additionalProperties: false (core.api_schema).
    refuses_unknown_fields = True
    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, Mapping) else []
        if unknown:
            takes = ", ".join(self.fields)
            raise serializers.ValidationError(
                {name: [f"unknown field; this takes {takes}"] for name in unknown}
            )
        return super().to_internal_value(data)  # type: ignore[misc]


class ClosedSerializer(ClosedFieldsMixin, Serializer):
    pass


class ClosedModelSerializer(ClosedFieldsMixin, ModelSerializer):
    pass


class OneOfRequiredMixin:
    """A serializer whose object needs at least one of the fields `one_of_required` (a campaign's
    audience: a list, a segment, or both), judged as the request would leave the object; the
    400 names the first field. The admin's forms apply the same rule (ApiValidatedForm)."""

    one_of_required: tuple[str, ...] = ()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)  # type: ignore[misc]
        instance = getattr(self, "instance", None)
        names = self.one_of_required
        missing = missing_one_of(
            names, {n: attrs[n] if n in attrs else getattr(instance, n, None) for n in names}
        )
        if missing:
            raise serializers.ValidationError({names[0]: [missing]})
        return attrs


class QueryParameters(Serializer):
    # A view's query parameters. One given without a value (`?status=`) is a 400 naming it: DRF
    # reads an empty form value of an optional field as absent, so it filtered nothing while the
    # schema (an enum, a date-time) says it is invalid. (No docstring: see StrictJSONMixin.)

    def to_internal_value(self, data: Any) -> Any:
        blank = {
            name: ["give a value, or leave the parameter out"]
            for name in self.fields.keys()
            if isinstance(data, Mapping) and data.get(name) == ""
        }
        if blank:
            raise serializers.ValidationError(blank)
        return super().to_internal_value(data)


class JSONObjectField(serializers.DictField):
    """A JSON object of any values, optionally within a key and a size limit (core.limits)."""

    default_error_messages = {
        "not_a_dict": 'must be a JSON object of names and values, e.g. {{"plan": "gold"}}'
    }

    def __init__(self, *, limits: tuple[Limit, Limit] | None = None, **kwargs: Any) -> None:
        if limits is not None:
            kwargs["validators"] = [*kwargs.get("validators", []), *object_limits(*limits)]
        super().__init__(**kwargs)


class TagsField(serializers.ListField):
    """Up to EMAILHUB_MESSAGE_MAX_TAGS tags of TAG_PATTERN, each at most EMAILHUB_TAG_MAX_LENGTH
    characters; a tag given twice is kept once, in the order given."""

    def __init__(self, **kwargs: Any) -> None:
        child = serializers.RegexField(
            TAG_PATTERN,
            validators=[MaxItems(limits.TAG_LENGTH, "characters")],
            error_messages={"invalid": f"is not a tag: {TAG_RULE}", "blank": "a tag cannot be empty"},
        )
        validators = [*kwargs.pop("validators", []), MaxItems(limits.MESSAGE_TAGS, "tags")]
        super().__init__(child=child, validators=validators, **kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        return list(dict.fromkeys(super().to_internal_value(data)))


class MetadataField(serializers.DictField):
    """A flat object of string keys and string values, at most EMAILHUB_METADATA_MAX_KEYS keys
    and EMAILHUB_METADATA_MAX_BYTES bytes as compact UTF-8 JSON (which bounds a key's length; any
    key JSON can carry is stored: OpenAPI 3.0 has no way to say a rule for keys). Stored with the
    message and echoed on its events; never sent to the recipient."""

    default_error_messages = {
        "not_a_dict": 'must be a JSON object of string keys and string values, e.g. {{"order": "1234"}}'
    }

    def __init__(self, **kwargs: Any) -> None:
        child = serializers.CharField(allow_blank=True, trim_whitespace=False)
        validators = [
            *kwargs.pop("validators", []),
            *object_limits(limits.METADATA_KEYS, limits.METADATA_BYTES),
        ]
        super().__init__(child=child, validators=validators, **kwargs)


# A time of day as the API writes it (time.isoformat(): "09:30:00", "09:30:00.250000") and takes
# it ("09:30" too), with no offset: it is read in each recipient's own zone. `format: time` is
# RFC 3339's full-time, which requires an offset, so the schema states this pattern instead.
WALL_TIME_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?$"
WALL_TIME_SCHEMA = {
    "type": "string",
    "pattern": WALL_TIME_PATTERN,
    "description": "a wall time HH:MM[:SS[.ffffff]] without an offset, read in each recipient's own timezone",
    "example": "09:30:00",
}


@extend_schema_field(WALL_TIME_SCHEMA)
class WallTimeField(serializers.TimeField):
    """A time of day without an offset (Django's parse_time silently dropped one)."""

    default_error_messages = {
        "invalid": "give a wall time HH:MM or HH:MM:SS without an offset; it is read in each "
        "recipient's own timezone",
    }

    def to_internal_value(self, value: Any) -> time:
        if isinstance(value, time):
            return value  # the admin's form field already parsed it
        parsed = parse_time(value) if isinstance(value, str) and re.match(WALL_TIME_PATTERN, value) else None
        if parsed is None:
            self.fail("invalid")
        assert parsed is not None
        return parsed


@extend_schema_field({"type": "integer", "minimum": 1})
class ObjectIdField(serializers.PrimaryKeyRelatedField):
    """The id of an existing row (`queryset`); ids start at 1, so the schema says so."""


# Canonical base64 (RFC 4648 §4) of at least one byte: no line breaks, padding only at the end.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)$"


@extend_schema_field(
    {
        "type": "string",
        "format": "byte",
        "pattern": BASE64_PATTERN,
        "description": "base64 (RFC 4648), one line",
    }
)
class Base64Field(serializers.CharField):
    """Bytes sent as base64 on one line (no line breaks, `=` padding), decoded once, here: the
    validated value is the bytes. `binascii` decides rather than the schema's pattern, which
    says the same thing but would cost a regex pass over megabytes."""

    default_error_messages = {
        "invalid": "is not base64: the RFC 4648 alphabet on one line, padded with = to a multiple of 4",
        "empty": "decodes to no bytes; give at least one",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        # CharField's NUL and surrogate validators walk the text a character at a time in
        # Python: 700 ms of a 1 MiB attachment's accept (cProfile, bench/transactional.py phase
        # 3d). b64decode(validate=True) refuses both anyway (outside the alphabet, or non-ASCII).
        self.validators = [
            v
            for v in self.validators
            if not isinstance(v, ProhibitNullCharactersValidator | ProhibitSurrogateCharactersValidator)
        ]

    def to_internal_value(self, data: Any) -> bytes:  # type: ignore[override]
        text = super().to_internal_value(data)
        try:
            decoded = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):  # ValueError: non-ASCII text
            self.fail("invalid")
        if not decoded:
            self.fail("empty")
        return decoded
