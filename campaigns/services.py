"""Writes to audiences and templates that other apps may call."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import ProtectedError

from campaigns.exceptions import InUse, ListInUse
from campaigns.models import Campaign, Contact, ContactList, ListMembership, Segment, Template
from core.sql import literals
from core.templating import EmailTemplate


def compile_template(template: Template) -> EmailTemplate:
    return EmailTemplate(template.subject, template.html, template.text, template.defaults)


def contact_context(contact: Contact | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The variables a template sees: the contact's attributes, its fields, then request context."""
    context: dict[str, Any] = {}
    if contact is not None:
        context.update(contact.attributes or {})
        context.update(email=contact.email, name=contact.name, timezone=contact.timezone)
    if extra:
        context.update(extra)
    return context


def delete_contact_list(contact_list: ContactList) -> None:
    """Delete a list and its memberships; its contacts stay. Raises ListInUse while it is used."""
    delete_audience(contact_list, ListInUse)


def delete_audience(audience: ContactList | Segment, in_use: type[InUse]) -> None:
    """Delete a list or a segment, or raise `in_use` naming what still points at it: campaigns
    and recurring schedules (FK PROTECT), and for a list the segments whose filter names it
    and the unfinished campaigns scheduled with such a filter (their audience would silently
    lose the list's members)."""
    try:
        with transaction.atomic():
            if isinstance(audience, ContactList):
                # Locked first: a segment saved meanwhile naming it takes a share lock on this row
                # (campaigns.segments.validate) and waits, or is seen by the search below.
                ContactList.objects.select_for_update().filter(pk=audience.pk).first()
            users = _filters_naming(audience.pk) if isinstance(audience, ContactList) else []
            if users:
                raise in_use(audience, users)
            audience.delete()
    except ProtectedError as exc:
        users = sorted(f"{obj._meta.verbose_name} {obj.pk} ({obj})" for obj in exc.protected_objects)
        raise in_use(audience, users) from None


CAMPAIGN = literals(Campaign.Status)
# A filter's list conditions, anywhere in its tree: {"list": <id>, "op": …} (campaigns.segment_filter).
_NAMES_LIST = "jsonb_path_exists({column}, '$.** ? (@.list == $id)', jsonb_build_object('id', %s::bigint))"


def _filters_naming(list_id: int) -> list[str]:
    """The segments, and the unfinished campaigns' copied filters, that name list `list_id`
    (small tables; the caller holds the list's row lock, which a save naming it waits for)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT 'segment ' || id || ' (' || name || ')' FROM campaigns_segment
             WHERE {_NAMES_LIST.format(column="filter")}
            UNION ALL
            SELECT 'campaign ' || id || ' (' || name || ')' FROM campaigns_campaign
             WHERE status IN ({CAMPAIGN.DRAFT}, {CAMPAIGN.SCHEDULED}, {CAMPAIGN.SENDING}, {CAMPAIGN.PAUSED})
               AND audience_filter IS NOT NULL
               AND {_NAMES_LIST.format(column="audience_filter")}
            """,
            [list_id, list_id],
        )
        return sorted(row[0] for row in cursor.fetchall())


def add_list_members(contact_list: ContactList, contact_ids: list[int]) -> int:
    """Add contacts to a list in one statement; returns how many were not members yet.

    Ids of contacts that do not exist (or were deleted meanwhile) are skipped by the join.
    """
    if not contact_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO campaigns_listmembership (contact_list_id, contact_id)
            SELECT %s, c.id FROM campaigns_contact AS c WHERE c.id = ANY(%s::bigint[])
            ON CONFLICT (contact_list_id, contact_id) DO NOTHING
            """,
            [contact_list.pk, list(contact_ids)],
        )
        return cursor.rowcount


def remove_list_members(contact_list: ContactList, contact_ids: list[int]) -> int:
    """Remove contacts from a list (the contacts stay); returns how many were members."""
    if not contact_ids:
        return 0
    # No signals or dependants, so Django deletes with one DELETE … WHERE, not row by row.
    removed, _ = ListMembership.objects.filter(contact_list=contact_list, contact_id__in=contact_ids).delete()
    return removed
