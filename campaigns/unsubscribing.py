"""Recording an unsubscribe: the service the `/u/<token>` view (campaigns/views.py) calls.

The link's token is campaigns/unsubscribe.py's. The unsubscribe goes through
`delivery.services.events.record_events` as a ProviderEvent of provider `emailhub`, kind
`unsubscribed`, with an event id per message: a repeated POST, a retried one or a second link of
the same message is a duplicate and changes nothing, and the campaign's `unsubscribed_count`
moves once per message. The suppression it causes is delivery's event recording's (the scope:
campaigns/unsubscribe.py, "Scope").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from campaigns.exceptions import InvalidToken
from campaigns.unsubscribe import read_token
from delivery.models import Message
from delivery.services.events import ProviderEvent, record_events

PROVIDER = "emailhub"


@dataclass(frozen=True)
class Target:
    message_id: int
    address: str
    campaign_id: int | None


def target_of(token: str) -> Target:
    """Who a token unsubscribes. Raises InvalidToken (also for a message that no longer exists)
    or ExpiredToken. Reads only."""
    message_id = read_token(token)
    row = Message.objects.filter(pk=message_id).values_list("to_email", "campaign_id").first()
    if row is None:
        raise InvalidToken("this link's message no longer exists")
    return Target(message_id=message_id, address=row[0].lower(), campaign_id=row[1])


def event_id_for(message_id: int) -> str:
    # Per message, not per token: every link of one message (a retried send issues a new token)
    # is the same unsubscribe.
    return f"unsubscribe:{message_id}"


def unsubscribe(token: str, *, one_click: bool) -> tuple[Target, bool]:
    """Record the unsubscribe of a token's address, synchronously (RFC 8058 §3.2: the POST's
    answer means it is done). Returns (target, whether this was new); a repeat changes nothing.
    Raises InvalidToken or ExpiredToken and then writes nothing."""
    target = target_of(token)
    recorded = record_events(
        [
            ProviderEvent(
                provider=PROVIDER,
                event_id=event_id_for(target.message_id),
                kind="unsubscribed",
                occurred_at=datetime.now(UTC),
                message_id=target.message_id,
                recipient=target.address,
                detail="one-click (RFC 8058)" if one_click else "unsubscribe page",
                payload={"campaign_id": target.campaign_id, "one_click": one_click},
            )
        ]
    )
    return target, recorded.new > 0
