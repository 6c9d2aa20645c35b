"""Schemathesis: every operation of the served OpenAPI schema, against a live gunicorn.

The web process runs as deployed (`EMAILHUB_DEBUG=false`) on the test database, which holds a
key with every scope and one of each object (template, list with a contact, draft campaign, a
campaign scheduled at a local time, recurring schedule, segment with a campaign mailing it,
suppression, import job, message), so that path ids often name a real object and operations
reach their real code rather than a 404.
Each operation gets a bounded, derandomised set of generated requests, valid (positive) and
invalid (negative), and every response must pass every check Schemathesis has for one response
(`--checks all`; the stateful ones need the stateful phase, which is off):

- `not_a_server_error`: no 5xx;
- `status_code_conformance`: only statuses the schema documents for the operation;
- `content_type_conformance`, `response_headers_conformance` and `response_schema_conformance`:
  the answer is what the schema says (every error the one `Error` shape, every success its typed
  serializer);
- `negative_data_rejection`: a request the schema calls invalid is refused (a 4xx; 413 counts);
- `positive_data_acceptance`: a request the schema calls valid is not refused, unless the
  refusal is one no schema can express, listed in UNEXPRESSIBLE by operation and status, each
  field with the reason (an unknown template, a taken name, a date that has passed): such an
  answer passes only when every field it names is listed there for that operation and status;
- `ignored_auth`, `allow_header_conformance`, `missing_required_header`, `unsupported_method`.

Strings are generated without NUL (`allow-x00: false`): the API refuses U+0000 in any string,
key, query or header with a 400 naming it (tests/test_bad_input.py), which no schema states.

The examples are few (EXAMPLES per operation) to keep the test well under a minute on a loaded
2-core machine; the seed is fixed, so a failure reproduces.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Any

import pytest
import requests
import schemathesis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.management import call_command
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from core.limits import SCHEDULE_HORIZON
from delivery.authentication import create_api_key
from delivery.testing.smtp_server import free_port
from scripts.stack import Stack
from tests.conftest import process_env

# `django_db` so that pytest-django sets up the test database; each case runs in a transaction
# of its own that it never uses (the web process, not the test, talks to the database).
pytestmark = [pytest.mark.processes, pytest.mark.django_db]

# A deeper run by hand: SCHEMATHESIS_EXAMPLES=200 SCHEMATHESIS_COVERAGE=1 pytest tests/test_api_schemathesis.py
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "8"))
COVERAGE = os.environ.get("SCHEMATHESIS_COVERAGE", "") == "1"  # boundary values per parameter
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20261201"))

# Why a field of a request the schema calls valid can still be refused (see UNEXPRESSIBLE).
CURSOR = "an opaque token that only a page's next/previous link holds"
EXISTING = "must name an existing object (a state of the database, not a shape)"
TAKEN = "must be unique: a name or address no other row has yet"
EMAIL = ("Django's EmailValidator is stricter than `format: email` (a one-letter top-level domain, a "
         "quoted local part, an address literal are refused)")  # fmt: skip
MAILBOX = "one RFC 5322 mailbox (`Ann <ann@example.com>`, checked by the strict parser): no pattern says it"
SCHEDULE = (f"relative to now: in the past (more than the grace), or beyond {SCHEDULE_HORIZON.setting}; JSON Schema's "
            "date formats take no bounds")  # fmt: skip
TIMEZONE = "an IANA name the server's tzdata knows (about 600, changing with tzdata releases)"
CRON = "five cron fields croniter can read ('61 * * * *' matches any pattern a schema would state)"
CONTENT = ("either a template or a subject with html/text, not both: a oneOf with `not`, which "
           "generators cannot sample")  # fmt: skip
BYTES = "a size in bytes (EMAILHUB_*_MAX_BYTES): JSON Schema has no keyword for it"
RESERVED = "keys emailhub reserves (`emailhub:…`): OpenAPI 3.0 has no propertyNames"
SYNTAX = "{{ placeholders }} that parse (core.templating)"
IDEMPOTENCY = "an Idempotency-Key used before with another body: state, not shape"
SINCE_UNTIL = "`until` after `since`: a relation between two parameters"
CSV = "a CSV whose header row names an email column"
SIGNED = "a notification the provider signed (SNS, SendGrid's Signed Event Webhook)"
BODY = "(body)"  # an error that names no field: the request as a whole
EXECUTABLE = ("not an executable type mailbox providers reject (.exe, .js…, delivery.attachments), matched "
              "case-insensitively on the last extension (JSON Schema patterns have no flags), nor only "
              "dots and spaces")  # fmt: skip
CONTAINER = "multipart/* and message/* in any case: JSON Schema patterns have no flags"
UNIQUE_CID = "a content_id unique among the message's attachments: a relation between items"
PUBLIC_URL = ("https on a host that resolves, only to public addresses (outbound/services/addresses.py): "
              "DNS, not a shape")  # fmt: skip
REPLAYABLE = "an event this endpoint was sent, or exactly one of `event_id` and `since`: state and a relation"
FROM_TO = "a `between`'s `from` before its `to`: a relation between two values"

HEADERS = ("header names emailhub owns or that change routing (From, Content-*, X-SES-*…) and RFC 5322 field "
           "names: OpenAPI 3.0 has no propertyNames")  # fmt: skip
RECIPIENTS = ("no address twice among to, cc and bcc, and EMAILHUB_MESSAGE_MAX_RECIPIENTS across the three: "
              "relations between fields")  # fmt: skip
_MESSAGE = {"to": EMAIL, "from": MAILBOX, "reply_to": MAILBOX, "template": f"{EXISTING}; {CONTENT}",
            "subject": CONTENT, "text": CONTENT, "send_at": SCHEDULE, "context": f"{BYTES}; {RESERVED}",
            "metadata": BYTES, "headers": HEADERS, "cc": RECIPIENTS, "bcc": RECIPIENTS,
            "cc.*": f"{EMAIL}; {RECIPIENTS}", "bcc.*": f"{EMAIL}; {RECIPIENTS}",
            "attachments.*.filename": EXECUTABLE, "attachments.*.content_type": CONTAINER,
            "attachments.*.content_id": UNIQUE_CID}  # fmt: skip
_CONTACT = {"email": f"{EMAIL}; {TAKEN}", "timezone": TIMEZONE, "attributes": BYTES}
_TEMPLATE = {"name": TAKEN, "subject": SYNTAX, "html": SYNTAX, "text": SYNTAX}
_CAMPAIGN = {"template": EXISTING, "contact_list": EXISTING, "segment": EXISTING, "from_email": MAILBOX}
# A segment filter's nodes are named by their path under `filter` (`filter.and[2].list`), matched
# here as shell patterns: a list or campaign id that must exist, `between`'s order; the filter
# as a whole holding U+0000 deep inside (the coverage phase generates it despite `allow-x00`).
# Limits that settings hold are in LIMITED.
NUL = "U+0000 in any string, refused by the JSON parser (core/api_json.py): no schema states it"
_FILTER = {"filter": NUL, "filter*.list": EXISTING, "filter*.campaign": EXISTING, "filter*.between": FROM_TO}
_SEGMENT = {"name": TAKEN, **_FILTER}
_RECURRING = {**_CAMPAIGN, "cron": CRON, "timezone": TIMEZONE}
_CURSOR_PAGED = [
    "/api/v1/campaigns", "/api/v1/contacts", "/api/v1/events", "/api/v1/imports/{id}/duplicates",
    "/api/v1/imports/{id}/rejections", "/api/v1/lists", "/api/v1/messages",
    "/api/v1/messages/{message_id}/events", "/api/v1/recurring-schedules", "/api/v1/segments", "/api/v1/suppressions",
    "/api/v1/templates", "/api/v1/webhook-endpoints", "/api/v1/webhook-endpoints/{id}/attempts",
]  # fmt: skip

# What no schema can express: (operation, status) -> {field the error names: why}. A nested field
# is named by its path with `*` for an index (`messages.*.to`). docs/architecture.md, "The
# OpenAPI schema", points here; nothing else excuses a refused valid request.
UNEXPRESSIBLE: dict[tuple[str, int], dict[str, str]] = {
    **{(f"GET {path}", 400): {"cursor": CURSOR} for path in _CURSOR_PAGED},
    ("GET /api/v1/events", 400): {"cursor": CURSOR, "until": SINCE_UNTIL},
    ("POST /api/v1/messages", 400): _MESSAGE,
    ("POST /api/v1/messages", 422): {"Idempotency-Key": IDEMPOTENCY},
    ("PATCH /api/v1/messages/{message_id}", 400): {"send_at": SCHEDULE},
    ("POST /api/v1/messages/batch", 400): {f"messages.*.{field}": why for field, why in _MESSAGE.items()},
    ("POST /api/v1/messages/batch", 422): {"messages.*.idempotency_key": IDEMPOTENCY},
    ("POST /api/v1/contacts", 400): _CONTACT,
    ("PUT /api/v1/contacts/{id}", 400): _CONTACT,
    ("PATCH /api/v1/contacts/{id}", 400): _CONTACT,
    ("POST /api/v1/contacts/import", 400): {"file": CSV},
    ("POST /api/v1/lists", 400): {"name": TAKEN},
    ("PUT /api/v1/lists/{id}", 400): {"name": TAKEN},
    ("PATCH /api/v1/lists/{id}", 400): {"name": TAKEN},
    ("POST /api/v1/lists/{id}/members", 400): {"contact_ids": EXISTING},
    ("POST /api/v1/suppressions", 400): {"email": f"{EMAIL}; {TAKEN}"},
    ("POST /api/v1/templates", 400): _TEMPLATE,
    ("PUT /api/v1/templates/{id}", 400): _TEMPLATE,
    ("PATCH /api/v1/templates/{id}", 400): _TEMPLATE,
    ("POST /api/v1/templates/{id}/preview", 400): {"contact": EXISTING, "context": BYTES},
    ("POST /api/v1/campaigns", 400): _CAMPAIGN,
    ("PUT /api/v1/campaigns/{id}", 400): _CAMPAIGN,
    ("PATCH /api/v1/campaigns/{id}", 400): _CAMPAIGN,
    ("POST /api/v1/campaigns/{id}/schedule", 400): {
        "scheduled_at": SCHEDULE,
        "local_date": SCHEDULE,
        "window_start": SCHEDULE,
    },  # fmt: skip
    ("POST /api/v1/webhooks/{provider}", 400): {BODY: SIGNED},
    ("POST /api/v1/recurring-schedules", 400): _RECURRING,
    ("PUT /api/v1/recurring-schedules/{id}", 400): _RECURRING,
    ("PATCH /api/v1/recurring-schedules/{id}", 400): _RECURRING,
    ("POST /api/v1/webhook-endpoints", 400): {"url": PUBLIC_URL},
    ("PATCH /api/v1/webhook-endpoints/{id}", 400): {"url": PUBLIC_URL},
    ("POST /api/v1/webhook-endpoints/{id}/replay", 400): {"event_id": REPLAYABLE},
    ("POST /api/v1/segments", 400): _SEGMENT,
    ("PATCH /api/v1/segments/{id}", 400): _SEGMENT,
    ("POST /api/v1/segments/preview", 400): {**_FILTER, "contact_list": EXISTING},
    ("GET /api/v1/segments/{id}/count", 400): {"contact_list": EXISTING},
    ("GET /api/v1/segments/{id}/sample", 400): {"contact_list": EXISTING},
}

# Refusals for a limit a setting holds that no schema states (how deep a recursive filter nests,
# how many conditions a whole tree has, its size in bytes, how deep any JSON nests): a 400 whose
# `limit` names one of these settings, by operation.
_FILTER_LIMITS = {
    "EMAILHUB_SEGMENT_MAX_DEPTH",
    "EMAILHUB_SEGMENT_MAX_CONDITIONS",
    "EMAILHUB_SEGMENT_MAX_BYTES",
    "EMAILHUB_API_MAX_JSON_DEPTH",
}
LIMITED: dict[str, set[str]] = {
    "POST /api/v1/segments": _FILTER_LIMITS,
    "PATCH /api/v1/segments/{id}": _FILTER_LIMITS,
    "POST /api/v1/segments/preview": _FILTER_LIMITS,
}


def _error_fields(fields: dict[str, Any], prefix: str = "") -> set[str]:
    """The paths an error's `fields` names, an index as `*`: {"messages": {"3": {"to": …}}} ->
    {"messages.*.to"}."""
    paths = set()
    for name, value in fields.items():
        path = prefix + ("*" if name.isdigit() else name)
        paths |= _error_fields(value, f"{path}.") if isinstance(value, dict) else {path}
    return paths


def unexpressible(label: str, response: Any) -> bool:
    """Whether a refused valid request was refused only for reasons UNEXPRESSIBLE lists (a
    listed field may be a shell pattern, `filter*.list`), or for a limit LIMITED lists."""
    try:
        error = response.json()["error"]
        if response.status_code == 400 and error.get("limit", {}).get("name") in LIMITED.get(label, set()):
            return True
        allowed = UNEXPRESSIBLE.get((label, response.status_code))
        if allowed is None:
            return False
        named = _error_fields(error["fields"]) or {BODY}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return all(any(fnmatchcase(field, pattern) for pattern in allowed) for field in named)


def positive_data_acceptance_but_unexpressible(
    ctx: Any, response: Any, case: schemathesis.Case
) -> bool | None:
    """Schemathesis's positive_data_acceptance, passing the refusals UNEXPRESSIBLE lists."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if unexpressible(case.operation.label, response):
            return None
        raise


def negative_data_rejection_but_partial(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """Schemathesis's negative_data_rejection, passing the one answer that accepts an invalid
    request by design: a batch sent with `partial: true` is a 202 whose results refuse each
    invalid item (README, "Batches"); its envelope is still checked (a bad envelope is a 400)."""
    try:
        return negative_data_rejection(ctx, response, case)
    except AcceptedNegativeData:
        if (
            case.operation.label == "POST /api/v1/messages/batch"
            and response.status_code == 202
            and isinstance(case.body, dict)
            and case.body.get("partial") is True
            and response.json()["rejected"] >= 1
        ):
            return None
        raise


CHECKS = [
    not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
    response_schema_conformance, negative_data_rejection_but_partial, positive_data_acceptance_but_unexpressible,
    ignored_auth, allow_header_conformance, missing_required_header, unsupported_method,
]  # fmt: skip


def _create(api: APIClient, url: str, body: dict[str, Any]) -> int:
    response = api.post(url, body, format="json")
    assert response.status_code in (201, 202), response.content
    return int(response.json()["id"])


def _objects(api: APIClient) -> dict[str, int]:
    """One of each object, made through the API itself; their ids by the path they live under."""
    template = _create(
        api, "/api/v1/templates", {"name": "welcome", "subject": "Hi {{ name }}", "text": "Hello {{ name }}"}
    )
    contact_list = _create(api, "/api/v1/lists", {"name": "newsletter"})
    contact = _create(api, "/api/v1/contacts", {"email": "ada@example.com", "name": "Ada"})
    members = api.post(f"/api/v1/lists/{contact_list}/members", {"contact_ids": [contact]}, format="json")
    assert members.status_code == 200, members.content
    campaign = _create(
        api, "/api/v1/campaigns", {"name": "launch", "template": "welcome", "contact_list": contact_list}
    )
    recurring = _create(
        api,
        "/api/v1/recurring-schedules",
        {"name": "weekly", "cron": "0 9 * * 1", "timezone": "Europe/Paris", "template": "welcome",
         "contact_list": contact_list, "active": False},
    )  # fmt: skip
    suppression = _create(api, "/api/v1/suppressions", {"email": "gone@example.com", "reason": "manual"})
    upload = io.BytesIO(b"email,name\nbob@example.com,Bob\nnot-an-address,X\n")
    upload.name = "contacts.csv"
    import_job = int(api.post("/api/v1/contacts/import", {"file": upload}, format="multipart").json()["id"])
    message = _create(api, "/api/v1/messages", {"to": "ada@example.com", "subject": "Hi", "text": "Hello"})
    # A campaign waiting for a wall time in each contact's zone: its `local_time` ("02:30:00", no
    # offset) is what `format: time` (RFC 3339, with an offset) had declared wrongly.
    local = _create(
        api, "/api/v1/campaigns", {"name": "night", "template": "welcome", "contact_list": contact_list}
    )
    soon = (timezone.now() + timedelta(days=30)).date().isoformat()
    scheduled = api.post(
        f"/api/v1/campaigns/{local}/schedule",
        {"type": "local_time", "local_date": soon, "local_time": "02:30"},
        format="json",
    )
    assert scheduled.status_code == 200 and scheduled.json()["local_time"] == "02:30:00", scheduled.content
    # A segment (of the list's members in Paris), and a campaign mailing it: its DELETE is a 409.
    good_filter = {"and": [{"list": contact_list, "op": "in"}, {"attribute": "city", "type": "string",
                                                                "op": "equals", "value": "Paris"}]}  # fmt: skip
    segment = _create(api, "/api/v1/segments", {"name": "parisians", "filter": good_filter})
    _create(api, "/api/v1/campaigns", {"name": "paris", "template": "welcome", "segment": segment})
    REFERENCES.update(
        template="welcome",
        contact_list=contact_list,
        contact_ids=[contact],
        contact=contact,
        segment=segment,
        filter=good_filter,
    )
    return {
        "/api/v1/templates/": [template],
        "/api/v1/lists/": [contact_list],
        "/api/v1/contacts/": [contact],
        "/api/v1/campaigns/": [campaign, local],
        "/api/v1/recurring-schedules/": [recurring],
        "/api/v1/segments/": [segment],
        "/api/v1/suppressions/": [suppression],
        "/api/v1/imports/": [import_job],
        "/api/v1/messages/": [message],
        "/api/v1/webhooks/": ["ses", "sendgrid"],
    }


def _generated_schema() -> dict[str, Any]:
    """The schema /api/schema/ serves, generated in this process (the fixture checks they agree)."""
    generator = SchemaGenerator()
    return json.loads(json.dumps(generator.get_schema(request=None, public=True), default=str))


CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "request-timeout": 30,
        "generation": {
            "max-examples": EXAMPLES,
            "deterministic": True,
            "no-shrink": True,
            "database": "none",
            # The key is the fixture's real one; generated Authorization headers would all be 401s.
            "with-security-parameters": False,
            # NUL is refused everywhere with a 400 naming it (see the module docstring).
            "allow-x00": False,
        },
        "phases": {"coverage": {"enabled": COVERAGE}, "stateful": {"enabled": False}},
        # A 413 (more messages than EMAILHUB_API_BATCH_MAX_MESSAGES, the schema's maxItems) is a
        # refusal too.
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [
                    "400",
                    "401",
                    "403",
                    "404",
                    "405",
                    "406",
                    "409",
                    "413",
                    "415",
                    "422",
                ]
            }
        },  # fmt: skip
    }
)
schema = schemathesis.openapi.from_dict(_generated_schema(), config=CONFIG)
# Path prefix -> the id of the real object under it; body field -> a real value for it (both
# filled by `live_api`).
KNOWN: dict[str, Any] = {}
REFERENCES: dict[str, Any] = {}
GOOD_MESSAGE = {"to": "ada@example.com", "subject": "Hi", "text": "Hello"}
# Operation -> the statuses it answered (checked by the last test).
ANSWERS: dict[str, set[int]] = {}


# Operation -> cases so far: which real object the next one names, in turn.
TURNS: Counter[str] = Counter()


def refer_to_real_objects(case: schemathesis.Case) -> None:
    """Some cases name a real object under the operation's path instead of a random id, and
    refer to real objects (template, list, contact) where a body names one; a batch gets a good
    message among the generated ones. Only where that part of the case was generated valid:
    putting a real value into an invalid part could remove the very violation it carries (a
    `contact_list` of 0 against `minimum: 1`)."""
    turn = TURNS[case.operation.label]
    TURNS[case.operation.label] += 1
    negative = case.meta.is_negative_at if case.meta is not None else (lambda location: True)
    for prefix, ids in KNOWN.items():
        if case.operation.path.startswith(prefix) and case.path_parameters:
            chosen = [None, *ids][turn % (len(ids) + 1)]
            if chosen is not None and not negative(ParameterLocation.PATH):
                name = next(iter(case.path_parameters))
                case.path_parameters = {**case.path_parameters, name: chosen}
            break
    body = case.body
    if not isinstance(body, dict) or turn % 2 or negative(ParameterLocation.BODY):
        return
    if isinstance(body.get("messages"), list):
        case.body = {**body, "messages": [*body["messages"][:2], GOOD_MESSAGE]}
    else:
        case.body = {**body, **{k: v for k, v in REFERENCES.items() if k in body}}


def _sendgrid_public_key() -> str:
    """A verification key as SendGrid's settings show it (base64 DER); nobody holds its private half."""
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode("ascii")


@pytest.fixture(scope="module")
def live_api(
    django_db_setup: Any, django_db_blocker: Any, smtp_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """gunicorn (2 workers, EMAILHUB_DEBUG=false) on the test database holding one of each
    object; (base URL, headers with a key of every scope). The database is flushed after."""
    env = process_env(
        smtp_server.port,
        EMAILHUB_DEBUG="false",
        # Configured as deployed: without a key the SendGrid webhook answers 503 on purpose (so
        # SendGrid keeps its events until the operator sets one), which is no bug to find here.
        EMAILHUB_SENDGRID_WEBHOOK_PUBLIC_KEY=_sendgrid_public_key(),
        EMAILHUB_SES_SNS_TOPIC_ARNS="arn:aws:sns:eu-west-1:123456789012:emailhub-events",
    )
    stack = Stack(env=env, log_dir=tmp_path_factory.mktemp("schemathesis") / "logs")
    with django_db_blocker.unblock():
        try:
            # Ids from 1, whatever ran before: generated ids then meet real objects as often in
            # the whole suite as alone (with the sequences far along, every generated id was a
            # 404, and the share of operations reaching a success depended on test order).
            call_command("flush", interactive=False, verbosity=0, reset_sequences=True)
            _, raw = create_api_key("schemathesis", scopes=["send", "read", "manage"])
            api = APIClient()
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
            KNOWN.update(_objects(api))
            port = free_port()
            stack.start_web(port, workers=2)
            base = f"http://127.0.0.1:{port}"
            served = requests.get(f"{base}/api/schema/?format=json", timeout=30).json()
            assert served["paths"].keys() == schema.raw_schema["paths"].keys()
            yield base, {"Authorization": f"Bearer {raw}"}
        finally:
            stack.stop_all(graceful=False)  # the module is over: nothing left to finish
            KNOWN.clear()
            REFERENCES.clear()
            call_command("flush", interactive=False, verbosity=0)


@schema.parametrize()
def test_every_operation_answers_as_its_schema_says(
    case: schemathesis.Case, live_api: tuple[str, dict[str, str]]
) -> None:
    base, headers = live_api
    refer_to_real_objects(case)
    response = case.call_and_validate(base_url=base, headers=headers, checks=CHECKS)
    ANSWERS.setdefault(case.operation.label, set()).add(response.status_code)


def test_the_cases_reached_the_operations_code() -> None:
    """Guards the test above against passing vacuously (a wrong key: every answer a documented
    401): the key was accepted everywhere, and most operations answered a success."""
    assert len(ANSWERS) == len(list(schema.get_all_operations()))
    refused = [label for label, statuses in ANSWERS.items() if statuses <= {401, 403}]
    assert not refused
    succeeded = [label for label, statuses in ANSWERS.items() if any(200 <= s < 300 for s in statuses)]
    assert len(succeeded) >= 0.7 * len(ANSWERS), sorted(set(ANSWERS) - set(succeeded))
