"""A segment filter's tree (campaigns.segment_filter) as parameterised SQL, and the reads made
with it: a count, a sample, and the condition fan-out adds to a step.

`compile_filter` returns an SQL boolean over the contact aliased `c` and the parameters it
binds, each `%(sgN)s`: the statement is pyformat, values only ever travel as parameters. Every
condition is wrapped so it is TRUE or FALSE, never NULL, which keeps `not` the complement it
reads as (a contact without the attribute does not match `equals`, so it matches its `not`).

Relative windows ("in the last 90 days") end at an anchor: now for a count, the campaign's
start for fan-out, so every step of a campaign (and a resumed one) reads the same window.

Engagement is the delivery app's data: its SQL is delivery.selectors.engagement_sql's, composed
in here with this module's placeholders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from campaigns.exceptions import SegmentQueryTimeout
from campaigns.segment_filter import (
    AttributeCondition,
    EngagementCondition,
    FieldCondition,
    Group,
    ListCondition,
    Node,
    Not,
)
from campaigns.selectors import MAILABLE_SQL, campaign_ids_tagged
from delivery.selectors import engagement_sql

# Who may be in any audience, whatever the filter says: active, not erased, not suppressed.
AUDIENCE_SQL = f"c.anonymised_at IS NULL AND {MAILABLE_SQL}"
# The contact columns a sample shows.
SAMPLE_COLUMNS = ("id", "email", "name", "timezone", "status", "attributes", "created_at")


@dataclass
class Compiled:
    sql: str
    params: dict[str, Any] = field(default_factory=dict)


def compile_filter(node: Node, *, anchor: datetime, prefix: str = "sg", set_based: bool = False) -> Compiled:
    """The filter as an SQL boolean over `c`; relative windows end at `anchor`. `set_based` for a
    statement over every contact (a count): "at least N" groups the events once instead of
    probing them per contact, which is what a fan-out step (20,000 contacts) and a sample want."""
    compiler = _Compiler(anchor, prefix, set_based)
    return Compiled(compiler.node(node), compiler.params)


class _Compiler:
    def __init__(self, anchor: datetime, prefix: str, set_based: bool) -> None:
        self.anchor = anchor
        self.set_based = set_based
        self.prefix = prefix
        self.params: dict[str, Any] = {}

    def param(self, value: Any) -> str:
        name = f"{self.prefix}{len(self.params)}"
        self.params[name] = value
        return f"%({name})s"

    def node(self, node: Node) -> str:
        if isinstance(node, Group):
            joiner = " AND " if node.op == "and" else " OR "
            return "(" + joiner.join(self.node(child) for child in node.children) + ")"
        if isinstance(node, Not):
            return f"(NOT {self.node(node.child)})"
        if isinstance(node, FieldCondition):
            return f"coalesce({self.field(node)}, false)"
        if isinstance(node, AttributeCondition):
            return f"coalesce({self.attribute(node)}, false)"
        if isinstance(node, ListCondition):
            member = (
                "EXISTS (SELECT 1 FROM campaigns_listmembership AS lm"
                f" WHERE lm.contact_list_id = {self.param(node.list_id)} AND lm.contact_id = c.id)"
            )
            return member if node.op == "in" else f"(NOT {member})"
        return self.engagement(node)

    # --- contact fields ---

    def field(self, node: FieldCondition) -> str:
        column = f"c.{node.field}"
        op, value = node.op, node.value
        if node.field == "created_at":
            if op == "within":
                since, until = value.bounds(self.anchor)
                return f"({column} >= {self.param(since)} AND {column} < {self.param(until)})"
            return f"{column} {'<' if op == 'before' else '>='} {self.param(value)}"
        if op == "equals":
            return f"{column} = {self.param(value)}"
        if op == "not_equals":
            return f"{column} <> {self.param(value)}"
        if op == "in":
            return f"{column} = ANY({self.param(list(value))}::text[])"
        if op == "exists":
            return f"{column} <> ''"
        if op == "domain":
            return f"{column} LIKE {self.param('%@' + _like_escape(value))}"
        return f"{column} ILIKE {self.param('%' + _like_escape(value) + '%')}"  # contains

    # --- attributes ---

    def attribute(self, node: AttributeCondition) -> str:
        key = self.param(node.key)
        item = f"(c.attributes -> {key})"
        op, kind, value = node.op, node.type, node.value
        if op == "exists":
            return f"(jsonb_typeof({item}) <> 'null')"
        if op == "not_equals":
            equals = self.attribute(AttributeCondition(node.key, kind, "equals", value))
            return f"(NOT coalesce({equals}, false))"  # a missing attribute is "not equal"
        if kind == "date":
            # An ISO 8601 date or instant, compared by its date: text order is date order.
            day = f"left(c.attributes ->> {key}, 10)"
            guard = f"jsonb_typeof({item}) = 'string' AND (c.attributes ->> {key}) ~ '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}'"
            if op == "in":
                return (
                    f"(CASE WHEN {guard} THEN {day} = ANY({self.param(list(value))}::text[]) ELSE false END)"
                )
            return f"(CASE WHEN {guard} THEN {day} {_COMPARE[op]} {self.param(value)} ELSE false END)"
        if kind == "number":
            # A JSON number, or a string that is one ("42": a CSV import stores every attribute
            # as text); the cast only behind the guards, so no value can make the statement fail.
            number = (
                f"(CASE jsonb_typeof({item}) WHEN 'number' THEN {item}::numeric"
                f" WHEN 'string' THEN CASE WHEN (c.attributes ->> {key}) ~ '{_NUMERIC_TEXT}'"
                f" THEN (c.attributes ->> {key})::numeric END END)"
            )
            if op == "in":
                return f"({number} = ANY({self.param(list(value))}::numeric[]))"
            return f"({number} {_COMPARE[op]} {self.param(value)}::numeric)"
        if kind == "boolean":  # equals: a JSON boolean, or the string "true" / "false" (any case)
            truth = (
                f"(CASE jsonb_typeof({item}) WHEN 'boolean' THEN {item}::boolean"
                f" WHEN 'string' THEN CASE lower(c.attributes ->> {key}) WHEN 'true' THEN true"
                f" WHEN 'false' THEN false END END)"
            )
            return f"({truth} = {self.param(value)})"
        if op == "equals":
            # Containment: exact type and value (a string attribute equals a string).
            return f"(c.attributes @> {self.param(json.dumps({node.key: _json(value)}))}::jsonb)"
        if op == "in":
            return f"({item} = ANY({self.param([json.dumps(_json(v)) for v in value])}::jsonb[]))"
        pattern = self.param("%" + _like_escape(value) + "%")  # contains
        return (
            f"(CASE jsonb_typeof({item}) WHEN 'string' THEN (c.attributes ->> {key}) ILIKE {pattern}"
            f" WHEN 'array' THEN {item} @> jsonb_build_array({self.param(value)}::text) ELSE false END)"
        )

    # --- engagement ---

    def engagement(self, node: EngagementCondition) -> str:
        since = until = None
        if node.window is not None:
            low, high = node.window.bounds(self.anchor)
            since = self.param(low) if low is not None else None
            until = self.param(high) if high is not None else None
        tag = tagged = None
        if node.tag is not None:
            tag = self.param(node.tag)
            tagged = f"{self.param(campaign_ids_tagged(node.tag))}::bigint[]"
        return engagement_sql(
            node.kind,
            at_least=0 if node.op == "none" else node.count,
            since=since,
            until=until,
            campaign=self.param(node.campaign_id) if node.campaign_id is not None else None,
            tag=tag,
            tagged_campaigns=tagged,
            set_based=self.set_based,
        )


_COMPARE = {"equals": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
# A number written as text: an optional sign, digits, an optional fraction (no exponent, no
# spaces), short enough for any numeric.
_NUMERIC_TEXT = "^-?[0-9]{1,15}([.][0-9]{1,15})?$"


def _like_escape(value: str) -> str:
    """A LIKE pattern matching `value` literally (backslash is LIKE's escape character)."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _json(value: Any) -> Any:
    """A parsed value as JSON: a Decimal as an int or a float, the rest as it is."""
    if not isinstance(value, Decimal):
        return value
    return int(value) if value == value.to_integral_value() else float(value)


# --- reads --------------------------------------------------------------------------------------


def _audience_where(node: Node | None, list_id: int | None, anchor: datetime, *, set_based: bool) -> Compiled:
    """Who may be mailed, matching the filter, narrowed to a list's members (the filter's own
    list condition) with `list_id`."""
    if list_id is not None:
        narrowed = ListCondition(list_id, "in")
        node = narrowed if node is None else Group("and", (node, narrowed))
    compiled = (
        compile_filter(node, anchor=anchor, set_based=set_based) if node is not None else Compiled("true")
    )
    return Compiled(f"{AUDIENCE_SQL} AND {compiled.sql}", compiled.params)


# What a count or sample runs with, beside the timeout: no JIT (it compiled for 110–210 ms of
# every count, more than it saved), and room to hash a million addresses in memory instead of
# spilling 8–32 batches to temporary files (bench/segments.py). Local to the read.
_READ_SETTINGS = {"jit": "off", "work_mem": "64MB"}


def _run(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a read under the segment query timeout. The settings are this statement's only: set
    for the read (SET LOCAL, in a savepoint when the caller's transaction is open) and put back
    after it, so a caller's later statements in the same transaction keep their own."""
    wanted = {
        **_READ_SETTINGS,
        "statement_timeout": str(int(settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS * 1000)),
    }
    names = list(wanted)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT " + ", ".join("current_setting(%s), set_config(%s, %s, true)" for _ in names),
                [value for name in names for value in (name, name, wanted[name])],
            )
            previous = cursor.fetchone()[::2]
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            cursor.execute(
                "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in names),
                [value for name, old in zip(names, previous, strict=True) for value in (name, old)],
            )
            return rows
    except DatabaseError as exc:
        if getattr(exc.__cause__, "pgcode", None) == "57014":  # query_canceled (a failed savepoint
            # or transaction takes the SET LOCAL with it)
            raise SegmentQueryTimeout(
                f"the segment's query ran longer than {settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS:g} s "
                "(EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS) and was stopped; narrow the filter"
            ) from exc
        raise


def count(node: Node | None, *, list_id: int | None = None, anchor: datetime | None = None) -> int:
    """How many contacts the filter's audience has now (narrowed to a list's members with
    `list_id`): what a fan-out started now would create, before per-message checks."""
    where = _audience_where(node, list_id, anchor or timezone.now(), set_based=True)
    return int(_run(f"SELECT count(*) FROM campaigns_contact AS c WHERE {where.sql}", where.params)[0][0])


def sample(
    node: Node | None, *, size: int, list_id: int | None = None, anchor: datetime | None = None
) -> list[dict[str, Any]]:
    """The first `size` contacts of the audience, by id."""
    where = _audience_where(node, list_id, anchor or timezone.now(), set_based=False)
    where.params["sg_size"] = min(size, settings.EMAILHUB_SEGMENT_SAMPLE_MAX)
    columns = ", ".join(f"c.{name}" for name in SAMPLE_COLUMNS)
    rows = _run(
        f"SELECT {columns} FROM campaigns_contact AS c WHERE {where.sql} ORDER BY c.id LIMIT %(sg_size)s",
        where.params,
    )
    contacts = [dict(zip(SAMPLE_COLUMNS, row, strict=True)) for row in rows]
    for contact in contacts:  # a raw cursor leaves jsonb undecoded (Django decodes in the field)
        if isinstance(contact["attributes"], str):
            contact["attributes"] = json.loads(contact["attributes"])
    return contacts
