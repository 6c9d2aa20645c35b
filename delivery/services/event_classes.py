"""Who made each open and click of a batch of provider events, before it is recorded
(delivery/services/events.py calls `classified`): the rules are delivery/tracking/classify.py's;
this step gathers what they need for the batch at once, the messages' send times (one query) for
the scanner rule and the batch's clicks for the burst rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import connection

from delivery.models import EmailEvent
from delivery.tracking.classify import Hit, bursts, classify

Kind = EmailEvent.Kind


class Engagement(Protocol):
    """What classifying needs of an event (delivery.services.events.ProviderEvent has it)."""

    @property
    def kind(self) -> str: ...
    @property
    def classification(self) -> str: ...
    @property
    def message_id(self) -> int | None: ...
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def payload(self) -> Mapping[str, Any]: ...
    @property
    def detail(self) -> str: ...
    @property
    def user_agent(self) -> str: ...
    @property
    def ip(self) -> str: ...
    @property
    def machine_open(self) -> bool: ...


ENGAGEMENT_KINDS = (Kind.OPENED, Kind.CLICKED)


def classes_of(events: Sequence[Engagement]) -> dict[int, str]:
    """The class (delivery/tracking/classify.py) of each open and click the source left
    unclassified, by its position in `events`: with the message's send time (one query for the
    batch) for the scanner rule and the batch's clicks for the burst rule."""
    todo = [i for i, e in enumerate(events) if e.kind in ENGAGEMENT_KINDS and not e.classification]
    if not todo:
        return {}
    sent_at = _sent_at(sorted({m for i in todo if (m := events[i].message_id) is not None}))
    in_burst = _in_burst(events, todo)
    scanner_seconds = settings.EMAILHUB_TRACKING_SCANNER_SECONDS
    return {
        i: _class_of(events[i], sent_at, burst=i in in_burst, scanner_seconds=scanner_seconds) for i in todo
    }


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


def _link(event: Engagement) -> str:
    """Which link a click is on: the tracking queue's link index, else the provider's URL (in
    detail)."""
    return str(event.payload.get("link", event.detail))


def _in_burst(events: Sequence[Engagement], todo: list[int]) -> set[int]:
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


def _class_of(event: Engagement, sent_at: dict[int, datetime], *, burst: bool, scanner_seconds: float) -> str:
    """The class classify gives `event`'s hit."""
    hit = Hit(
        kind=event.kind,
        user_agent=event.user_agent,
        ip=event.ip,
        occurred_at=event.occurred_at,
        sent_at=sent_at.get(event.message_id) if event.message_id is not None else None,
        machine_open=event.machine_open,
        burst=burst,
    )
    return classify(hit, scanner_seconds=scanner_seconds)
