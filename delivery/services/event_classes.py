"""Who made each open and click of a batch of provider events, before it is recorded
(delivery/services/events.py calls `classified`): the rules are delivery/tracking/classify.py's;
this step gathers what they need for the batch at once, the messages' send times (one query) for
the scanner rule and the batch's clicks for the burst rule.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from delivery.models import EmailEvent
from delivery.tracking.classify import Hit, bursts, classify

if TYPE_CHECKING:
    from delivery.services.events import ProviderEvent

Kind = EmailEvent.Kind

ENGAGEMENT_KINDS = (Kind.OPENED, Kind.CLICKED)


def classified(events: list[ProviderEvent]) -> list[ProviderEvent]:
    """Every open and click with its class (delivery/tracking/classify.py): the ones the source
    left unclassified are classified here, with the message's send time (one query for the
    batch) for the scanner rule and the batch's clicks for the burst rule."""
    todo = [i for i, e in enumerate(events) if e.kind in ENGAGEMENT_KINDS and not e.classification]
    if not todo:
        return events
    sent_at = _sent_at(sorted({m for i in todo if (m := events[i].message_id) is not None}))
    in_burst = _in_burst(events, todo)
    scanner_seconds = settings.EMAILHUB_TRACKING_SCANNER_SECONDS
    result = list(events)
    for i in todo:
        result[i] = _with_class(events[i], sent_at, burst=i in in_burst, scanner_seconds=scanner_seconds)
    return result


def _sent_at(message_ids: list[int]) -> dict[int, datetime]:
    """When each of these messages was sent, for those that were: one query for the batch."""
    if not message_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, sent_at FROM delivery_message WHERE id = ANY(%s) AND sent_at IS NOT NULL",
            [message_ids],
        )
        return dict(cursor.fetchall())


def _link(event: ProviderEvent) -> str:
    """Which link a click is on: the tracking queue's link index, else the provider's URL (in
    detail)."""
    return str(event.payload.get("link", event.detail))


def _in_burst(events: list[ProviderEvent], todo: list[int]) -> set[int]:
    """The positions (in `events`, among `todo`) of the clicks on a known message that are part
    of a burst of the batch's clicks (classify.bursts)."""
    clicks = [i for i in todo if events[i].kind == Kind.CLICKED and events[i].message_id is not None]
    links = {link: n for n, link in enumerate({_link(events[i]) for i in clicks})}
    found = bursts(
        [
            (events[i].message_id or 0, links[_link(events[i])], events[i].occurred_at.timestamp())
            for i in clicks
        ]
    )
    return {clicks[p] for p in found}


def _with_class(
    event: ProviderEvent, sent_at: dict[int, datetime], *, burst: bool, scanner_seconds: float
) -> ProviderEvent:
    """`event` with the class classify gives its hit."""
    hit = Hit(
        kind=event.kind,
        user_agent=event.user_agent,
        ip=event.ip,
        occurred_at=event.occurred_at,
        sent_at=sent_at.get(event.message_id) if event.message_id is not None else None,
        machine_open=event.machine_open,
        burst=burst,
    )
    return replace(event, classification=classify(hit, scanner_seconds=scanner_seconds))
