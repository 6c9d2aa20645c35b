"""Segments: named filters over contacts, and the audiences campaigns take from them.

- `validate` checks a filter (campaigns.segment_filter) and that the lists and campaigns it
  names exist; the API, the admin and campaigns' own checks all call it, so a filter is refused
  the same way everywhere (InvalidFilter, `{path: message}`).
- `count` and `sample` read the audience now (campaigns.segment_sql), under
  EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS.
- `audience_condition` is what fan-out adds to each step of a campaign whose audience is a
  segment: the filter the campaign was scheduled with (`Campaign.audience_filter`, copied when it
  was scheduled, so an edit of the segment afterwards changes no campaign already on its way),
  compiled with its relative windows anchored at the campaign's start.

The membership rule (docs/architecture.md, "Segments"): membership is decided per fan-out step,
when the step reaches the contact. A step walks the next contacts by id and inserts a message
for each one that matches then; a contact the cursor has passed is never looked at again. So a
contact who starts matching during a long fan-out gets the campaign if its id is still ahead of
the cursor, and not if it was already passed; one who stops matching before its step gets
nothing. The relative windows do not slide during the fan-out (they end at the campaign's
start), so only the contacts' data moves, never the rule. A resumed fan-out continues at the
cursor and inserts nothing twice (the anti-join on the campaign's messages).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from campaigns.exceptions import InvalidFilter, SegmentInUse
from campaigns.models import Campaign, Segment
from campaigns.segment_filter import Node, parse, references
from campaigns.segment_sql import Compiled, compile_filter
from campaigns.segment_sql import count as count_sql
from campaigns.segment_sql import sample as sample_sql
from campaigns.selectors import audience_size
from campaigns.services import delete_audience

__all__ = [
    "InvalidFilter",
    "audience_condition",
    "campaign_audience_size",
    "count",
    "preview",
    "sample",
    "validate",
]


def validate(data: Any, *, limits: bool = True) -> Node:
    """The filter's tree, or InvalidFilter naming the bad nodes, or the lists and campaigns it
    names that do not exist (`limits`: see segment_filter.parse)."""
    node = parse(data, limits=limits)
    named = references(node)
    errors: dict[str, str] = {}
    if named.lists:
        # FOR KEY SHARE, for the rest of the caller's transaction (create and update save in
        # it): a list being deleted (campaigns.services.delete_audience locks its row first) is
        # waited for and then not found, and a delete after this waits for the save and then
        # finds the segment naming the list.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM campaigns_contactlist WHERE id = ANY(%s) FOR KEY SHARE", [list(named.lists)]
            )
            found = {row[0] for row in cursor.fetchall()}
        errors.update(
            {
                path: f"there is no list {list_id}"
                for list_id, path in named.lists.items()
                if list_id not in found
            }
        )
    if named.campaigns:
        found = set(Campaign.objects.filter(pk__in=named.campaigns).values_list("pk", flat=True))
        errors.update(
            {
                path: f"there is no campaign {campaign_id}"
                for campaign_id, path in named.campaigns.items()
                if campaign_id not in found
            }
        )
    if errors:
        raise InvalidFilter(errors)
    return node


def count(data: Any, *, list_id: int | None = None, anchor: datetime | None = None) -> int:
    return count_sql(validate(data), list_id=list_id, anchor=anchor)


def sample(
    data: Any, *, size: int, list_id: int | None = None, anchor: datetime | None = None
) -> list[dict[str, Any]]:
    return sample_sql(validate(data), size=size, list_id=list_id, anchor=anchor)


def preview(
    data: Any, *, size: int, list_id: int | None = None, anchor: datetime | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """The count and the first `size` contacts of one filter, checked once, at one anchor (what
    the API's preview and the admin's Preview show)."""
    node = validate(data)
    anchor = anchor or timezone.now()
    return (
        count_sql(node, list_id=list_id, anchor=anchor),
        sample_sql(node, size=size, list_id=list_id, anchor=anchor),
    )


def create(*, name: str, filter: Any, description: str = "") -> Segment:
    with transaction.atomic():
        validate(filter)
        return Segment.objects.create(name=name, description=description, filter=filter)


def update(segment_id: int, changes: dict[str, Any]) -> Segment:
    """Change a segment's name, description or filter (a new filter is validated first). The
    campaigns scheduled with it keep the filter they were scheduled with."""
    with transaction.atomic():
        if "filter" in changes:
            validate(changes["filter"])
        segment = Segment.objects.select_for_update().get(pk=segment_id)
        for name, value in changes.items():
            setattr(segment, name, value)
        segment.save(update_fields=[*changes, "updated_at"])
    return segment


def delete(segment: Segment) -> None:
    """Delete a segment no campaign or recurring schedule uses (SegmentInUse otherwise)."""
    delete_audience(segment, SegmentInUse)


def _campaign_filter(campaign: Campaign, segment_id: int) -> Node:
    data = campaign.audience_filter
    if data is None:  # a draft, not scheduled yet: the segment as it is
        data = Segment.objects.values_list("filter", flat=True).get(pk=segment_id)
    # Accepted when it was stored: a bound lowered since must not stop the campaign.
    return parse(data, limits=False)


def audience_condition(campaign: Campaign) -> Compiled | None:
    """The SQL condition fan-out adds for this campaign's segment (None for a list's campaign)."""
    if campaign.segment_id is None:
        return None
    node = _campaign_filter(campaign, campaign.segment_id)
    return compile_filter(node, anchor=campaign.started_at or timezone.now())


def campaign_audience_size(campaign: Campaign) -> int:
    """What a fan-out of this campaign started now would create (before per-message checks):
    its list's mailable members, or one count of its segment (narrowed to its list, if any)."""
    if campaign.segment_id is None:
        assert campaign.contact_list_id is not None  # the campaign_has_audience constraint
        return audience_size(campaign.contact_list_id)
    return count_sql(_campaign_filter(campaign, campaign.segment_id), list_id=campaign.contact_list_id)
