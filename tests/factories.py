"""The models the tests create, each with sensible defaults, from one place.

Plain functions, one per model (and a bulk one where tests need many rows): keyword arguments
override any default, so a test names only what it is about. Audiences are generated in SQL (fast
for tens of thousands of contacts); everything else goes through the ORM or the product's own
service (API keys through delivery.authentication.create_api_key, which hashes the secret).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from rest_framework.test import APIClient

from campaigns.models import Campaign, Contact, ContactList, Template
from delivery.authentication import create_api_key
from delivery.models import ApiKey, ApiKeyScope, Message, MessageStatus

# --- API keys --------------------------------------------------------------------------------------


def api_key(*scopes: str, name: str | None = None) -> tuple[ApiKey, str]:
    """A new key (every scope unless `scopes` are given) and its secret, named uniquely."""
    return create_api_key(name or f"test-{time.monotonic_ns()}", list(scopes or ApiKeyScope.values))


def api_client(*scopes: str, name: str | None = None) -> tuple[APIClient, ApiKey]:
    """A DRF test client authenticated with a new key (api_key's scopes and name)."""
    key, raw = api_key(*scopes, name=name)
    return authenticated(raw), key


def authenticated(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


# --- templates, contacts, lists, campaigns --------------------------------------------------------


def template(name: str = "t", **fields: Any) -> Template:
    """A template named `name` with subject "s" and text "x" unless given."""
    return Template.objects.create(name=name, **{"subject": "s", "text": "x", **fields})


def contact_list(name: str = "l", **fields: Any) -> ContactList:
    return ContactList.objects.create(name=name, **fields)


def contact(email: str = "ann@example.com", **fields: Any) -> Contact:
    return Contact.objects.create(email=email, **fields)


def make_audience(size: int, *, name: str = "audience", prefix: str = "r") -> ContactList:
    """`size` contacts r1@example.com … with a first_name attribute, all members of a new list."""
    audience = ContactList.objects.create(name=name)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH new AS (
                INSERT INTO campaigns_contact (email, name, timezone, attributes, status, updated_at)
                SELECT %s || n || '@example.com', 'R ' || n, 'UTC',
                       jsonb_build_object('first_name', 'Name' || n), 'active', now()
                  FROM generate_series(1, %s) AS n
                RETURNING id
            )
            INSERT INTO campaigns_listmembership (contact_list_id, contact_id) SELECT %s, id FROM new
            """,
            [prefix, size, audience.pk],
        )
    return audience


def newsletter() -> Template:
    """The campaigns' shared template, "newsletter" (created the first time it is asked for)."""
    return Template.objects.get_or_create(
        name="newsletter",
        defaults={
            "subject": "Hello {{ first_name }}",
            "html": "<p>Hi {{ first_name }}</p>",
            "text": "Hi {{ first_name }}",
        },
    )[0]


def make_campaign(audience: ContactList, *, priority: str = "normal", name: str = "spring") -> Campaign:
    """A draft campaign of the "newsletter" template to `audience`."""
    return Campaign.objects.create(name=name, template=newsletter(), contact_list=audience, priority=priority)


def campaign(
    name: str = "c",
    *,
    template: Template | None = None,
    contact_list: ContactList | None = None,
    **fields: Any,
) -> Campaign:
    """A campaign (a draft unless `status` is given); without a template or list, of the template
    "t" and to the list "l" that every such campaign shares (created the first time)."""
    return Campaign.objects.create(
        name=name,
        template=template
        or Template.objects.get_or_create(name="t", defaults={"subject": "s", "text": "x"})[0],
        contact_list=contact_list or ContactList.objects.get_or_create(name="l")[0],
        **fields,
    )


def sending(campaign: Campaign) -> Campaign:
    """`campaign` moved to `sending` (as lifecycle.schedule would, without its fan-out task)."""
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.SENDING)
    campaign.refresh_from_db()
    return campaign


def sending_campaign(audience: ContactList, **fields: Any) -> Campaign:
    """make_campaign's campaign, already `sending` (fan_out then makes its messages)."""
    return sending(make_campaign(audience, **fields))


# --- messages --------------------------------------------------------------------------------------

QUEUED = {"subject": "Hi", "text": "hello", "priority": "critical", "status": MessageStatus.QUEUED}


def message(to: str = "ann@example.com", **fields: Any) -> Message:
    """A transactional message, `queued` at critical priority unless given."""
    return Message.objects.create(to_email=to, **{**QUEUED, **fields})


def messages(count: int, *, prefix: str = "user", **fields: Any) -> list[Message]:
    """`count` queued transactional messages to user0@example.com … at normal priority, in one
    INSERT."""
    values = {**QUEUED, "priority": "normal", **fields}
    return Message.objects.bulk_create(
        Message(to_email=f"{prefix}{n}@example.com", **values) for n in range(count)
    )


def campaign_messages(campaign: Campaign, **fields: Any) -> list[Message]:
    """One message of `campaign` per member of its list, in contact order, at normal priority
    (the rows fan-out makes, one ORM create each; `fields` sets the rest, e.g. the status)."""
    members = Contact.objects.filter(listmembership__contact_list=campaign.contact_list).order_by("id")
    return [
        Message.objects.create(
            campaign=campaign, contact=member, to_email=member.email, priority="normal", **fields
        )
        for member in members
    ]


def sent_message(to: str = "ann@example.com", **fields: Any) -> Message:
    """A message a provider accepted: `sent` by SES (at the model's default priority) unless given."""
    values = {"subject": "Hi", "text": "hello", "status": MessageStatus.SENT, "provider": "ses", **fields}
    return Message.objects.create(to_email=to, **values)


def message_body(n: int, **fields: Any) -> dict[str, Any]:
    """The JSON of one message for POST /api/v1/messages (or an item of a batch)."""
    return {"to": f"user{n}@example.com", "subject": f"Receipt #{n}", "text": f"Order {n}", **fields}
