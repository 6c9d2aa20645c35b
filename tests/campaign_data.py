"""Audiences for campaign tests, generated in SQL (fast for tens of thousands of contacts)."""

from __future__ import annotations

from django.db import connection

from campaigns.models import Campaign, ContactList, Template


def make_audience(size: int, *, name: str = "audience", prefix: str = "r") -> ContactList:
    """`size` contacts r1@example.com … with a first_name attribute, all members of a new list."""
    contact_list = ContactList.objects.create(name=name)
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
            [prefix, size, contact_list.pk],
        )
    return contact_list


def make_campaign(contact_list: ContactList, *, priority: str = "normal", name: str = "spring") -> Campaign:
    template, _ = Template.objects.get_or_create(
        name="newsletter",
        defaults={
            "subject": "Hello {{ first_name }}",
            "html": "<p>Hi {{ first_name }}</p>",
            "text": "Hi {{ first_name }}",
        },
    )
    return Campaign.objects.create(name=name, template=template, contact_list=contact_list, priority=priority)
