"""API key scopes (send, read, manage), message ownership, and listing and revoking keys."""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Iterator
from io import StringIO

import pytest
import requests
from django.apps import apps
from django.core.management import CommandError, call_command
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from campaigns.models import Contact
from delivery.authentication import create_api_key
from delivery.models import ApiKey, Message
from scripts.stack import Stack
from tests import factories

BODY = {"to": "ann@example.com", "subject": "Your code", "text": "123456", "priority": "critical"}
MESSAGE_ROUTES = ("/api/v1/messages",)


def api_routes() -> Iterator[tuple[str, type]]:
    """Every /api/v1/ route with its view class, ids filled in with 1."""

    def walk(patterns: list, prefix: str) -> Iterator[tuple[str, type]]:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and hasattr(pattern.callback, "view_class"):
                route = re.sub(r"<uuid:\w+>", "00000000-0000-0000-0000-000000000001", route)
                yield "/" + re.sub(r"<(?:\w+:)?\w+>", "1", route), pattern.callback.view_class

    for route, view_class in walk(get_resolver().url_patterns, ""):
        if route.startswith("/api/v1/"):
            yield route, view_class


def methods_of(view_class: type) -> list[str]:
    return [m for m in ("get", "post", "put", "patch", "delete") if hasattr(view_class, m)]


def missing_scope_named(response, scope: str) -> bool:  # noqa: ANN001
    return response.status_code == 403 and f"`{scope}`" in json.dumps(response.json())


@pytest.mark.django_db
def test_create_api_key_defaults_to_send_and_read_and_takes_scopes() -> None:
    call_command("create_api_key", "billing", stdout=StringIO())
    call_command("create_api_key", "ops", "--scopes", "manage,read", stdout=StringIO())
    assert ApiKey.objects.get(name="billing").scopes == ["send", "read"]
    assert ApiKey.objects.get(name="ops").scopes == ["manage", "read"]


@pytest.mark.django_db
@pytest.mark.parametrize("scopes", ["admin", "send,everything", ",", ""])
def test_create_api_key_refuses_unknown_scopes_and_creates_nothing(scopes: str) -> None:
    with pytest.raises(CommandError, match="scope"):
        call_command("create_api_key", "billing", "--scopes", scopes, stdout=StringIO())
    assert not ApiKey.objects.exists()


@pytest.mark.django_db
def test_a_key_without_send_gets_403_naming_send_and_nothing_is_stored() -> None:
    reader, _ = factories.api_client("read")
    response = reader.post("/api/v1/messages", BODY, format="json")
    assert missing_scope_named(response, "send"), response.content
    assert not Message.objects.exists()


@pytest.mark.django_db
def test_a_key_without_read_gets_403_naming_read_on_messages() -> None:
    sender, _ = factories.api_client("send")
    message_id = sender.post("/api/v1/messages", BODY, format="json").json()["id"]
    assert missing_scope_named(sender.get(f"/api/v1/messages/{message_id}"), "read")
    assert missing_scope_named(sender.get("/api/v1/messages"), "read")


@pytest.mark.django_db
def test_an_application_key_gets_403_naming_manage_on_every_other_endpoint() -> None:
    app_client, _ = factories.api_client("send", "read")
    checked = 0
    for route, view_class in api_routes():
        if route in MESSAGE_ROUTES or route.startswith("/api/v1/messages/"):
            continue
        if route.startswith("/api/v1/webhooks/"):
            continue  # no key at all: the provider's signature is the auth (tests/test_webhook_*.py)
        if route.startswith("/api/v1/webhook-endpoints"):
            continue  # an application's own endpoints: send and read keys (tests/test_outbound_api.py)
        for method in methods_of(view_class):
            response = getattr(app_client, method)(route, {"email": "x@example.com"}, format="json")
            assert missing_scope_named(response, "manage"), (method, route, response.status_code)
            checked += 1
    # Contacts, lists, suppressions, templates, campaigns, schedules, providers at least.
    assert checked >= 20
    assert not Contact.objects.exists()


@pytest.mark.django_db
def test_a_key_sees_only_its_own_messages_and_anothers_is_404() -> None:
    alice, alice_key = factories.api_client("send", "read")
    bob, _ = factories.api_client("send", "read")
    mine = [alice.post("/api/v1/messages", BODY, format="json").json()["id"] for _ in range(2)]
    theirs = bob.post("/api/v1/messages", {**BODY, "to": "bob@example.com"}, format="json").json()["id"]
    Message.objects.create(to_email="campaign@example.com", subject="s", text="t")  # no key

    assert [m["id"] for m in alice.get("/api/v1/messages").json()["results"]] == mine[::-1]
    assert [m["id"] for m in bob.get("/api/v1/messages").json()["results"]] == [theirs]
    assert alice.get(f"/api/v1/messages/{mine[0]}").json()["to"] == "ann@example.com"
    # Another key's message and a message that does not exist answer alike: ids are no oracle.
    other, missing = alice.get(f"/api/v1/messages/{theirs}"), alice.get("/api/v1/messages/999999999")
    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json() and "bob@example.com" not in other.content.decode()
    assert Message.objects.filter(api_key=alice_key).count() == 2


@pytest.mark.django_db
def test_a_manage_key_reads_every_keys_messages() -> None:
    alice, _ = factories.api_client("send", "read")
    operator, _ = factories.api_client("manage")
    sent = alice.post("/api/v1/messages", BODY, format="json").json()["id"]
    unkeyed = Message.objects.create(to_email="campaign@example.com", subject="s", text="t").pk
    assert operator.get(f"/api/v1/messages/{sent}").status_code == 200
    assert {m["id"] for m in operator.get("/api/v1/messages").json()["results"]} == {sent, unkeyed}
    assert missing_scope_named(operator.post("/api/v1/messages", BODY, format="json"), "send")


@pytest.mark.django_db
def test_message_list_is_paginated_by_cursor() -> None:
    alice, _ = factories.api_client("send", "read")
    ids = [alice.post("/api/v1/messages", BODY, format="json").json()["id"] for _ in range(3)]
    page = alice.get("/api/v1/messages", {"page_size": 2}).json()
    assert [m["id"] for m in page["results"]] == ids[:0:-1] and page["next"]
    rest = alice.get(page["next"]).json()
    assert [m["id"] for m in rest["results"]] == [ids[0]] and rest["next"] is None


def test_message_list_requires_a_key() -> None:
    assert APIClient().get("/api/v1/messages").status_code == 401


@pytest.mark.django_db
def test_migration_keeps_keys_made_before_scopes_at_full_access() -> None:
    create_api_key("legacy-1", ["send"])
    create_api_key("legacy-2")
    migration = importlib.import_module("delivery.migrations.0004_api_key_scopes")
    migration.keep_existing_keys_full_access(apps, None)
    assert list(ApiKey.objects.values_list("scopes", flat=True)) == [["send", "read", "manage"]] * 2


@pytest.mark.django_db
def test_list_api_keys_shows_name_prefix_scopes_and_revocation_never_the_key() -> None:
    billing, raw = create_api_key("billing")
    create_api_key("ops", ["manage"])
    call_command("revoke_api_key", "ops", stdout=StringIO())
    out = StringIO()
    call_command("list_api_keys", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAME", "PREFIX", "SCOPES", "CREATED", "REVOKED"]
    billing_line, ops_line = lines[1].split(), lines[2].split()
    assert billing_line[:3] == ["billing", billing.prefix, "send,read"] and billing_line[4] == "-"
    assert ops_line[0] == "ops" and ops_line[2] == "manage" and ops_line[4] != "-"
    assert raw not in out.getvalue() and billing.key_hash not in out.getvalue()
    active = StringIO()
    call_command("list_api_keys", "--active", stdout=active)
    assert "ops" not in active.getvalue() and "billing" in active.getvalue()


@pytest.mark.django_db
def test_revoke_api_key_by_name_or_prefix_refuses_the_key_at_once_in_this_process() -> None:
    client, key = factories.api_client("send", "read", name="billing")
    assert client.get("/api/v1/messages").status_code == 200  # now cached in this process
    out = StringIO()
    call_command("revoke_api_key", key.prefix, stdout=out)
    assert "revoked billing" in out.getvalue() and "EMAILHUB_API_KEY_CACHE_SECONDS" in out.getvalue()
    assert client.get("/api/v1/messages").status_code == 401
    first = ApiKey.objects.get(pk=key.pk).revoked_at
    again = StringIO()
    call_command("revoke_api_key", "billing", stdout=again)
    assert "already revoked" in again.getvalue() and ApiKey.objects.get(pk=key.pk).revoked_at == first


@pytest.mark.django_db
@pytest.mark.parametrize("ident", ["nobody", "eh_nothing", " "])
def test_revoke_api_key_refuses_an_unknown_key_and_changes_nothing(ident: str) -> None:
    create_api_key("billing")
    with pytest.raises(CommandError):
        call_command("revoke_api_key", ident, stdout=StringIO())
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


@pytest.mark.django_db
def test_revoke_api_key_refuses_to_guess_between_two_keys() -> None:
    first, _ = create_api_key("billing")
    create_api_key(first.prefix)  # a key named like another key's prefix
    with pytest.raises(CommandError, match="more than one"):
        call_command("revoke_api_key", first.prefix, stdout=StringIO())
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


@pytest.mark.django_db
def test_admin_revokes_by_action_and_a_save_never_unrevokes(admin_client) -> None:  # noqa: ANN001
    client, key = factories.api_client("send", "read", name="billing")
    change_url = reverse("admin:delivery_apikey_change", args=[key.pk])
    assert admin_client.get(change_url).status_code == 200  # the page is opened ...
    changelist = reverse("admin:delivery_apikey_changelist")
    admin_client.post(changelist, {"action": "revoke_api_keys", "_selected_action": [key.pk]})
    revoked_at = ApiKey.objects.get(pk=key.pk).revoked_at
    assert revoked_at is not None
    # ... and saved after the revocation, with a scope changed: the key stays revoked.
    response = admin_client.post(change_url, {"name": "billing", "scopes": ["send", "read", "manage"]})
    assert response.status_code == 302, response.content.decode()[:2000]
    key.refresh_from_db()
    assert key.revoked_at == revoked_at and key.scopes == ["send", "read", "manage"]
    assert client.get("/api/v1/messages").status_code == 401


@pytest.mark.django_db
def test_admin_cannot_add_or_delete_keys_and_refuses_an_unknown_scope(admin_client) -> None:  # noqa: ANN001
    _, key = factories.api_client("send", name="billing")
    assert admin_client.get(reverse("admin:delivery_apikey_add")).status_code == 403
    assert (
        admin_client.post(reverse("admin:delivery_apikey_delete", args=[key.pk]), {"post": "yes"}).status_code
        == 403
    )
    change_url = reverse("admin:delivery_apikey_change", args=[key.pk])
    response = admin_client.post(change_url, {"name": "billing", "scopes": ["root"]})
    assert response.status_code == 200 and "root" in response.content.decode()
    key.refresh_from_db()
    assert key.scopes == ["send"] and ApiKey.objects.count() == 1


@pytest.mark.django_db
def test_a_scope_granted_in_the_admin_applies_to_the_next_request(admin_client) -> None:  # noqa: ANN001
    client, key = factories.api_client("send", name="billing")
    assert client.get("/api/v1/messages").status_code == 403
    admin_client.post(
        reverse("admin:delivery_apikey_change", args=[key.pk]),
        {"name": "billing", "scopes": ["send", "read"]},
    )
    assert client.get("/api/v1/messages").status_code == 200


def test_openapi_schema_has_the_bearer_scheme_and_each_operations_scope(api: APIClient) -> None:
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    scheme = schema["components"]["securitySchemes"]["ApiKey"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    messages = schema["paths"]["/api/v1/messages"]
    assert messages["post"]["x-required-scopes"] == ["send"]
    assert messages["get"]["x-required-scopes"] == ["read", "manage"]
    assert "`send`" in messages["post"]["description"]
    assert schema["paths"]["/api/v1/messages/{message_id}"]["get"]["x-required-scopes"] == ["read", "manage"]
    assert schema["paths"]["/api/v1/contacts"]["post"]["x-required-scopes"] == ["manage"]
    # Provider webhooks take no key (their signature is the auth) and say so; everything else needs one.
    webhook = schema["paths"].pop("/api/v1/webhooks/{provider}")["post"]
    assert webhook["x-required-scopes"] == [] and not webhook.get("security")
    assert "No API key" in webhook["description"]
    for operations in schema["paths"].values():
        for operation in operations.values():
            assert operation["x-required-scopes"] and {"ApiKey": []} in operation["security"]


def test_revoked_key_is_refused_by_every_web_worker_after_the_cache_time(
    stack: Stack,
    web_port: int,
) -> None:
    cache_seconds = 1.0
    key, raw = create_api_key("billing", ["send", "read"])
    stack.start_web(web_port, workers=2, extra_env={"EMAILHUB_API_KEY_CACHE_SECONDS": str(cache_seconds)})
    url = f"http://127.0.0.1:{web_port}/api/v1/messages"
    headers = {"Authorization": f"Bearer {raw}"}
    # Warm the cache of both gunicorn workers (each request may land on either).
    assert all(requests.get(url, headers=headers, timeout=10).status_code == 200 for _ in range(10))

    call_command("revoke_api_key", "billing", stdout=StringIO())
    time.sleep(cache_seconds + 0.5)  # the documented bound; no worker may accept the key after it
    statuses = {requests.get(url, headers=headers, timeout=10).status_code for _ in range(20)}
    assert statuses == {401}
    key.refresh_from_db()
    assert key.revoked_at is not None
