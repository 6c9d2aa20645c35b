"""The segment filter language: JSON in, a checked tree out, every refusal naming its path.

A segment is a named filter over contacts. Its JSON is a tree of groups and conditions:

    {"and": [
        {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"},
        {"engagement": "opened", "op": "at_least", "value": 1, "within": {"days": 90}}
    ]}

- groups: `{"and": [node, …]}`, `{"or": [node, …]}`, `{"not": node}`;
- `{"field": …}` a contact's own column: `email` (equals, not_equals, in, domain, contains),
  `name` (equals, not_equals, contains, exists), `timezone` and `status` (equals, not_equals,
  in), `created_at` (before, after: an ISO 8601 instant or date; within: a relative window);
- `{"attribute": key, "type": string|number|boolean|date, "op": …}` a key of the contact's JSON
  `attributes`: equals, not_equals, in, exists for every type; contains (a substring, or an
  element of an array) for strings; gt, gte, lt, lte for numbers and dates (a date attribute is
  an ISO 8601 string compared by its calendar date, its first ten characters);
- `{"list": id, "op": "in" | "not_in"}` list membership;
- `{"engagement": sent|opened|clicked|bounced|complained|unsubscribed, "op": "at_least" | "none",
  "value": N, "within": {"days"|"hours": N} | "between": {"from": …, "to": …},
  "campaign": id, "tag": "…"}`: what emailhub sent the contact and heard back. Opens and clicks
  are human ones only (the tracking classifier's `human`); machine opens never count.

This module only reads and checks: `parse` returns the tree (dataclasses) or raises
`InvalidFilter` with `{path: message}`, e.g. `{"and[2].value": "…"}`. Turning the tree into
SQL is campaigns.segment_sql's. Values never become SQL text there: every one is a parameter.
A condition on a missing attribute (or one of another type) is false, so its `not` is true;
`not_equals` is `not` of `equals` (a contact without the attribute is "not equal").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings

from campaigns.exceptions import InvalidFilter
from campaigns.models import Contact

GROUPS = ("and", "or", "not")
KINDS = ("field", "attribute", "list", "engagement")

FIELD_OPS: dict[str, tuple[str, ...]] = {
    "email": ("equals", "not_equals", "in", "domain", "contains"),
    "name": ("equals", "not_equals", "contains", "exists"),
    "timezone": ("equals", "not_equals", "in"),
    "status": ("equals", "not_equals", "in"),
    "created_at": ("before", "after", "within"),
}
ATTRIBUTE_TYPES = ("string", "number", "boolean", "date")
ATTRIBUTE_OPS: dict[str, tuple[str, ...]] = {
    "string": ("equals", "not_equals", "in", "contains", "exists"),
    "number": ("equals", "not_equals", "in", "gt", "gte", "lt", "lte", "exists"),
    "boolean": ("equals", "not_equals", "exists"),
    "date": ("equals", "not_equals", "in", "gt", "gte", "lt", "lte", "exists"),
}
ENGAGEMENTS = ("sent", "opened", "clicked", "bounced", "complained", "unsubscribed")
ENGAGEMENT_OPS = ("at_least", "none")
WINDOW_UNITS = {"days": timedelta(days=1), "hours": timedelta(hours=1)}

# Bounds that keep a filter a filter (the depth and size limits are settings).
MAX_STRING = 1_000  # characters of one value
MAX_IN_VALUES = 1_000  # values of one `in`
MAX_AT_LEAST = 1_000  # "at least N times"
MAX_WINDOW = timedelta(days=3_650)  # a relative window of ten years at most
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)  # instants a filter may name
LATEST = datetime(9998, 12, 31, tzinfo=UTC)
MAX_NUMBER = Decimal("1e15")  # attribute numbers compared: integers and decimals below this
ATTRIBUTE_KEY_MAX = 100
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DOMAIN = re.compile(
    r"^(?=.{1,253}\Z)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\Z"
)


# --- the tree -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    op: str  # and, or
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    child: Node


@dataclass(frozen=True)
class FieldCondition:
    field: str
    op: str
    value: Any = None  # str, list[str], datetime, or a Window for `within`


@dataclass(frozen=True)
class AttributeCondition:
    key: str
    type: str
    op: str
    value: Any = None  # str, Decimal, bool, or a list of them


@dataclass(frozen=True)
class ListCondition:
    list_id: int
    op: str  # in, not_in
    path: str = field(default="", compare=False)  # where the filter names the list


@dataclass(frozen=True)
class Window:
    """A relative window (`within`: the last `length` before the anchor) or absolute bounds
    (`since` inclusive, `until` exclusive). A relative window is an exact duration: a day is 24
    hours wherever a contact lives, so a DST change moves no event in or out of it."""

    length: timedelta | None = None
    since: datetime | None = None
    until: datetime | None = None

    def bounds(self, anchor: datetime) -> tuple[datetime | None, datetime | None]:
        """[since, until): a relative window is the `length` that ends at the anchor, taken in
        UTC (an anchor given in a zone with DST would otherwise subtract wall-clock days)."""
        if self.length is not None:
            end = anchor.astimezone(UTC)
            return end - self.length, end
        return self.since, self.until


@dataclass(frozen=True)
class EngagementCondition:
    kind: str
    op: str  # at_least, none
    count: int = 1
    window: Window | None = None
    campaign_id: int | None = None
    tag: str | None = None
    path: str = field(default="", compare=False)  # where the filter names the campaign


Node = Group | Not | FieldCondition | AttributeCondition | ListCondition | EngagementCondition


@dataclass(frozen=True)
class References:
    """The lists and campaigns a filter names, each with the path of a node naming it (checked
    to exist when a filter is saved)."""

    lists: dict[int, str]
    campaigns: dict[int, str]


def references(node: Node) -> References:
    lists: dict[int, str] = {}
    campaigns: dict[int, str] = {}

    def walk(n: Node) -> None:
        if isinstance(n, Group):
            for child in n.children:
                walk(child)
        elif isinstance(n, Not):
            walk(n.child)
        elif isinstance(n, ListCondition):
            lists.setdefault(n.list_id, _join(n.path, "list"))
        elif isinstance(n, EngagementCondition) and n.campaign_id is not None:
            campaigns.setdefault(n.campaign_id, _join(n.path, "campaign"))

    walk(node)
    return References(lists, campaigns)


# --- parsing ------------------------------------------------------------------------------------


def parse(data: Any, *, limits: bool = True) -> Node:
    """Check the JSON filter `data` (already decoded) and return its tree, or raise InvalidFilter
    naming every bad node found (up to the first 20) by its path.

    `limits=False` skips the size, condition and depth bounds: for a filter stored when it was
    accepted (a scheduled campaign's), which a bound lowered since must not stop from sending."""
    size = len(json.dumps(data, default=str, ensure_ascii=False).encode())
    if limits and size > settings.EMAILHUB_SEGMENT_MAX_BYTES:
        raise InvalidFilter(
            {"": f"the filter is {size:,} bytes of JSON; at most {settings.EMAILHUB_SEGMENT_MAX_BYTES:,}"},
            limit="EMAILHUB_SEGMENT_MAX_BYTES",
        )
    parser = _Parser(limits)
    node = parser.node(data, "", 1)
    if limits and parser.conditions > settings.EMAILHUB_SEGMENT_MAX_CONDITIONS and "" not in parser.errors:
        parser.errors[""] = (
            f"the filter has {parser.conditions} conditions; at most {settings.EMAILHUB_SEGMENT_MAX_CONDITIONS}"
        )
        parser.limit = parser.limit or "EMAILHUB_SEGMENT_MAX_CONDITIONS"
    if parser.errors:
        raise InvalidFilter(dict(list(parser.errors.items())[:20]), limit=parser.limit)
    assert node is not None
    return node


class _Parser:
    def __init__(self, limits: bool = True) -> None:
        self.enforce_limits = limits
        self.errors: dict[str, str] = {}
        self.conditions = 0
        self.limit: str | None = None

    def fail(self, path: str, message: str) -> None:
        self.errors.setdefault(path, message)

    def node(self, data: Any, path: str, depth: int) -> Node | None:
        if not isinstance(data, dict):
            self.fail(path, f"must be an object (a group or a condition); got {_json_type(data)}")
            return None
        kinds = [key for key in (*GROUPS, *KINDS) if key in data]
        if len(kinds) != 1:
            named = ", ".join(repr(k) for k in kinds) if kinds else "none"
            self.fail(
                path,
                "must have exactly one of 'and', 'or', 'not', 'field', 'attribute', 'list', "
                f"'engagement'; has {named}",
            )
            return None
        kind = kinds[0]
        if kind in GROUPS:
            if self.enforce_limits and depth > settings.EMAILHUB_SEGMENT_MAX_DEPTH:
                self.fail(
                    path,
                    f"groups are nested more than {settings.EMAILHUB_SEGMENT_MAX_DEPTH} deep "
                    "(EMAILHUB_SEGMENT_MAX_DEPTH)",
                )
                self.limit = "EMAILHUB_SEGMENT_MAX_DEPTH"
                return None
            self._unknown_keys(data, {kind}, path)
            return self.group(kind, data[kind], _join(path, kind), depth)
        self.conditions += 1
        if self.enforce_limits and self.conditions > settings.EMAILHUB_SEGMENT_MAX_CONDITIONS:
            return None  # parse() reports the count once
        return getattr(self, f"{kind}_condition")(data, path)

    def group(self, op: str, data: Any, path: str, depth: int) -> Node | None:
        if op == "not":
            child = self.node(data, path, depth + 1)
            return None if child is None else Not(child)
        if not isinstance(data, list) or not data:
            self.fail(path, f"must be a non-empty array of groups and conditions; got {_json_type(data)}")
            return None
        children = [self.node(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(data)]
        if any(child is None for child in children):
            return None
        return Group(op, tuple(c for c in children if c is not None))

    # --- conditions ---

    def field_condition(self, data: dict[str, Any], path: str) -> Node | None:
        name = data["field"]
        if not isinstance(name, str) or name not in FIELD_OPS:
            self.fail(
                _join(path, "field"), f"{_short(name)} is not a contact field; use one of {_names(FIELD_OPS)}"
            )
            return None
        op = self._op(data, FIELD_OPS[name], path)
        if op is None:
            return None
        self._unknown_keys(data, {"field", "op", "value"}, path)
        value_path = _join(path, "value")
        value: Any = None
        if name == "created_at":
            read = self._window if op == "within" else self._instant
            value = read(data.get("value"), value_path)
        elif op == "exists":
            self._no_value(data, path)
        elif op == "in":
            value = self._strings(data.get("value"), value_path)
            if value is not None and name == "email":
                value = [v.lower() for v in value]
        else:
            value = self._string(data.get("value"), value_path)
            if value is not None and name == "email":
                value = value.lower()
                if op == "domain":
                    value = value.removeprefix("@")
                    if not _DOMAIN.match(value):
                        self.fail(value_path, f"{_short(value)} is not a domain name (such as example.com)")
                        return None
        if name == "status" and value is not None:
            statuses = value if isinstance(value, list) else [value]
            unknown = [v for v in statuses if v not in Contact.Status.values]
            if unknown:
                self.fail(
                    value_path,
                    f"{_short(unknown[0])} is not a status; use one of {_names(Contact.Status.values)}",
                )
                return None
        if value is None and op != "exists":
            return None
        return FieldCondition(name, op, tuple(value) if isinstance(value, list) else value)

    def attribute_condition(self, data: dict[str, Any], path: str) -> Node | None:
        key = data["attribute"]
        key_path = _join(path, "attribute")
        if not isinstance(key, str) or not key or len(key) > ATTRIBUTE_KEY_MAX or _CONTROL.search(key):
            self.fail(
                key_path,
                f"must be an attribute name of 1 to {ATTRIBUTE_KEY_MAX} characters without control characters",
            )
            return None
        self._unknown_keys(data, {"attribute", "type", "op", "value"}, path)
        kind = data.get("type")
        if "type" not in data and data.get("op") == "exists":
            kind = "string"  # `exists` asks only whether the key is there
        if kind not in ATTRIBUTE_TYPES:
            self.fail(_join(path, "type"), f"must be one of {_names(ATTRIBUTE_TYPES)}; got {_short(kind)}")
            return None
        op = self._op(data, ATTRIBUTE_OPS[kind], path)
        if op is None:
            return None
        value_path = _join(path, "value")
        if op == "exists":
            self._no_value(data, path)
            return AttributeCondition(key, kind, op)
        read = {"string": self._string, "number": self._number, "boolean": self._boolean, "date": self._date}[
            kind
        ]
        if op == "in":
            items = data.get("value")
            if not isinstance(items, list) or not items or len(items) > MAX_IN_VALUES:
                self.fail(value_path, f"must be an array of 1 to {MAX_IN_VALUES} {kind} values")
                return None
            values = [read(item, f"{value_path}[{i}]") for i, item in enumerate(items)]
            if any(v is None for v in values):
                return None
            return AttributeCondition(key, kind, op, tuple(values))
        value = read(data.get("value"), value_path)
        return None if value is None else AttributeCondition(key, kind, op, value)

    def list_condition(self, data: dict[str, Any], path: str) -> Node | None:
        self._unknown_keys(data, {"list", "op"}, path)
        list_id = self._id(data["list"], _join(path, "list"), "a list")
        op = self._op(data, ("in", "not_in"), path)
        if list_id is None or op is None:
            return None
        return ListCondition(list_id, op, path)

    def engagement_condition(self, data: dict[str, Any], path: str) -> Node | None:
        kind = data["engagement"]
        if kind not in ENGAGEMENTS:
            self.fail(
                _join(path, "engagement"),
                f"{_short(kind)} is not an engagement; use one of {_names(ENGAGEMENTS)}",
            )
            return None
        self._unknown_keys(data, {"engagement", "op", "value", "within", "between", "campaign", "tag"}, path)
        op = self._op(data, ENGAGEMENT_OPS, path)
        if op is None:
            return None
        count = 1
        if op == "at_least":
            raw = data.get("value", 1)
            if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_AT_LEAST:
                self.fail(
                    _join(path, "value"),
                    f"must be a whole number of times from 1 to {MAX_AT_LEAST}; got {_short(raw)}",
                )
                return None
            count = raw
        elif "value" in data:
            self.fail(_join(path, "value"), "'none' takes no value (it means zero times)")
            return None
        if "within" in data and "between" in data:
            self.fail(path, "give 'within' or 'between', not both")
            return None
        window = None
        if "within" in data:
            window = self._window(data["within"], _join(path, "within"))
            if window is None:
                return None
        elif "between" in data:
            window = self._between(data["between"], _join(path, "between"))
            if window is None:
                return None
        campaign_id = None
        if "campaign" in data:
            campaign_id = self._id(data["campaign"], _join(path, "campaign"), "a campaign")
            if campaign_id is None:
                return None
        tag = None
        if "tag" in data:
            tag = self._tag(data["tag"], _join(path, "tag"))
            if tag is None:
                return None
        return EngagementCondition(kind, op, count, window, campaign_id, tag, path)

    # --- values ---

    def _op(self, data: dict[str, Any], allowed: tuple[str, ...], path: str) -> str | None:
        op = data.get("op")
        if op not in allowed:
            self.fail(_join(path, "op"), f"must be one of {_names(allowed)}; got {_short(op)}")
            return None
        return str(op)

    def _unknown_keys(self, data: dict[str, Any], allowed: set[str], path: str) -> None:
        for key in data:
            if key not in allowed:
                self.fail(
                    _join(path, str(key)[:40]), f"is not a key of this node; it has {_names(sorted(allowed))}"
                )

    def _no_value(self, data: dict[str, Any], path: str) -> None:
        if "value" in data:
            self.fail(_join(path, "value"), "'exists' takes no value")

    def _string(self, value: Any, path: str) -> str | None:
        if not isinstance(value, str):
            self.fail(path, f"must be a string; got {_json_type(value)}")
            return None
        if len(value) > MAX_STRING:
            self.fail(path, f"is {len(value):,} characters; at most {MAX_STRING:,}")
            return None
        if "\x00" in value:
            self.fail(path, "must not contain a NUL character")
            return None
        return value

    def _strings(self, value: Any, path: str) -> list[str] | None:
        if not isinstance(value, list) or not value or len(value) > MAX_IN_VALUES:
            self.fail(path, f"must be an array of 1 to {MAX_IN_VALUES} strings")
            return None
        items = [self._string(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return None if any(item is None for item in items) else [i for i in items if i is not None]

    def _number(self, value: Any, path: str) -> Decimal | None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            self.fail(path, f"must be a number; got {_json_type(value)}")
            return None
        number = Decimal(str(value))
        if abs(number) >= MAX_NUMBER:
            self.fail(path, f"must be between -{MAX_NUMBER:.0e} and {MAX_NUMBER:.0e}")
            return None
        return number

    def _boolean(self, value: Any, path: str) -> bool | None:
        if not isinstance(value, bool):
            self.fail(path, f"must be true or false; got {_json_type(value)}")
            return None
        return value

    def _date(self, value: Any, path: str) -> str | None:
        if not isinstance(value, str) or not _DATE.match(value):
            self.fail(path, f"must be an ISO 8601 date (YYYY-MM-DD); got {_short(value)}")
            return None
        try:
            date.fromisoformat(value)
        except ValueError:
            self.fail(path, f"{value} is not a calendar date")
            return None
        return value

    def _instant(self, value: Any, path: str) -> datetime | None:
        """An ISO 8601 instant with its offset, or a date: the day's start in UTC (`before` a
        date is before that day starts, `after` it from its start on). Years 1900 to 9998: a
        date further out is a typo, and near datetime's own bounds UTC would overflow."""
        instant = None
        try:
            if isinstance(value, str) and _DATE.match(value):
                instant = datetime.combine(date.fromisoformat(value), time(), tzinfo=UTC)
            elif isinstance(value, str) and len(value) <= 40:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
                if parsed.tzinfo is None:
                    self.fail(path, f"{value} has no UTC offset; add one (such as Z or +07:00)")
                    return None
                instant = parsed.astimezone(UTC)
        except OverflowError:  # a valid instant that leaves datetime's years once in UTC
            instant = datetime.max.replace(tzinfo=UTC)
        except ValueError:
            instant = None
        if instant is None:
            self.fail(path, f"must be an ISO 8601 date or instant with its offset; got {_short(value)}")
            return None
        if not EARLIEST <= instant <= LATEST:
            self.fail(path, f"must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}; got {_short(value)}")
            return None
        return instant

    def _window(self, value: Any, path: str) -> Window | None:
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in WINDOW_UNITS:
            self.fail(path, 'must be {"days": N} or {"hours": N}')
            return None
        unit, amount = next(iter(value.items()))
        most = MAX_WINDOW // WINDOW_UNITS[unit]
        if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= most:
            self.fail(
                _join(path, unit),
                f"must be a whole number of {unit} from 1 to {most:,}; got {_short(amount)}",
            )
            return None
        return Window(length=amount * WINDOW_UNITS[unit])

    def _between(self, value: Any, path: str) -> Window | None:
        if not isinstance(value, dict) or not value or set(value) - {"from", "to"}:
            self.fail(
                path, 'must be {"from": …, "to": …} (either may be left out), ISO 8601 dates or instants'
            )
            return None
        since = self._instant(value["from"], _join(path, "from")) if "from" in value else None
        until = None
        if "to" in value:
            until = self._instant(value["to"], _join(path, "to"))
            if until is not None and isinstance(value["to"], str) and _DATE.match(value["to"]):
                until += timedelta(days=1)  # a date `to` includes that whole day (UTC)
        if ("from" in value and since is None) or ("to" in value and until is None):
            return None
        if since is not None and until is not None and since >= until:
            self.fail(path, "'from' must be before 'to'")
            return None
        return Window(since=since, until=until)

    def _id(self, value: Any, path: str, what: str) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**63 - 1:
            self.fail(path, f"must be the id of {what} (a positive integer); got {_short(value)}")
            return None
        return value

    def _tag(self, value: Any, path: str) -> str | None:
        pattern = re.compile(rf"^[A-Za-z0-9_.:-]{{1,{settings.EMAILHUB_TAG_MAX_LENGTH}}}\Z")
        if not isinstance(value, str) or not pattern.match(value):
            self.fail(
                path,
                f"must be a tag: 1 to {settings.EMAILHUB_TAG_MAX_LENGTH} characters of letters, digits and _.:-",
            )
            return None
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _names(values: Any) -> str:
    return ", ".join(str(v) for v in values)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    text = _CONTROL.sub("?", text)
    return text if len(text) <= 60 else text[:57] + "…"


def _json_type(value: Any) -> str:
    checks: list[tuple[Callable[[Any], bool], str]] = [
        (lambda v: v is None, "null"),
        (lambda v: isinstance(v, bool), "a boolean"),
        (lambda v: isinstance(v, int | float), "a number"),
        (lambda v: isinstance(v, str), "a string"),
        (lambda v: isinstance(v, list), "an array"),
        (lambda v: isinstance(v, dict), "an object"),
    ]
    return next((name for check, name in checks if check(value)), type(value).__name__)
