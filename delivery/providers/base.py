"""The provider interface: one base class fixes the steps, each provider module fills them in.

A provider receives a batch of ready-to-send emails and reports, for each one, whether the
provider accepted it (with the provider's message id), failed transiently (retry, maybe
elsewhere) or failed permanently (the address is bad: do not retry, suppress). A failure of the
provider as a whole raises ProviderUnavailable instead, which is what circuit breakers count.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class OutgoingEmail:
    message_id: int  # our database id, echoed in the X-Emailhub-Message header
    to: str
    from_email: str
    subject: str
    text: str
    html: str
    reply_to: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    provider_message_id: str | None = None
    error: str = ""

    @classmethod
    def accepted(cls, provider_message_id: str | None) -> SendResult:
        return cls(Outcome.ACCEPTED, provider_message_id)

    @classmethod
    def transient(cls, error: str) -> SendResult:
        return cls(Outcome.TRANSIENT, error=error)

    @classmethod
    def permanent(cls, error: str) -> SendResult:
        return cls(Outcome.PERMANENT, error=error)


class Provider(ABC):
    """Subclasses set ``name`` and implement ``send_batch``."""

    name: str = ""
    # The most emails one call of send_batch may carry (SendGrid: 1000 personalizations).
    max_batch: int = 500

    @abstractmethod
    def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendResult]:
        """Send every email; return one SendResult per email, in order.

        Raise ProviderUnavailable when the provider itself is down and nothing was accepted, so
        the whole batch can move to the next provider.
        """

    def close(self) -> None:  # noqa: B027 - optional hook; most providers hold nothing open
        """Release connections. Called when a worker process shuts down."""
