"""Schemathesis: every operation of the served OpenAPI schema, against a live gunicorn.

The web process runs as deployed (`EMAILHUB_DEBUG=false`) on the test database, which holds a
key with every scope and one of each object (template, list with a contact, draft campaign,
recurring schedule, suppression, import job, message), so that path ids often name a real object
and operations reach their real code rather than a 404. Each operation gets a bounded,
derandomised set of generated requests (valid and invalid), and every response must pass:

- `not_a_server_error`: no 5xx;
- `status_code_conformance`: only statuses the schema documents for the operation;
- `content_type_conformance` and `response_schema_conformance`: the body is what the schema says
  (so every error is the one `Error` shape, every success its typed serializer).

The examples are few (EXAMPLES per operation) to keep the test near half a minute on a loaded
2-core machine; the seed is fixed, so a failure reproduces.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator
from hypothesis import strategies as st
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

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
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


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
    REFERENCES.update(template="welcome", contact_list=contact_list, contact_ids=[contact], contact=contact)
    return {
        "/api/v1/templates/": [template],
        "/api/v1/lists/": [contact_list],
        "/api/v1/contacts/": [contact],
        "/api/v1/campaigns/": [campaign],
        "/api/v1/recurring-schedules/": [recurring],
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
        },
        "phases": {"coverage": {"enabled": COVERAGE}, "stateful": {"enabled": False}},
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


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
    """Some cases name a real object under the operation's path instead of a random id."""
    path = context.operation.path
    for prefix, pk in KNOWN.items():
        if path.startswith(prefix) and path_parameters:
            name = next(iter(path_parameters))
            return st.sampled_from([path_parameters, *({**path_parameters, name: v} for v in pk)])
    return st.just(path_parameters)


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Some cases refer to real objects (template, list, contact) where a body names one."""
    if not isinstance(body, dict):
        return st.just(body)
    known = {k: v for k, v in REFERENCES.items() if k in body}
    if isinstance(body.get("messages"), list):  # a batch: a good message, alone or among others
        return st.sampled_from(
            [
                {**body, "messages": [GOOD_MESSAGE]},
                {**body, "messages": [*body["messages"][:2], GOOD_MESSAGE]},
                body,
            ]
        )
    return st.sampled_from([{**body, **known}, body]) if known else st.just(body)


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
            stack.stop_all()
            KNOWN.clear()
            REFERENCES.clear()
            call_command("flush", interactive=False, verbosity=0)


@schema.parametrize()
def test_every_operation_answers_as_its_schema_says(
    case: schemathesis.Case, live_api: tuple[str, dict[str, str]]
) -> None:
    base, headers = live_api
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
