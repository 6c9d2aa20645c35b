"""Segments (issue 23): the filter language, its SQL, the audience rule and segment fan-out, on the
real PostgreSQL.

Most tests read a filter two ways: `selected` compiles it (campaigns.segment_sql.compile_filter)
and runs it over every contact, whatever its status, and also checks that the filter and its
`not` split the contacts in two (every condition is TRUE or FALSE, never NULL); `audience` reads
it as the API does (count and sample: active, not erased, not suppressed contacts only) and
checks that the count and the sample agree.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis as redis_lib
import time_machine
from django.conf import settings as django_settings
from django.db import connection

from campaigns import fanout, lifecycle, segment_sql, segments
from campaigns.erasure import erase_contacts
from campaigns.exceptions import (
    CampaignStateError,
    InvalidFilter,
    ListInUse,
    SegmentInUse,
    SegmentQueryTimeout,
)
from campaigns.models import Campaign, Contact, ContactList, Segment, Suppression
from campaigns.segment_filter import parse
from campaigns.services import add_list_members, delete_contact_list
from delivery.models import EmailEvent, Message
from delivery.services import transitions
from scheduling import recurring
from scheduling.exceptions import NoAudience
from scheduling.models import RecurringSchedule
from tests import factories
from tests.broker import queued_tasks
from tests.conftest import wait_until
from tests.locks import table_locked

# The instant relative windows end at, where a test does not say otherwise.
NOW = datetime(2024, 6, 15, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


# --- helpers ------------------------------------------------------------------------------------


def add(email: str, **fields: Any) -> Contact:
    return Contact.objects.create(email=email, **fields)


def everyone() -> set[str]:
    return set(Contact.objects.values_list("email", flat=True))


def _run_filter(data: Any, anchor: datetime) -> set[str]:
    compiled = segment_sql.compile_filter(parse(data), anchor=anchor)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT c.email FROM campaigns_contact AS c WHERE {compiled.sql}", compiled.params)
        return {row[0] for row in cursor.fetchall()}


def selected(data: Any, *, anchor: datetime = NOW) -> set[str]:
    """The emails of every contact (any status) the filter matches; the filter and its `not`
    partition the contacts."""
    matched = _run_filter(data, anchor)
    negated = _run_filter({"not": data}, anchor)
    assert not matched & negated, f"a contact matches both the filter and its not: {matched & negated}"
    assert matched | negated == everyone(), (
        f"neither the filter nor its not: {everyone() - matched - negated}"
    )
    return matched


def audience(data: Any, *, list_id: int | None = None, anchor: datetime | None = None) -> set[str]:
    """The emails of the filter's audience (count and sample, which must agree)."""
    node = segments.validate(data)
    rows = segment_sql.sample(node, size=50, list_id=list_id, anchor=anchor)
    emails = {row["email"] for row in rows}
    assert len(emails) == len(rows)
    assert segment_sql.count(node, list_id=list_id, anchor=anchor) == len(emails)
    return emails


def refusal(data: Any) -> InvalidFilter:
    with pytest.raises(InvalidFilter) as caught:
        segments.validate(data)
    return caught.value


def attr(key: str, kind: str, op: str, value: Any = ...) -> dict[str, Any]:
    node: dict[str, Any] = {"attribute": key, "type": kind, "op": op}
    if value is not ...:
        node["value"] = value
    return node


def field(name: str, op: str, value: Any = ...) -> dict[str, Any]:
    node: dict[str, Any] = {"field": name, "op": op}
    if value is not ...:
        node["value"] = value
    return node


def sent_to(
    email: str,
    at: datetime = NOW - timedelta(days=3),
    *,
    campaign: Campaign | None = None,
    tags: list[str] | None = None,
    sent: bool = True,
) -> Message:
    """A message to `email` (sent at `at` unless `sent` is False), of `campaign` if given."""
    contact = Contact.objects.get(email=email.lower()) if campaign is not None else None
    return Message.objects.create(
        to_email=email,
        campaign=campaign,
        contact=contact,
        subject="s",
        text="x",
        priority="normal",
        status="sent" if sent else "queued",
        sent_at=at if sent else None,
        tags=tags,
    )


def hit(message: Message, kind: str, at: datetime, classification: str = "") -> EmailEvent:
    """An event of `message`; a human open or click also sets the message's first one, as
    delivery.services.events.record_events does."""
    if classification == "human" and kind in ("opened", "clicked"):
        first = {message.pk: at}  # a person's click is an open too
        transitions.record_first_engagement(first, first if kind == "clicked" else {})
    return EmailEvent.objects.create(
        message=message,
        kind=kind,
        recipient=message.to_email.lower(),
        occurred_at=at,
        classification=classification,
    )


def opened(message: Message, at: datetime = NOW - timedelta(days=2), classification: str = "human") -> None:
    hit(message, "opened", at, classification)


def tables_intact() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_regclass('campaigns_contact'), to_regclass('campaigns_campaign'),"
            " to_regclass('delivery_message')"
        )
        assert all(cursor.fetchone())


# --- 1. contact fields --------------------------------------------------------------------------


@pytest.fixture
def people() -> None:
    add("ann@example.com", name="Ann Lee", timezone="Europe/Berlin")
    add("bob@other.org", timezone="America/New_York")  # no name
    add("a_b@example.com", name="Under_Score")
    add("axb@example.com", name="Under Score")
    add("50%off@example.com", name="100% Deal")
    add("50xoff@example.com", name="100x Deal")
    add("carl@sub.example.com", name="carl", timezone="Asia/Ho_Chi_Minh")
    add("dan@notexample.com", name="Dan", status="bounced")
    add("eve@example.org", name="Eve", status="unsubscribed", timezone="Europe/Berlin")
    add("back\\slash@example.com", name="Back\\slash")


EXAMPLE_COM = {
    "ann@example.com",
    "a_b@example.com",
    "axb@example.com",
    "50%off@example.com",
    "50xoff@example.com",
    "back\\slash@example.com",
}
NAMED = EXAMPLE_COM | {"carl@sub.example.com", "dan@notexample.com", "eve@example.org"}  # all but bob


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (field("email", "equals", "ANN@Example.COM"), {"ann@example.com"}),
        (field("email", "equals", "ann@example.co"), set()),
        (field("email", "in", ["Bob@Other.org", "CARL@sub.example.com", "nobody@x.org"]), {"bob@other.org", "carl@sub.example.com"}),
        (field("email", "domain", "Example.COM"), EXAMPLE_COM),
        (field("email", "domain", "@example.com"), EXAMPLE_COM),
        (field("email", "domain", "sub.example.com"), {"carl@sub.example.com"}),
        (field("email", "contains", "A_B"), {"a_b@example.com"}),  # `_` is not LIKE's any-character
        (field("email", "contains", "50%"), {"50%off@example.com"}),  # `%` is not LIKE's anything
        (field("email", "contains", "%"), {"50%off@example.com"}),
        (field("email", "contains", "\\"), {"back\\slash@example.com"}),
        (field("email", "contains", "EXAMPLE.C"), EXAMPLE_COM | {"carl@sub.example.com", "dan@notexample.com"}),
        (field("name", "equals", "Ann Lee"), {"ann@example.com"}),
        (field("name", "equals", "ann lee"), set()),
        (field("name", "contains", "SCORE"), {"a_b@example.com", "axb@example.com"}),
        (field("name", "contains", "r_S"), {"a_b@example.com"}),
        (field("name", "contains", "0%"), {"50%off@example.com"}),
        (field("name", "exists"), NAMED),
        (field("timezone", "equals", "Europe/Berlin"), {"ann@example.com", "eve@example.org"}),
        (field("timezone", "in", ["America/New_York", "Asia/Ho_Chi_Minh"]), {"bob@other.org", "carl@sub.example.com"}),
        (field("status", "equals", "bounced"), {"dan@notexample.com"}),
        (field("status", "in", ["bounced", "unsubscribed"]), {"dan@notexample.com", "eve@example.org"}),
    ],
)  # fmt: skip
def test_field_conditions_select_exactly_their_contacts(people: None, node: dict, expected: set) -> None:
    assert selected(node) == expected


def test_not_equals_on_fields_is_the_complement_of_equals(people: None) -> None:
    assert selected(field("email", "not_equals", "Ann@example.com")) == everyone() - {"ann@example.com"}
    assert selected(field("name", "not_equals", "Ann Lee")) == everyone() - {"ann@example.com"}
    assert selected(field("timezone", "not_equals", "UTC")) == {
        "ann@example.com",
        "bob@other.org",
        "carl@sub.example.com",
        "eve@example.org",
    }
    assert selected(field("status", "not_equals", "active")) == {"dan@notexample.com", "eve@example.org"}
    assert selected({"not": field("name", "exists")}) == {"bob@other.org"}


def test_created_at_before_after_and_within(people: None) -> None:
    Contact.objects.update(created_at=NOW - timedelta(days=400))
    Contact.objects.filter(email="ann@example.com").update(created_at=datetime(2024, 6, 1, 0, 0, tzinfo=UTC))
    Contact.objects.filter(email="bob@other.org").update(
        created_at=datetime(2024, 5, 31, 23, 59, 59, tzinfo=UTC)
    )
    Contact.objects.filter(email="carl@sub.example.com").update(
        created_at=NOW - timedelta(days=7, seconds=-1)
    )
    Contact.objects.filter(email="a_b@example.com").update(created_at=NOW - timedelta(days=7, seconds=1))
    recent = {"ann@example.com", "carl@sub.example.com", "a_b@example.com"}
    # A date is the start of that day (UTC): `before` it is before midnight, `after` from midnight.
    assert selected(field("created_at", "after", "2024-06-01")) == recent
    assert selected(field("created_at", "before", "2024-06-01")) == everyone() - recent
    # An instant with its offset: 2024-06-01T02:00+02:00 is midnight UTC.
    assert selected(field("created_at", "after", "2024-06-01T02:00:00+02:00")) == recent
    assert selected(field("created_at", "before", "2024-06-01T00:00:00Z")) == everyone() - recent
    # `within` ends at the anchor: 7 days is 7 × 24 h before it.
    assert selected(field("created_at", "within", {"days": 7})) == {"carl@sub.example.com"}
    assert selected(field("created_at", "within", {"hours": 7 * 24 + 1})) == {
        "carl@sub.example.com",
        "a_b@example.com",
    }


# --- 2. attributes ------------------------------------------------------------------------------


@pytest.fixture
def attributed() -> None:
    add(
        "a1@x.org",
        attributes={"city": "Hanoi", "age": 30, "vip": True, "born": "1990-05-17", "tags": ["gold", "early"], "score": 4.5},
    )  # fmt: skip
    add(
        "a2@x.org",
        attributes={"city": "hanoi", "age": 30.0, "vip": False, "born": "1990-05-17T23:30:00+02:00", "tags": ["silver"]},
    )  # fmt: skip
    add(
        "a3@x.org",
        attributes={"city": "Ho Chi Minh City", "age": "42", "vip": "true", "born": "not a date", "tags": "gold bars"},
    )  # fmt: skip
    add("a4@x.org", attributes={"city": None, "age": None, "vip": None, "born": None, "tags": None})
    add("a5@x.org")  # no attributes at all
    add("a6@x.org", attributes={"city": "Paris", "age": 42, "born": "2001-01-02", "score": 4})


def others(*emails: str) -> set[str]:
    return everyone() - {f"{email}@x.org" for email in emails}


def at(*names: str) -> set[str]:
    return {f"{name}@x.org" for name in names}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        # string
        (attr("city", "string", "equals", "Hanoi"), at("a1")),
        (attr("city", "string", "in", ["hanoi", "Paris", "Lyon"]), at("a2", "a6")),
        (attr("city", "string", "contains", "HAN"), at("a1", "a2")),  # a substring, any case
        (attr("tags", "string", "contains", "gold"), at("a1", "a3")),  # an element of an array, or a substring
        (attr("tags", "string", "contains", "gol"), at("a3")),  # an array's element, not part of one
        (attr("tags", "string", "equals", "gold"), set()),  # equals is the whole value, not an array's element
        (attr("city", "string", "exists"), at("a1", "a2", "a3", "a6")),  # JSON null is not there
        (attr("city", "string", "equals", "30"), set()),
        # number: 30 and 30.0 are one number; the string "42" (a CSV import's) is 42 too
        (attr("age", "number", "equals", 30), at("a1", "a2")),
        (attr("age", "number", "equals", 30.0), at("a1", "a2")),
        (attr("age", "number", "equals", 42), at("a3", "a6")),
        (attr("age", "number", "in", [42, 7]), at("a3", "a6")),
        (attr("age", "number", "in", [30.0]), at("a1", "a2")),
        (attr("age", "number", "gt", 30), at("a3", "a6")),
        (attr("age", "number", "gte", 30), at("a1", "a2", "a3", "a6")),
        (attr("age", "number", "lt", 42), at("a1", "a2")),
        (attr("age", "number", "lte", 42), at("a1", "a2", "a3", "a6")),
        (attr("age", "number", "gt", -1e14), at("a1", "a2", "a3", "a6")),
        (attr("score", "number", "gt", 4.25), at("a1")),
        (attr("score", "number", "equals", 4.0), at("a6")),
        (attr("age", "number", "exists"), at("a1", "a2", "a3", "a6")),
        # boolean: the string "true" (a CSV import's) is true too
        (attr("vip", "boolean", "equals", True), at("a1", "a3")),
        (attr("vip", "boolean", "equals", False), at("a2")),
        (attr("vip", "boolean", "exists"), at("a1", "a2", "a3")),
        # date: dates and date-times by their date; "not a date" never matches
        (attr("born", "date", "equals", "1990-05-17"), at("a1", "a2")),
        (attr("born", "date", "in", ["2001-01-02", "1999-12-31"]), at("a6")),
        (attr("born", "date", "gt", "1990-05-17"), at("a6")),
        (attr("born", "date", "gte", "1990-05-17"), at("a1", "a2", "a6")),
        (attr("born", "date", "lt", "2001-01-02"), at("a1", "a2")),
        (attr("born", "date", "lte", "2001-01-02"), at("a1", "a2", "a6")),
        (attr("born", "date", "gt", "1000-01-01"), at("a1", "a2", "a6")),
        (attr("born", "date", "lt", "9999-12-31"), at("a1", "a2", "a6")),
        (attr("born", "date", "exists"), at("a1", "a2", "a3", "a6")),
        (attr("city", "date", "lt", "9999-12-31"), set()),  # strings that are not dates
        (attr("age", "date", "gt", "1000-01-01"), set()),  # numbers are not dates
        # exists without a type asks only whether the key is there
        ({"attribute": "score", "op": "exists"}, at("a1", "a6")),
    ],
)  # fmt: skip
def test_attribute_conditions_select_exactly_their_contacts(
    attributed: None, node: dict, expected: set[str]
) -> None:
    assert selected(node) == expected


@pytest.mark.parametrize(
    ("node", "matched"),
    [
        (attr("city", "string", "not_equals", "Hanoi"), ("a1",)),
        (attr("age", "number", "not_equals", 30), ("a1", "a2")),
        (attr("age", "number", "not_equals", 42), ("a3", "a6")),  # a3's "42" is 42
        (attr("vip", "boolean", "not_equals", True), ("a1", "a3")),
        (attr("born", "date", "not_equals", "1990-05-17"), ("a1", "a2")),
    ],
)
def test_not_equals_includes_contacts_without_the_attribute_or_with_null(
    attributed: None, node: dict, matched: tuple[str, ...]
) -> None:
    assert selected(node) == others(*matched)
    assert at("a4", "a5") <= selected(node)


@pytest.mark.parametrize(
    "node",
    [
        attr("nothing", "string", "equals", "x"),
        attr("nothing", "string", "contains", "x"),
        attr("nothing", "number", "gt", -1),
        attr("nothing", "number", "in", [0]),
        attr("nothing", "boolean", "equals", False),
        attr("nothing", "date", "lt", "9999-12-31"),
        attr("nothing", "string", "exists"),
    ],
)
def test_a_condition_on_a_missing_or_null_attribute_is_false_and_its_not_true(
    attributed: None, node: dict
) -> None:
    Contact.objects.filter(email="a4@x.org").update(attributes={"nothing": None})
    assert selected(node) == set()
    assert selected({"not": node}) == everyone()


# --- 3. composition -----------------------------------------------------------------------------


def test_and_or_not_compose_including_nested_groups(attributed: None) -> None:
    hanoi = attr("city", "string", "contains", "hanoi")
    thirty = attr("age", "number", "equals", 30)
    vip = attr("vip", "boolean", "equals", True)
    adult = attr("age", "number", "gte", 40)
    assert selected({"and": [hanoi, vip]}) == at("a1")
    assert selected({"or": [vip, adult]}) == at("a1", "a3", "a6")  # a3's "true" and "42" (text)
    assert selected({"and": [thirty, {"not": vip}]}) == at("a2")
    assert selected({"not": {"or": [thirty, adult]}}) == at("a4", "a5")
    assert selected(
        {"or": [{"and": [hanoi, {"not": vip}]}, {"and": [adult, {"not": {"not": adult}}]}]}
    ) == at("a2", "a3", "a6")
    assert selected({"and": [{"or": [vip, adult]}, {"or": [hanoi, {"not": thirty}]}]}) == at("a1", "a3", "a6")
    assert selected({"and": [hanoi]}) == selected({"or": [hanoi]}) == at("a1", "a2")


# --- 4. lists -----------------------------------------------------------------------------------


def test_list_in_and_not_in_and_a_count_narrowed_to_a_list(attributed: None) -> None:
    members = ContactList.objects.create(name="members")
    add_list_members(
        members, list(Contact.objects.filter(email__in=at("a1", "a2", "a3")).values_list("id", flat=True))
    )
    other = ContactList.objects.create(name="other")
    assert selected({"list": members.pk, "op": "in"}) == at("a1", "a2", "a3")
    assert selected({"list": members.pk, "op": "not_in"}) == at("a4", "a5", "a6")
    assert selected({"list": other.pk, "op": "in"}) == set()
    assert audience(
        {"and": [{"list": members.pk, "op": "in"}, attr("city", "string", "contains", "han")]}
    ) == at("a1", "a2")
    assert audience(attr("city", "string", "contains", "h"), list_id=members.pk) == at("a1", "a2", "a3")
    assert audience({"list": members.pk, "op": "not_in"}, list_id=members.pk) == set()


# --- 5. engagement ------------------------------------------------------------------------------


@pytest.fixture
def readers() -> None:
    for name in ("human", "twice", "machines", "silent", "never", "old", "clicker", "bot"):
        add(f"{name}@r.org")
    human = sent_to("human@r.org")
    opened(human)
    twice = sent_to("twice@r.org")
    opened(twice, NOW - timedelta(days=1))
    opened(twice, NOW - timedelta(hours=3))
    opened(twice, NOW - timedelta(hours=2), "machine")
    machines = sent_to("MACHINES@R.org")  # the address as a client wrote it
    for classification in ("machine", "proxy", "bot", "scanner", ""):
        opened(machines, NOW - timedelta(days=1), classification)
    sent_to("silent@r.org")  # sent, nothing heard back
    sent_to("never@r.org", sent=False)  # queued, never sent
    old = sent_to("old@r.org", NOW - timedelta(days=60))
    opened(old, NOW - timedelta(days=59))
    clicker = sent_to("clicker@r.org")
    opened(clicker, NOW - timedelta(hours=30))
    hit(clicker, "clicked", NOW - timedelta(hours=30), "human")
    bot = sent_to("bot@r.org")
    hit(bot, "clicked", NOW - timedelta(hours=1), "bot")
    hit(bot, "clicked", NOW - timedelta(hours=1), "scanner")
    hit(bot, "bounced", NOW - timedelta(hours=1))
    hit(sent_to("bot@r.org"), "complained", NOW - timedelta(hours=1))
    hit(sent_to("silent@r.org"), "unsubscribed", NOW - timedelta(days=20))


def r(*names: str) -> set[str]:
    return {f"{name}@r.org" for name in names}


def engaged(kind: str, op: str = "at_least", **extra: Any) -> dict[str, Any]:
    return {"engagement": kind, "op": op, **extra}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (engaged("opened"), r("human", "twice", "old", "clicker")),  # human opens only
        (engaged("opened", value=1), r("human", "twice", "old", "clicker")),
        (engaged("opened", value=2), r("twice", "clicker")),  # machine opens do not count; a click is an open
        (engaged("opened", value=3), set()),
        (engaged("opened", "none"), r("machines", "silent", "never", "bot")),  # never opened
        (engaged("opened", within={"days": 7}), r("human", "twice", "clicker")),
        (engaged("opened", within={"hours": 24}), r("twice")),
        (engaged("opened", within={"hours": 4}), r("twice")),
        (engaged("opened", value=2, within={"hours": 4}), set()),
        (engaged("opened", "none", within={"days": 7}), r("machines", "silent", "never", "bot", "old")),
        (engaged("clicked"), r("clicker")),  # bot and scanner clicks are not clicks
        (engaged("clicked", "none"), r("human", "twice", "machines", "silent", "never", "old", "bot")),
        (engaged("bounced"), r("bot")),
        (engaged("complained"), r("bot")),
        (engaged("unsubscribed"), r("silent")),
        (engaged("unsubscribed", within={"days": 7}), set()),
        (engaged("sent"), r("human", "twice", "machines", "silent", "old", "clicker", "bot")),  # `never` was not sent
        (engaged("sent", value=2), r("silent", "bot")),
        (engaged("sent", "none"), r("never")),
        (engaged("sent", within={"days": 30}), r("human", "twice", "machines", "silent", "clicker", "bot")),
    ],
)  # fmt: skip
def test_engagement_counts_what_was_sent_and_heard_back_human_opens_only(
    readers: None, node: dict, expected: set[str]
) -> None:
    assert selected(node) == expected


@pytest.mark.parametrize("classification", ["machine", "proxy", "bot", "scanner", ""])
def test_the_machine_open_rule_no_non_human_open_or_click_ever_counts(classification: str) -> None:
    add("reader@r.org")
    message = sent_to("reader@r.org")
    for _ in range(3):
        hit(message, "opened", NOW - timedelta(hours=1), classification)
        hit(message, "clicked", NOW - timedelta(hours=1), classification)
    for kind in ("opened", "clicked"):
        assert selected(engaged(kind)) == set()
        assert selected(engaged(kind, "none", within={"days": 1})) == {"reader@r.org"}
        assert audience(engaged(kind, "none"), anchor=NOW) == {"reader@r.org"}
    opened(message, NOW - timedelta(hours=1), "human")
    assert selected(engaged("opened", within={"days": 1})) == {"reader@r.org"}
    assert selected(engaged("opened", value=2)) == set()


def test_between_dates_includes_the_whole_to_day_and_the_from_instant() -> None:
    moments = {
        "before": datetime(2024, 4, 30, 23, 59, 59, tzinfo=UTC),
        "first": datetime(2024, 5, 1, 0, 0, tzinfo=UTC),
        "last": datetime(2024, 5, 10, 23, 59, 59, 999999, tzinfo=UTC),
        "after": datetime(2024, 5, 11, 0, 0, tzinfo=UTC),
    }
    for name, moment in moments.items():
        add(f"{name}@r.org")
        opened(sent_to(f"{name}@r.org", moment - timedelta(minutes=1)), moment)
    assert selected(engaged("opened", between={"from": "2024-05-01", "to": "2024-05-10"})) == r(
        "first", "last"
    )
    assert selected(engaged("opened", between={"from": "2024-05-01"})) == r("first", "last", "after")
    assert selected(engaged("opened", between={"to": "2024-05-10"})) == r("before", "first", "last")
    # An instant `to` is exclusive; offsets are honoured.
    assert selected(
        engaged("opened", between={"from": "2024-05-01T02:00:00+02:00", "to": "2024-05-11T00:00:00Z"})
    ) == r("first", "last")
    assert selected(
        engaged("opened", between={"from": "2024-04-30T23:59:59Z", "to": "2024-05-01T00:00:00Z"})
    ) == r("before")


def test_did_not_open_campaign_x_and_engagement_of_one_campaign() -> None:
    for name in ("opener", "machine", "silent", "elsewhere", "transactional"):
        add(f"{name}@r.org")
    x = factories.campaign("x", status="completed")
    y = factories.campaign("y", status="completed")
    opened(sent_to("opener@r.org", campaign=x))
    opened(sent_to("machine@r.org", campaign=x), classification="proxy")
    sent_to("silent@r.org", campaign=x)
    opened(sent_to("elsewhere@r.org", campaign=y))  # opened another campaign, never got x
    opened(sent_to("transactional@r.org"))  # an open of mail that is not x's
    not_opened_x = {
        "and": [engaged("sent", campaign=x.pk), engaged("opened", "none", campaign=x.pk)],
    }
    assert selected(not_opened_x) == r("machine", "silent")
    assert audience(not_opened_x, anchor=NOW) == r("machine", "silent")
    assert selected(engaged("opened", campaign=x.pk)) == r("opener")
    assert selected(engaged("sent", campaign=x.pk)) == r("opener", "machine", "silent")
    assert selected(engaged("opened", campaign=y.pk)) == r("elsewhere")


def test_engagement_by_tag_counts_the_messages_tags_and_its_campaigns_tags() -> None:
    for name in ("own", "campaign", "untagged", "othertag", "both"):
        add(f"{name}@r.org")
    promo = factories.campaign("promo", status="completed", tags=["promo", "spring"])
    plain = factories.campaign("plain", status="completed", tags=["news"])
    opened(sent_to("own@r.org", tags=["promo"]))
    opened(sent_to("campaign@r.org", campaign=promo))
    opened(sent_to("untagged@r.org", campaign=plain))
    opened(sent_to("othertag@r.org", tags=["promotion"]))
    sent_to("both@r.org", tags=["promo"])  # sent, not opened
    assert selected(engaged("opened", tag="promo")) == r("own", "campaign")
    assert selected(engaged("opened", tag="spring")) == r("campaign")
    assert selected(engaged("sent", tag="promo")) == r("own", "campaign", "both")
    assert selected(engaged("opened", "none", tag="promo")) == r("untagged", "othertag", "both")
    assert selected(engaged("opened", tag="news", campaign=plain.pk)) == r("untagged")
    assert selected(engaged("opened", tag="nothing-has-it")) == set()


# --- 6. relative windows across DST -------------------------------------------------------------

# Instants 12 hours after a DST change: "the last day" before them spans the change.
DST_ANCHORS = {
    "berlin-spring": (datetime(2024, 3, 31, 1, 0, tzinfo=UTC) + timedelta(hours=12), "Europe/Berlin"),
    "berlin-autumn": (datetime(2024, 10, 27, 1, 0, tzinfo=UTC) + timedelta(hours=12), "Europe/Berlin"),
    "new-york-spring": (datetime(2024, 3, 10, 7, 0, tzinfo=UTC) + timedelta(hours=12), "America/New_York"),
    "new-york-autumn": (datetime(2024, 11, 3, 6, 0, tzinfo=UTC) + timedelta(hours=12), "America/New_York"),
}


def _dst_readers(anchor: datetime, zone: str) -> None:
    for tz in (zone, "UTC", "Pacific/Auckland"):
        slug = tz.replace("/", "-").lower()
        inside = add(f"inside-{slug}@r.org", timezone=tz).email
        outside = add(f"outside-{slug}@r.org", timezone=tz).email
        opened(
            sent_to(inside, anchor - timedelta(days=3)), anchor - timedelta(hours=24) + timedelta(seconds=1)
        )
        opened(
            sent_to(outside, anchor - timedelta(days=3)), anchor - timedelta(hours=24) - timedelta(seconds=1)
        )
        Contact.objects.filter(email=inside).update(
            created_at=anchor - timedelta(hours=24) + timedelta(seconds=1)
        )
        Contact.objects.filter(email=outside).update(
            created_at=anchor - timedelta(hours=24) - timedelta(seconds=1)
        )


def _inside(zone: str) -> set[str]:
    return {f"inside-{tz.replace('/', '-').lower()}@r.org" for tz in (zone, "UTC", "Pacific/Auckland")}


@pytest.mark.parametrize("case", list(DST_ANCHORS))
def test_a_relative_window_is_an_exact_duration_across_dst_whatever_the_contacts_timezone(case: str) -> None:
    anchor, zone = DST_ANCHORS[case]
    _dst_readers(anchor, zone)
    inside = _inside(zone)
    for window in ({"days": 1}, {"hours": 24}):
        assert selected(engaged("opened", within=window), anchor=anchor) == inside
        assert selected(field("created_at", "within", window), anchor=anchor) == inside
        assert audience(engaged("opened", within=window), anchor=anchor) == inside
    # A count with no anchor ends the window now: the clock, moved to the anchor.
    with time_machine.travel(anchor, tick=False):
        assert audience(engaged("opened", within={"days": 1})) == inside
        assert segments.count(field("created_at", "within", {"days": 1})) == len(inside)


@pytest.mark.parametrize("case", list(DST_ANCHORS))
def test_a_relative_window_is_exact_even_when_the_anchor_is_given_in_local_time(case: str) -> None:
    anchor, zone = DST_ANCHORS[case]
    _dst_readers(anchor, zone)
    local_anchor = anchor.astimezone(ZoneInfo(zone))  # the same instant
    assert selected(engaged("opened", within={"days": 1}), anchor=local_anchor) == _inside(zone)


def test_a_relative_window_ends_at_its_anchor() -> None:
    anchor = NOW
    add("before@w.org")
    add("after@w.org")
    opened(sent_to("before@w.org", anchor - timedelta(days=2)), anchor - timedelta(hours=1))
    opened(sent_to("after@w.org", anchor - timedelta(days=2)), anchor + timedelta(hours=1))
    Contact.objects.filter(email="before@w.org").update(created_at=anchor - timedelta(hours=1))
    Contact.objects.filter(email="after@w.org").update(created_at=anchor + timedelta(hours=1))
    assert selected(engaged("opened", within={"days": 1}), anchor=anchor) == {"before@w.org"}
    assert selected(engaged("opened", "none", within={"days": 1}), anchor=anchor) == {"after@w.org"}
    assert selected(field("created_at", "within", {"days": 1}), anchor=anchor) == {"before@w.org"}


# --- 7. who is never in an audience -------------------------------------------------------------


@pytest.fixture
def excluded() -> dict[str, Contact]:
    contacts = {
        "active": add("active@z.org", attributes={"plan": "gold"}),
        "suppressed": add("suppressed@z.org", attributes={"plan": "gold"}),
        "bounced": add("bounced@z.org", status="bounced", attributes={"plan": "gold"}),
        "unsubscribed": add("unsubscribed@z.org", status="unsubscribed", attributes={"plan": "gold"}),
        "complained": add("complained@z.org", status="complained", attributes={"plan": "gold"}),
        "erased": add("erased@z.org", attributes={"plan": "gold"}),
    }
    Suppression.objects.create(email="suppressed@z.org", reason="manual")
    assert erase_contacts([contacts["erased"].pk]) == 1
    contacts["erased"].refresh_from_db()
    return contacts


def test_suppressed_erased_and_inactive_contacts_are_never_in_a_count_or_sample(
    excluded: dict[str, Contact],
) -> None:
    erased = excluded["erased"].email
    statuses = field("status", "in", ["active", "bounced", "unsubscribed", "complained"])
    every_email = field("email", "in", [c.email for c in excluded.values()])
    # The filters do match them all…
    assert selected(statuses) == everyone()
    assert selected(every_email) == everyone()
    assert selected(field("email", "domain", "invalid")) == {erased}
    # …the audience never has them.
    for data in (
        statuses,
        every_email,
        {"or": [field("status", "equals", "bounced"), field("email", "equals", "active@z.org")]},
        {"not": field("email", "equals", "nobody@z.org")},
        {"not": attr("plan", "string", "equals", "silver")},
    ):
        assert audience(data) == {"active@z.org"}
    for data in (
        field("status", "not_equals", "active"),
        field("email", "equals", "suppressed@z.org"),
        field("email", "domain", "invalid"),
        field("email", "equals", erased),
    ):
        assert audience(data) == set()
    # An erased contact stays out even were its status `active` again: anonymised_at says so.
    Contact.objects.filter(pk=excluded["erased"].pk).update(status="active")
    assert audience(field("email", "domain", "invalid")) == set()
    assert audience(statuses) == {"active@z.org"}


def test_sample_is_the_first_contacts_by_id_with_their_columns(settings) -> None:  # noqa: ANN001
    created = [add(f"s{n}@q.org", name=f"S{n}", attributes={"n": n}) for n in range(5)]
    rows = segments.sample(attr("n", "number", "gte", 1), size=2)
    assert [row["email"] for row in rows] == ["s1@q.org", "s2@q.org"]
    assert rows[0]["id"] == created[1].pk and rows[0]["name"] == "S1" and rows[0]["status"] == "active"
    # jsonb through a raw cursor is its text under Django's psycopg2 setup (the API decodes it).
    attributes = rows[0]["attributes"]
    assert (json.loads(attributes) if isinstance(attributes, str) else attributes) == {"n": 1}
    assert set(rows[0]) == set(segment_sql.SAMPLE_COLUMNS)
    settings.EMAILHUB_SEGMENT_SAMPLE_MAX = 3
    assert len(segments.sample(attr("n", "number", "gte", 0), size=50)) == 3
    assert segments.count(attr("n", "number", "gte", 0)) == 5


# --- 8. refusals --------------------------------------------------------------------------------

OK = field("email", "domain", "example.com")
OK2 = attr("plan", "string", "equals", "gold")


@pytest.mark.parametrize(
    ("data", "paths"),
    [
        ({"and": [OK, OK2, attr("a", "number", "gt", "x")]}, {"and[2].value"}),
        ({"or": [{"and": [OK, {"not": field("status", "equals", "gone")}]}]}, {"or[0].and[1].not.value"}),
        ({"and": [{**OK, "extra": 1}, attr("a", "string", "equals", 3)]}, {"and[0].extra", "and[1].value"}),
        ({"and": [OK], "or": [OK]}, {""}),
        ({"and": [OK], "x": 1}, {"x"}),
        ({"field": "email", "attribute": "a", "op": "equals", "value": "x"}, {""}),
        ({}, {""}),
        ([OK], {""}),
        ("email", {""}),
        (None, {""}),
        ({"and": []}, {"and"}),
        ({"or": []}, {"or"}),
        ({"and": {}}, {"and"}),
        ({"not": [OK]}, {"not"}),
        ({"and": [OK, 3]}, {"and[1]"}),
        (field("phone", "equals", "1"), {"field"}),
        (field("email", "gt", "a"), {"op"}),
        (field("email", "exists"), {"op"}),
        (field("name", "exists", "x"), {"value"}),
        (field("name", "equals", None), {"value"}),
        (field("email", "in", []), {"value"}),
        (field("email", "in", ["a@b.c", 5]), {"value[1]"}),
        (field("email", "domain", "exa mple.com"), {"value"}),
        (field("email", "domain", "%.com"), {"value"}),
        (field("status", "in", ["active", "gone"]), {"value"}),
        (field("created_at", "after", "2024-01-01T00:00:00"), {"value"}),  # no offset
        (field("created_at", "after", "yesterday"), {"value"}),
        (field("created_at", "before", "2024-02-30"), {"value"}),
        (field("created_at", "within", {"weeks": 1}), {"value"}),
        (field("created_at", "within", {"days": 0}), {"value.days"}),
        (field("created_at", "within", {"days": 3651}), {"value.days"}),
        (field("name", "equals", "a\x00b"), {"value"}),
        (field("name", "contains", "x" * 1001), {"value"}),
        (attr("a", "boolean", "gt", True), {"op"}),
        (attr("a", "string", "gt", "x"), {"op"}),
        (attr("a", "boolean", "in", [True]), {"op"}),
        (attr("a", "number", "contains", 1), {"op"}),
        (attr("a", "text", "equals", "x"), {"type"}),
        ({"attribute": "a", "op": "equals", "value": "x"}, {"type"}),
        (attr("a", "string", "exists", "x"), {"value"}),
        (attr("a", "number", "equals", True), {"value"}),
        (attr("a", "number", "equals", "30"), {"value"}),
        (attr("a", "number", "equals", 1e15), {"value"}),
        (attr("a", "number", "in", []), {"value"}),
        (attr("a", "number", "in", [1, "2"]), {"value[1]"}),
        (attr("a", "boolean", "equals", "true"), {"value"}),
        (attr("a", "date", "equals", "2024-02-30"), {"value"}),
        (attr("a", "date", "equals", "2024-01-01T00:00:00Z"), {"value"}),
        (attr("", "string", "equals", "x"), {"attribute"}),
        (attr("a" * 101, "string", "equals", "x"), {"attribute"}),
        (attr("a\x00b", "string", "equals", "x"), {"attribute"}),
        (attr("a\nb", "string", "equals", "x"), {"attribute"}),
        (attr("a\x7f", "string", "equals", "x"), {"attribute"}),
        (attr(7, "string", "equals", "x"), {"attribute"}),
        ({"list": "1", "op": "in"}, {"list"}),
        ({"list": 0, "op": "in"}, {"list"}),
        ({"list": True, "op": "in"}, {"list"}),
        ({"list": 1, "op": "is"}, {"op"}),
        ({"list": 1, "op": "in", "value": 1}, {"value"}),
        (engaged("viewed"), {"engagement"}),
        (engaged("opened", "at_most"), {"op"}),
        (engaged("opened", value=0), {"value"}),
        (engaged("opened", value=True), {"value"}),
        (engaged("opened", value=1001), {"value"}),
        (engaged("opened", "none", value=1), {"value"}),
        (engaged("opened", within={"days": 1}, between={"from": "2024-01-01"}), {""}),
        (engaged("opened", within={"days": 1, "hours": 2}), {"within"}),
        (engaged("opened", within={"hours": -1}), {"within.hours"}),
        (engaged("opened", between={}), {"between"}),
        (engaged("opened", between={"from": "2024-01-02", "to": "2024-01-01"}), {"between"}),
        (engaged("opened", between={"from": "2024-01-02", "until": "2024-01-03"}), {"between"}),
        (engaged("opened", between={"from": "soon"}), {"between.from"}),
        (engaged("opened", campaign="x"), {"campaign"}),
        (engaged("opened", tag="a b"), {"tag"}),
        (engaged("opened", tag="x'); DROP TABLE campaigns_contact; --"), {"tag"}),
        (engaged("opened", tag=""), {"tag"}),
        (engaged("opened", at="now"), {"at"}),
    ],
)  # fmt: skip
def test_a_bad_filter_is_refused_naming_the_path_of_each_bad_node(data: Any, paths: set[str]) -> None:
    error = refusal(data)
    assert set(error.errors) == paths
    assert error.limit is None
    assert all(isinstance(message, str) and message for message in error.errors.values())


def test_control_characters_in_keys_are_refused_and_never_echoed_in_messages() -> None:
    error = refusal({"and": [{**OK, "ba\x00d": 1}]})
    assert len(error.errors) == 1 and next(iter(error.errors)).startswith("and[0].ba")
    error = refusal(field("nul\x00", "equals", "x"))
    assert set(error.errors) == {"field"} and "\x00" not in error.errors["field"]
    error = refusal(attr("a", "string", "in\x01", "x"))
    assert set(error.errors) == {"op"} and "\x01" not in error.errors["op"]


def test_the_depth_limit_names_its_setting(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_SEGMENT_MAX_DEPTH = 2
    assert audience({"and": [{"or": [OK]}]}) == set()  # two deep: accepted
    assert audience({"not": {"not": OK}}) == set()
    error = refusal({"and": [OK, {"or": [{"not": OK}]}]})
    assert error.limit == "EMAILHUB_SEGMENT_MAX_DEPTH" and set(error.errors) == {"and[1].or[0]"}
    error = refusal({"not": {"not": {"not": OK}}})
    assert error.limit == "EMAILHUB_SEGMENT_MAX_DEPTH" and set(error.errors) == {"not.not"}


def test_the_condition_limit_names_its_setting(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 3
    assert audience({"and": [OK, OK2, {"not": OK}]}) == set()  # three: accepted
    error = refusal({"and": [OK, OK2, {"or": [OK, OK2]}]})
    assert error.limit == "EMAILHUB_SEGMENT_MAX_CONDITIONS" and set(error.errors) == {""}
    assert "4" in error.errors[""]


def test_the_byte_limit_names_its_setting(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_SEGMENT_MAX_BYTES = 100
    data = field("name", "equals", "")
    data["value"] = "x" * (100 - len(json.dumps(data)))
    assert len(json.dumps(data)) == 100
    assert audience(data) == set()  # exactly at the limit: accepted
    data["value"] += "x"
    error = refusal(data)
    assert error.limit == "EMAILHUB_SEGMENT_MAX_BYTES" and set(error.errors) == {""}
    # Checked before anything else: a huge filter is not walked.
    error = refusal({"and": [OK] * 10_000})
    assert error.limit == "EMAILHUB_SEGMENT_MAX_BYTES"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (field("created_at", "before", "9999-12-31T23:00:00-05:00"), "value"),
        (field("created_at", "after", "0001-01-01T00:30:00+01:00"), "value"),
        ({"and": [OK, engaged("opened", between={"to": "9999-12-31"})]}, "and[1].between.to"),
    ],
)
def test_an_instant_out_of_range_in_utc_is_refused_with_its_path(data: Any, path: str) -> None:
    assert set(refusal(data).errors) == {path}


def test_the_api_answers_a_refused_filter_with_a_400_naming_each_path(api, settings) -> None:  # noqa: ANN001
    bad = {"and": [OK, OK2, attr("a", "number", "gt", "x")]}
    response = api.post("/api/v1/segments", {"name": "bad", "filter": bad}, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]["fields"]) == {"filter.and[2].value"}
    settings.EMAILHUB_SEGMENT_MAX_DEPTH = 1
    response = api.post("/api/v1/segments/preview", {"filter": {"and": [{"or": [OK]}]}}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded" and error["limit"]["name"] == "EMAILHUB_SEGMENT_MAX_DEPTH"
    assert set(error["fields"]) == {"filter.and[0]"}
    assert not Segment.objects.exists()


def test_validate_refuses_lists_and_campaigns_that_do_not_exist() -> None:
    real_list = ContactList.objects.create(name="real")
    real_campaign = factories.campaign("real")
    assert segments.validate(
        {"and": [{"list": real_list.pk, "op": "in"}, engaged("opened", campaign=real_campaign.pk)]}
    )
    error = refusal(
        {
            "and": [
                {"list": real_list.pk, "op": "in"},
                {"list": real_list.pk + 1000, "op": "not_in"},
                {"or": [engaged("sent", campaign=real_campaign.pk + 1000), OK]},
            ]
        }
    )
    assert set(error.errors) == {"and[1].list", "and[2].or[0].campaign"}
    assert str(real_list.pk + 1000) in error.errors["and[1].list"]
    with pytest.raises(InvalidFilter):
        segments.create(name="bad", filter={"list": real_list.pk + 1000, "op": "in"})
    assert not Segment.objects.exists()


INJECTIONS = [
    "x'); DROP TABLE campaigns_contact; --",
    "' OR '1'='1",
    "a' OR '1'='1",
    "\"}' OR true --",
    "%(sg0)s",
    "%s",
    "%",
    "_",
    "a->>'b'",
    "a')) OR true --",
    "$1",
    "\\",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_sql_in_values_is_plain_data_matching_only_itself(text: str) -> None:
    add("plain@i.org", name="plain", attributes={"note": "plain", "list": ["plain"]})
    add("victim@i.org", name=text, attributes={"note": text, "list": [text], text: "k"})
    conditions = [
        field("name", "equals", text),
        field("name", "contains", text),
        attr("note", "string", "equals", text),
        attr("note", "string", "contains", text),
        attr("note", "string", "in", [text, "nothing"]),
        attr("list", "string", "contains", text),
        attr(text, "string", "equals", "k"),
        attr(text, "string", "exists"),
    ]
    for node in conditions:
        assert selected(node) == {"victim@i.org"}, node
        assert audience(node) == {"victim@i.org"}, node
    assert selected(field("email", "contains", text)) == set()
    assert selected(attr(text, "number", "gt", 0)) == set()
    tables_intact()
    assert Contact.objects.count() == 2


@pytest.mark.parametrize(
    "key",
    ["a' OR '1'='1", "a->>'b'", "city') OR (true", "a}'::jsonb OR true --", "%(sg1)s", "a%b", 'a"b', "→ünï"],
)
def test_sql_in_attribute_keys_reads_only_that_key(key: str) -> None:
    add("holder@i.org", attributes={key: 5, "a": 5, "b": 5, "city": 5})
    add("other@i.org", attributes={"a": 5, "b": 5, "city": 5, "a' OR '1'='2": 5})
    for kind, op, value in (("number", "equals", 5), ("number", "gte", 5), ("number", "in", [5])):
        assert selected(attr(key, kind, op, value)) == {"holder@i.org"}
    assert selected(attr(key, "string", "exists")) == {"holder@i.org"}
    tables_intact()


# --- segments: create, update, delete -----------------------------------------------------------


def test_segments_create_update_and_delete_in_use_refused() -> None:
    segment = segments.create(name="gold", filter=OK2, description="gold plans")
    with pytest.raises(InvalidFilter) as caught:
        segments.update(segment.pk, {"filter": {"and": []}})
    assert set(caught.value.errors) == {"and"}
    segment.refresh_from_db()
    assert segment.filter == OK2
    segments.update(segment.pk, {"filter": OK, "name": "example"})
    segment.refresh_from_db()
    assert (segment.name, segment.filter) == ("example", OK)
    campaign = Campaign.objects.create(name="c", template=factories.newsletter(), segment=segment)
    with pytest.raises(SegmentInUse):
        segments.delete(segment)
    campaign.delete()
    segments.delete(segment)
    assert not Segment.objects.exists()


def test_a_list_a_segment_or_a_scheduled_campaigns_filter_names_cannot_be_deleted() -> None:
    named, other = ContactList.objects.create(name="named"), ContactList.objects.create(name="other")
    segment = segments.create(name="in-named", filter={"or": [OK, {"not": {"list": named.pk, "op": "in"}}]})
    with pytest.raises(ListInUse) as caught:
        delete_contact_list(named)
    assert caught.value.users == [f"segment {segment.pk} (in-named)"]
    delete_contact_list(other)  # named by no filter
    # A campaign scheduled with a filter naming the list keeps it too, after the segment changed.
    campaign = Campaign.objects.create(
        name="c", template=factories.newsletter(), segment=segment, audience_filter=segment.filter
    )
    segments.update(segment.pk, {"filter": OK})
    with pytest.raises(ListInUse) as caught:
        delete_contact_list(named)
    assert caught.value.users == [f"campaign {campaign.pk} (c)"]
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.COMPLETED)
    delete_contact_list(named)
    assert not ContactList.objects.exists()


# --- 9. fan-out of a segment campaign -----------------------------------------------------------


def publishing_test(test: Callable[..., None]) -> Callable[..., None]:
    """A fan-out test that looks at the send tasks published: each step commits (the tasks are
    published after it, from a thread of fan_out's). The other fan-out tests run in the test's
    transaction, where each step is a savepoint: the messages and counters are the same, no task
    is published."""
    return pytest.mark.django_db(transaction=True)(test)


def other_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def published(queue: str = "normal") -> list[int]:
    """Every message id in the send tasks waiting in the broker (taken off it)."""
    client = redis_lib.Redis.from_url(django_settings.REDIS_URL)
    ids = [
        i for name, args in queued_tasks(client, queue) if name == "delivery.send_messages" for i in args[0]
    ]
    client.delete(queue)
    return ids


def recipients(campaign: Campaign) -> list[str]:
    return sorted(Message.objects.filter(campaign=campaign).values_list("to_email", flat=True))


def segment_campaign(
    filter: Any, *, contact_list: ContactList | None = None, name: str = "seg"
) -> tuple[Segment, Campaign]:
    segment = segments.create(name=name, filter=filter)
    campaign = Campaign.objects.create(
        name=name, template=factories.newsletter(), segment=segment, contact_list=contact_list
    )
    return segment, campaign


def people_with_plans() -> dict[str, Contact]:
    """p1..p10 (ids in that order): even ones on plan gold; p4 suppressed, p6 bounced, p8 erased."""
    contacts = {
        f"p{n}": add(f"p{n}@f.org", attributes={"plan": "gold" if n % 2 == 0 else "free"})
        for n in range(1, 11)
    }
    Suppression.objects.create(email="p4@f.org", reason="unsubscribed")
    Contact.objects.filter(email="p6@f.org").update(status="bounced")
    erase_contacts([contacts["p8"].pk])
    return contacts


def f(*numbers: int) -> list[str]:
    return sorted(f"p{n}@f.org" for n in numbers)


GOLD = attr("plan", "string", "equals", "gold")


@publishing_test
def test_fan_out_of_a_segment_campaign_mails_exactly_the_matching_audience() -> None:
    people_with_plans()
    segment, campaign = segment_campaign(GOLD)
    assert segments.campaign_audience_size(campaign) == 2  # p2, p10
    lifecycle.schedule(campaign.pk, "immediate")
    report = fanout.fan_out(campaign.pk, step_size=3)
    assert report.finished and report.members == 10 and report.created == 2
    assert recipients(campaign) == f(2, 10)
    assert sorted(published()) == sorted(
        Message.objects.filter(campaign=campaign).values_list("id", flat=True)
    )
    campaign.refresh_from_db()
    # Matching but not mailed: p4 (suppressed), p6 (bounced); erased p8 matches nothing any more.
    assert (campaign.total_count, campaign.excluded_count, campaign.fanout_done) == (2, 2, True)
    assert campaign.audience_filter == GOLD


def test_fan_out_of_a_list_narrowed_by_a_segment_and_of_a_not_segment() -> None:
    contacts = people_with_plans()
    members = ContactList.objects.create(name="half")
    add_list_members(members, [contacts[f"p{n}"].pk for n in (1, 2, 3, 4, 5, 6)])
    _, narrowed = segment_campaign(GOLD, contact_list=members, name="narrowed")
    assert segments.campaign_audience_size(narrowed) == 1
    lifecycle.schedule(narrowed.pk, "immediate")
    report = fanout.fan_out(narrowed.pk, step_size=2)
    assert report.finished and report.members == 6 and report.created == 1
    assert recipients(narrowed) == f(2)
    narrowed.refresh_from_db()
    assert (narrowed.total_count, narrowed.excluded_count) == (1, 2)  # p4, p6

    _, negated = segment_campaign({"not": GOLD}, name="negated")
    lifecycle.schedule(negated.pk, "immediate")
    assert fanout.fan_out(negated.pk, step_size=4).created == 5
    assert recipients(negated) == f(1, 3, 5, 7, 9)
    negated.refresh_from_db()
    assert (negated.total_count, negated.excluded_count) == (5, 0)  # erased p8 is in no audience


@publishing_test
def test_an_interrupted_segment_fan_out_resumes_without_duplicates() -> None:
    for n in range(1, 21):
        add(f"q{n}@f.org", attributes={"n": n})
    Suppression.objects.create(email="q6@f.org", reason="manual")
    _, campaign = segment_campaign(attr("n", "number", "gt", 4))
    lifecycle.schedule(campaign.pk, "immediate")
    first = fanout.fan_out(campaign.pk, step_size=7, max_steps=1)  # q1..q7: q5, q7 (q6 suppressed)
    assert (first.steps, first.members, first.created, first.finished) == (1, 7, 2, False)
    campaign.refresh_from_db()
    assert campaign.fanout_cursor == Contact.objects.get(email="q7@f.org").pk
    rest = fanout.fan_out(campaign.pk, step_size=7)
    assert rest.finished and rest.members == 13 and rest.created == 13
    emails = list(Message.objects.filter(campaign=campaign).values_list("to_email", flat=True))
    assert len(emails) == len(set(emails)) == 15
    assert set(emails) == {f"q{n}@f.org" for n in range(5, 21)} - {"q6@f.org"}
    assert len(published()) == 15
    campaign.refresh_from_db()
    assert (campaign.total_count, campaign.excluded_count) == (15, 1)
    # Run once more after it finished: nothing.
    assert fanout.fan_out(campaign.pk).created == 0
    assert Message.objects.filter(campaign=campaign).count() == 15


def test_the_membership_rule_is_decided_when_the_cursor_reaches_the_contact() -> None:
    contacts = {n: add(f"m{n}@f.org", attributes={"vip": n in (1, 2, 5, 9)}) for n in range(1, 11)}
    _, campaign = segment_campaign(attr("vip", "boolean", "equals", True))
    lifecycle.schedule(campaign.pk, "immediate")
    assert fanout.fan_out(campaign.pk, step_size=3, max_steps=2).created == 3  # m1..m6: m1, m2, m5
    campaign.refresh_from_db()
    assert campaign.fanout_cursor == contacts[6].pk
    Contact.objects.filter(pk=contacts[3].pk).update(attributes={"vip": True})  # behind the cursor
    Contact.objects.filter(pk=contacts[8].pk).update(attributes={"vip": True})  # ahead: starts matching
    Contact.objects.filter(pk=contacts[9].pk).update(attributes={"vip": False})  # ahead: stops matching
    assert fanout.fan_out(campaign.pk, step_size=3).finished
    assert recipients(campaign) == sorted(f"m{n}@f.org" for n in (1, 2, 5, 8))
    campaign.refresh_from_db()
    assert (campaign.total_count, campaign.excluded_count) == (4, 0)


def test_editing_the_segment_after_scheduling_does_not_change_the_campaigns_audience() -> None:
    people_with_plans()
    segment, campaign = segment_campaign(GOLD)
    lifecycle.schedule(campaign.pk, "at", datetime.now(UTC) + timedelta(hours=1))
    campaign.refresh_from_db()
    assert campaign.status == "scheduled" and campaign.audience_filter == GOLD
    segments.update(segment.pk, {"filter": attr("plan", "string", "equals", "free")})
    Campaign.objects.filter(pk=campaign.pk).update(scheduled_at=datetime.now(UTC) - timedelta(seconds=1))
    assert lifecycle.start_campaigns([campaign.pk]) == [campaign.pk]
    assert fanout.fan_out(campaign.pk).finished
    assert recipients(campaign) == f(2, 10)
    campaign.refresh_from_db()
    assert campaign.audience_filter == GOLD
    assert Segment.objects.get(pk=segment.pk).filter == attr("plan", "string", "equals", "free")
    # A new campaign of the segment takes the segment as it is now.
    other = Campaign.objects.create(name="later", template=factories.newsletter(), segment=segment)
    lifecycle.schedule(other.pk, "immediate")
    fanout.fan_out(other.pk)
    assert recipients(other) == f(1, 3, 5, 7, 9)


def test_a_segment_campaigns_relative_windows_are_anchored_at_its_start() -> None:
    started = datetime(2024, 3, 31, 12, 0, tzinfo=UTC)  # the day Berlin moved to summer time
    for name in ("inside", "outside"):
        add(f"{name}@w.org", timezone="Europe/Berlin")
    opened(
        sent_to("inside@w.org", started - timedelta(days=2)),
        started - timedelta(hours=24) + timedelta(seconds=1),
    )
    opened(
        sent_to("outside@w.org", started - timedelta(days=2)),
        started - timedelta(hours=24) - timedelta(seconds=1),
    )
    _, campaign = segment_campaign(engaged("opened", within={"days": 1}))
    with time_machine.travel(started, tick=False):
        lifecycle.schedule(campaign.pk, "immediate")
    campaign.refresh_from_db()
    assert campaign.started_at == started
    assert fanout.fan_out(campaign.pk, step_size=1).finished  # every step reads the same window
    assert recipients(campaign) == ["inside@w.org"]


def test_segment_fan_out_never_mails_suppressed_erased_or_inactive_contacts(
    excluded: dict[str, Contact],
) -> None:
    matching_all = {
        "or": [
            field("status", "in", ["active", "bounced", "unsubscribed", "complained"]),
            field("email", "domain", "invalid"),
        ]
    }
    _, campaign = segment_campaign(matching_all)
    Contact.objects.filter(pk=excluded["erased"].pk).update(status="active")  # anonymised_at still says no
    lifecycle.schedule(campaign.pk, "immediate")
    report = fanout.fan_out(campaign.pk)
    assert report.finished and report.members == 6 and report.created == 1
    assert recipients(campaign) == ["active@z.org"]
    campaign.refresh_from_db()
    # suppressed, bounced, unsubscribed, complained: matched and excluded; the erased one never matched.
    assert (campaign.total_count, campaign.excluded_count) == (1, 4)


def test_a_campaign_scheduled_before_a_limit_was_lowered_still_fans_out(settings) -> None:  # noqa: ANN001
    people_with_plans()
    _, campaign = segment_campaign(
        {"and": [GOLD, field("email", "domain", "f.org"), {"not": field("name", "exists")}]}
    )
    lifecycle.schedule(campaign.pk, "immediate")
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 2
    assert fanout.fan_out(campaign.pk).finished
    assert recipients(campaign) == f(2, 10)


# --- 10. recurring schedules --------------------------------------------------------------------


def test_a_recurring_schedule_with_a_segment_creates_campaigns_with_its_filter_copied() -> None:
    people_with_plans()
    segment = segments.create(name="gold", filter=GOLD)
    schedule = RecurringSchedule.objects.create(
        name="weekly",
        cron="0 9 * * 1",
        timezone="Europe/Berlin",
        template=factories.newsletter(),
        segment=segment,
    )
    occurrence = datetime(2024, 6, 17, 7, 0, tzinfo=UTC)
    assert recurring.fire(schedule, occurrence) is True
    assert recurring.fire(schedule, occurrence) is False  # once per occurrence
    campaign = Campaign.objects.get(occurrence__schedule=schedule)
    assert (campaign.segment_id, campaign.contact_list_id, campaign.status) == (segment.pk, None, "sending")
    assert campaign.audience_filter == GOLD
    segments.update(segment.pk, {"filter": attr("plan", "string", "equals", "free")})
    fanout.fan_out(campaign.pk)
    assert recipients(campaign) == f(2, 10)
    # The next occurrence takes the segment as it is then.
    assert recurring.fire(schedule, occurrence + timedelta(days=7)) is True
    later = Campaign.objects.filter(occurrence__schedule=schedule).exclude(pk=campaign.pk).get()
    assert later.audience_filter == attr("plan", "string", "equals", "free")
    fanout.fan_out(later.pk)
    assert recipients(later) == f(1, 3, 5, 7, 9)


@publishing_test
def test_fan_out_closes_its_publish_threads_connection() -> None:
    people_with_plans()
    _, campaign = segment_campaign(GOLD)
    lifecycle.schedule(campaign.pk, "immediate")
    gc.disable()  # what the collector would do some time later is not fan_out's close
    try:
        assert fanout.fan_out(campaign.pk).created == 2  # its send task is published, its row deleted
        # A closed connection's backend leaves pg_stat_activity as soon as it has exited.
        wait_until(lambda: other_sessions() == 0, timeout=15.0, message="the publish thread's session to end")
    finally:
        gc.enable()
        published()


# --- the query timeout --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_count_running_past_the_segment_query_timeout_is_stopped(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS = 0.2
    add("t@t.org")
    with table_locked("campaigns_suppression"):  # the audience's anti-join waits past the timeout
        with pytest.raises(SegmentQueryTimeout, match="EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS"):
            segments.count(OK)
    assert segments.count(field("email", "equals", "t@t.org")) == 1  # the timeout was the read's only


def test_the_segment_query_timeout_applies_to_the_segments_read_only(settings) -> None:  # noqa: ANN001
    def timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return str(cursor.fetchone()[0])

    before = timeout()
    settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS = 0.25
    assert segments.count(OK) == 0  # in the test's transaction, as in the admin's
    assert timeout() == before


# --- what the review found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (engaged("opened", within={"days": 10**12}), "within.days"),
        (field("created_at", "within", {"hours": 10**18}), "value.hours"),
        (engaged("opened", within={"days": 3_651}), "within.days"),
    ],
)
def test_a_window_too_long_is_refused_by_path_not_an_overflow(data: Any, path: str) -> None:
    assert set(refusal(data).errors) == {path}


def test_a_contact_created_again_at_an_erased_address_inherits_no_engagement() -> None:
    erased = add("again@e.org")
    message = sent_to("again@e.org", campaign=None)
    opened(message)
    hit(message, "bounced", NOW - timedelta(days=1))
    hit(
        sent_to("again@e.org"), "complained", NOW - timedelta(days=1)
    )  # unmatched events name the address too
    EmailEvent.objects.create(kind="bounced", recipient="again@e.org", occurred_at=NOW - timedelta(hours=2))
    assert selected(engaged("opened")) == {"again@e.org"}
    assert erase_contacts([erased.pk]) == 1
    add("again@e.org")  # the address, free again, imported as a new contact
    for kind in ("opened", "bounced", "complained", "sent"):
        assert "again@e.org" not in selected(engaged(kind)), kind


def test_scheduling_a_campaign_whose_segment_names_a_list_gone_since_is_refused() -> None:
    gone = ContactList.objects.create(name="gone")
    add("x@y.org")
    segment, campaign = segment_campaign({"not": {"list": gone.pk, "op": "in"}})
    # Deleted behind the service's back (its own delete refuses: the segment names the list).
    ContactList.objects.filter(pk=gone.pk).delete()
    with pytest.raises(CampaignStateError, match="no longer passes"):
        lifecycle.schedule(campaign.pk, "immediate")
    campaign.refresh_from_db()
    assert (campaign.status, campaign.audience_filter) == ("draft", None)


def test_a_draft_left_without_an_audience_is_refused_not_a_500() -> None:
    segment, campaign = segment_campaign(OK)
    with pytest.raises(CampaignStateError, match="needs an audience"):
        lifecycle.update_draft(campaign.pk, {"segment": None})
    campaign.refresh_from_db()
    assert campaign.segment_id == segment.pk


def test_a_recurring_schedule_left_without_an_audience_is_refused_not_a_500() -> None:
    segment = segments.create(name="gold", filter=OK)
    schedule = recurring.create_schedule(
        RecurringSchedule(name="weekly", cron="0 9 * * 1", template=factories.newsletter(), segment=segment)
    )
    with pytest.raises(NoAudience, match="needs an audience"):
        recurring.update_schedule(schedule.pk, {"segment": None})
    schedule.refresh_from_db()
    assert schedule.segment_id == segment.pk
