"""The segment filter language as JSON Schema: what the OpenAPI schema shows a client, built from
campaigns.segment_filter's own constants so the two cannot drift apart.

`components()` returns named schemas that refer to each other as `#/components/schemas/<name>`,
the recursion of groups included: `SegmentFilter` is one of the groups `SegmentAnd`, `SegmentOr`,
`SegmentNot` or the conditions `SegmentFieldCondition`, `SegmentAttributeCondition`,
`SegmentListCondition`, `SegmentEngagementCondition`. It keeps to what OpenAPI 3.0 and JSON
Schema 2020-12 read alike: `oneOf`/`anyOf`, `$ref`, a one-value `enum` (3.0 has no `const`),
one `type` per schema, inclusive bounds (the two disagree on `exclusiveMaximum`). Each node is
closed (`additionalProperties: false`) and holds the key that names its kind, so exactly one
branch of a `oneOf` matches. A condition is one branch per operator family, each with the
value type that family takes (`in` an array, `exists` no value, `within` a window).

What a schema cannot say, `segment_filter.parse` and `segments.validate` still refuse:
EMAILHUB_SEGMENT_MAX_DEPTH (nesting) and EMAILHUB_SEGMENT_MAX_BYTES (size); the total of
conditions (a group's `maxItems` bounds only its own); a list or campaign id that must exist;
`between`'s `from` before its `to`; an instant on the first or last allowed day whose offset
moves it past EARLIEST or LATEST in UTC (the pattern bounds the years). The settings shown as
bounds (a group's maxItems, a tag's length) are read when the schema is generated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from campaigns.models import Contact
from campaigns.segment_filter import (
    ATTRIBUTE_KEY_MAX,
    ATTRIBUTE_OPS,
    EARLIEST,
    ENGAGEMENT_OPS,
    ENGAGEMENTS,
    FIELD_OPS,
    LATEST,
    MAX_AT_LEAST,
    MAX_IN_VALUES,
    MAX_NUMBER,
    MAX_STRING,
    MAX_WINDOW,
    WINDOW_UNITS,
)

FILTER = "SegmentFilter"
LIST_OPS = ("in", "not_in")  # segment_filter.list_condition's
ID_MAX = 2**63 - 1  # a bigint primary key

# What a value of each kind is. Numbers: MAX_NUMBER excluded, written as the largest double
# below it (999999999999999.875), which is exactly the bound parse applies to a JSON number
# (`exclusiveMaximum` is a boolean in OpenAPI 3.0 and a number in JSON Schema 2020-12).
_BELOW_MAX_NUMBER = math.nextafter(float(MAX_NUMBER), 0)
STRING = {"type": "string", "maxLength": MAX_STRING}
NUMBER = {"type": "number", "minimum": -_BELOW_MAX_NUMBER, "maximum": _BELOW_MAX_NUMBER}
BOOLEAN = {"type": "boolean"}
DATE = {
    "type": "string",
    "format": "date",
    "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    "description": "an ISO 8601 calendar date, YYYY-MM-DD",
}


def _digits(low: str, high: str) -> list[str]:
    """Regex alternatives matching exactly the decimal strings of one length from low to high."""
    if low == high:
        return [low]
    if set(low) == {"0"} and set(high) == {"9"}:
        return [f"[0-9]{{{len(low)}}}"]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    rest = len(low) - 1
    if low[0] == high[0]:
        return [low[0] + part for part in _digits(low[1:], high[1:])]
    parts = [low[0] + part for part in _digits(low[1:], "9" * rest)]
    if int(high[0]) - int(low[0]) > 1:
        parts.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}][0-9]{{{rest}}}")
    return parts + [high[0] + part for part in _digits("0" * rest, high[1:])]


# parse reads an instant with Python's datetime.fromisoformat: RFC 3339 minus what that refuses
# (a lower-case `z`, a leap second), at most 40 characters, in the years EARLIEST to LATEST (the
# pattern holds the years; an offset that moves the first or last day across a bound, which no
# pattern can see, parse refuses too).
_YEARS = "(" + "|".join(_digits(f"{EARLIEST.year:04d}", f"{LATEST.year:04d}")) + ")"
INSTANT = {
    "anyOf": [
        {**DATE, "pattern": f"^{_YEARS}-[0-9]{{2}}-[0-9]{{2}}$"},
        {
            "type": "string",
            "format": "date-time",
            "maxLength": 40,
            "pattern": f"^{_YEARS}-[0-9]{{2}}-[0-9]{{2}}[Tt][0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(\\.[0-9]+)?(Z|[+-][0-9]{{2}}:[0-9]{{2}})$",
        },
    ],
    "description": f"a date (that day's start in UTC; a `to` date includes the whole day) or an RFC 3339 "
    f"instant with its offset, from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} in UTC",
}
# An email domain as parse reads it: any case, labels of letters, digits and hyphens, at most
# 253 characters after a leading @ (which is ignored) is taken off.
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DOMAIN = {
    "anyOf": [
        {"type": "string", "maxLength": 253 + len(at), "pattern": f"^{at}{_LABEL}(\\.{_LABEL})*$"}
        for at in ("", "@")
    ],
    "description": "a domain such as example.com (a leading @ is ignored)",
}
KIND_VALUES: dict[str, dict[str, Any]] = {
    "string": STRING,
    "number": NUMBER,
    "boolean": BOOLEAN,
    "date": DATE,
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _enum(values: Any) -> dict[str, Any]:
    """One of these strings. Wrapped in a one-item allOf: drf-spectacular's
    postprocess_schema_enums lifts every enum it finds among a component's properties into a
    shared component named after the property, and `op` alone has a dozen choice sets here (each
    collision a warning, which fails the schema's generation)."""
    return {"allOf": [{"type": "string", "enum": list(values)}]}


def _one(value: str) -> dict[str, Any]:
    """`const` as OpenAPI 3.0 can say it (it has no `const`)."""
    return _enum([value])


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "maxItems": MAX_IN_VALUES, "items": items}


def _node(properties: dict[str, Any], required: list[str], description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }
    if description:
        schema["description"] = description
    return schema


def _window() -> dict[str, Any]:
    return {
        "description": "the last N days or hours before now (a campaign: before its start)",
        "oneOf": [
            _node({unit: {"type": "integer", "minimum": 1, "maximum": MAX_WINDOW // length}}, [unit])
            for unit, length in WINDOW_UNITS.items()
        ],
    }


def _group(op: str, meaning: str) -> dict[str, Any]:
    children = {
        "type": "array",
        "minItems": 1,
        "maxItems": settings.EMAILHUB_SEGMENT_MAX_CONDITIONS,
        "items": _ref(FILTER),
    }
    return _node({op: children}, [op], meaning)


def _field_value(field: str, op: str) -> dict[str, Any] | None:
    """The value a field condition takes with this operator (None: no value)."""
    if field == "created_at":
        return _ref("SegmentWindow") if op == "within" else _ref("SegmentInstant")
    one = _enum(Contact.Status.values) if field == "status" else STRING
    return {"in": _array(one), "exists": None, "domain": DOMAIN}.get(op, one)


def _variants(kind: dict[str, Any], values: Mapping[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One closed node per family of operators that take the same value (`values`: by operator,
    None for none)."""
    families: dict[str, tuple[list[str], dict[str, Any] | None]] = {}
    for op, value in values.items():
        families.setdefault(repr(value), ([], value))[0].append(op)
    variants = []
    for family, value in families.values():
        properties = {**kind, "op": _enum(family)}
        required = [*kind, "op"]
        if value is not None:
            properties["value"] = value
            required.append("value")
        variants.append(_node(properties, required))
    return variants


def _field_condition() -> dict[str, Any]:
    variants = []
    for field, ops in FIELD_OPS.items():
        variants += _variants({"field": _one(field)}, {op: _field_value(field, op) for op in ops})
    return {"description": "a contact's own column", "oneOf": variants}


def _attribute_condition() -> dict[str, Any]:
    key = {
        "type": "string",
        "minLength": 1,
        "maxLength": ATTRIBUTE_KEY_MAX,
        "pattern": "^[^\\u0000-\\u001f\\u007f]*$",
        "description": "a key of the contact's `attributes`",
    }
    variants = []
    for kind, ops in ATTRIBUTE_OPS.items():
        one = KIND_VALUES[kind]
        typed = {op: _array(one) if op == "in" else one for op in ops if op != "exists"}
        variants += _variants({"attribute": key, "type": _one(kind)}, typed)
    # `exists` asks only whether the key is there: its type may be left out (or null, which parse
    # reads as left out).
    exists = {"attribute": key, "type": _enum(ATTRIBUTE_OPS), "op": _one("exists")}
    variants.append(_node(exists, ["attribute", "op"]))
    return {
        "description": "a key of the contact's JSON `attributes`, compared as `type` (a date is an "
        "ISO 8601 string compared by its date); a missing key or another type never matches",
        "oneOf": variants,
    }


def _engagement_condition() -> dict[str, Any]:
    common: dict[str, Any] = {
        "engagement": _enum(ENGAGEMENTS),
        "campaign": {
            "type": "integer",
            "minimum": 1,
            "maximum": ID_MAX,
            "description": "only this campaign's",
        },
        "tag": {
            "type": "string",
            "pattern": f"^[A-Za-z0-9_.:-]{{1,{settings.EMAILHUB_TAG_MAX_LENGTH}}}$",
            "description": "only campaigns with this tag",
        },
    }
    windows: list[dict[str, Any]] = [
        {},
        {"within": _ref("SegmentWindow")},
        {
            "between": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": False,
                "properties": {"from": _ref("SegmentInstant"), "to": _ref("SegmentInstant")},
                "description": "from (inclusive) to (exclusive; a date includes that day), either may "
                "be left out; `from` before `to`",
            }
        },
    ]
    variants = []
    for op in ENGAGEMENT_OPS:
        counted = (
            {"value": {"type": "integer", "minimum": 1, "maximum": MAX_AT_LEAST, "default": 1}}
            if op == "at_least"
            else {}
        )
        for window in windows:
            properties = {**common, "op": _one(op), **counted, **window}
            variants.append(_node(properties, ["engagement", "op", *window]))
    return {
        "description": "what emailhub sent the contact and heard back (opens and clicks: human ones "
        "only): `at_least` N times (default 1) or `none`, in an optional window",
        "oneOf": variants,
    }


def components() -> dict[str, dict[str, Any]]:
    """The filter language's schemas by component name (settings read now)."""
    return {
        FILTER: {
            "description": "a segment filter: a group (`and`, `or`, `not`) or a condition; "
            f"nested at most EMAILHUB_SEGMENT_MAX_DEPTH ({settings.EMAILHUB_SEGMENT_MAX_DEPTH}) groups "
            f"deep, at most EMAILHUB_SEGMENT_MAX_CONDITIONS ({settings.EMAILHUB_SEGMENT_MAX_CONDITIONS}) "
            f"conditions and EMAILHUB_SEGMENT_MAX_BYTES ({settings.EMAILHUB_SEGMENT_MAX_BYTES}) bytes of JSON",
            "oneOf": [
                _ref(name)
                for name in (
                    "SegmentAnd",
                    "SegmentOr",
                    "SegmentNot",
                    "SegmentFieldCondition",
                    "SegmentAttributeCondition",
                    "SegmentListCondition",
                    "SegmentEngagementCondition",
                )
            ],
        },
        "SegmentAnd": _group("and", "every child matches"),
        "SegmentOr": _group("or", "at least one child matches"),
        "SegmentNot": _node({"not": _ref(FILTER)}, ["not"], "the child does not match"),
        "SegmentFieldCondition": _field_condition(),
        "SegmentAttributeCondition": _attribute_condition(),
        "SegmentListCondition": _node(
            {
                "list": {"type": "integer", "minimum": 1, "maximum": ID_MAX, "description": "a list's id"},
                "op": _enum(LIST_OPS),
            },
            ["list", "op"],
            "membership of a list",
        ),
        "SegmentEngagementCondition": _engagement_condition(),
        "SegmentWindow": _window(),
        "SegmentInstant": INSTANT,
    }


def document(root: str = FILTER) -> dict[str, Any]:
    """One self-contained JSON Schema (2020-12) for `root`, its components alongside, for a
    validator outside OpenAPI (a client's, the tests')."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"#/components/schemas/{root}",
        "components": {"schemas": components()},
    }
