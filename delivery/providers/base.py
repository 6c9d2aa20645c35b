"""The provider interface: one base class fixes the steps, each provider module fills them in
(django-anymail's `backends/base.py` shape). A provider is one module declaring a `Provider`
subclass with its `name` and a `from_settings()` that reads its own settings; the registry
(`delivery/providers/__init__.py`) loads the classes named in `EMAILHUB_PROVIDER_CLASSES`.

A provider receives a batch of ready-to-send emails and reports, for each one, whether the
provider accepted it (with the provider's message id), failed transiently (retry, maybe
elsewhere) or failed permanently (the address is bad: do not retry, suppress). A failure of the
provider as a whole raises ProviderUnavailable instead, which is what circuit breakers count;
a provider that rate-limits us raises ProviderThrottled, which pauses it and is not counted.

Before it hands an email to the wire, a provider asks the batch's `Guard` whether it may still
send it (the send path's guard is the worker's claim on the batch, delivery/services/lease.py):
the base class asks before every request, and a provider that writes one request in several
steps (SMTP's pipelined groups, SendGrid's resend after a 400) asks before each of them. An
email it may not send gets an ABANDONED result and nothing reaches the provider for it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Self
from urllib.parse import urlsplit

from core.retry_after import parse_retry_after  # noqa: F401 - the providers' name for it
from delivery.exceptions import ProviderThrottled, ProviderUnavailable, UnsupportedFeature


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    # Not sent: the guard said no (this worker's claim on the message ran out and another
    # worker may own it now). The send path records nothing for it.
    ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file sent with an email (delivery.attachments says what a valid one is)."""

    filename: str
    content_type: str
    content: bytes
    sha256: str  # of `content`: emails with the same files share a SendGrid request
    # Set for an inline image the HTML references as `cid:<content_id>`.
    content_id: str | None = None


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
    # Copies: cc named in the Cc header, bcc in no header; each provider gives them its own
    # way (SMTP envelope, SES Destination, SendGrid personalization).
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    attachments: tuple[Attachment, ...] = ()


@dataclass(frozen=True, slots=True)
class CopyRefused:
    """A cc or bcc address the provider refused while the message itself went on."""

    address: str
    error: str
    permanent: bool  # 5xx: the address is suppressed, as a bounced `to` is


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    provider_message_id: str | None = None
    error: str = ""
    # A permanent failure normally suppresses the address; not when the message itself is at
    # fault (it could not be built), since the address may be fine.
    suppress: bool = True
    # Set when the provider did not try this email at all (rate limited, no quota): it could be
    # tried in this many seconds, and trying it later costs the message no attempt.
    retry_after: float | None = None
    # Accepted: the copies the provider refused (the message went to the others).
    refused_copies: tuple[CopyRefused, ...] = ()

    @classmethod
    def accepted(
        cls, provider_message_id: str | None, refused_copies: tuple[CopyRefused, ...] = ()
    ) -> SendResult:
        return cls(Outcome.ACCEPTED, provider_message_id, refused_copies=refused_copies)

    @classmethod
    def transient(cls, error: str) -> SendResult:
        return cls(Outcome.TRANSIENT, error=error)

    @classmethod
    def permanent(cls, error: str) -> SendResult:
        return cls(Outcome.PERMANENT, error=error)

    @classmethod
    def not_tried(cls, error: str, retry_after: float) -> SendResult:
        return cls(Outcome.TRANSIENT, error=error, retry_after=retry_after)

    @classmethod
    def unbuildable(cls, error: str) -> SendResult:
        return cls(Outcome.PERMANENT, error=f"message cannot be built: {error}", suppress=False)

    @classmethod
    def abandoned(cls) -> SendResult:
        return cls(Outcome.ABANDONED, error="not sent: this worker no longer holds the message")

    @classmethod
    def unsupported(cls, error: str) -> SendResult:
        # The message, not the address, is at fault; put a provider that can honour it earlier
        # in the chain.
        return cls(Outcome.PERMANENT, error=f"not supported by this provider: {error}", suppress=False)


class Guard:
    """Asked just before an email is handed to the provider: may this worker still send it?

    This one always says yes (a provider used outside the send path). The send path's guard is
    its claim on the batch (delivery.services.lease.ClaimLease), which says no once the claim
    is lost. `allows` runs before every message, so it must be cheap: a clock reading and a
    comparison, a database round trip only when the claim needs confirming.
    """

    def allows(self, message_id: int) -> bool:
        return True


UNGUARDED = Guard()


def nothing_sent(results: dict[int, SendResult]) -> bool:
    """True when none of `results` reached the provider (there are none, or all were abandoned):
    a provider failing now failed before it accepted anything."""
    return all(result.outcome is Outcome.ABANDONED for result in results.values())


def gone_part_way(
    provider: str, emails: Iterable[OutgoingEmail], results: dict[int, SendResult], exc: ProviderUnavailable
) -> dict[int, SendResult]:
    """`results` once `provider` went down part-way through `emails`: `exc` is raised again if
    nothing had reached it (the batch moves on to the next provider whole, and the breaker
    counts the failure); otherwise what was accepted stays accepted and the rest is reported
    transient, so it is retried, not re-sent elsewhere twice."""
    if nothing_sent(results):
        raise exc
    error = SendResult.transient(f"{provider} became unavailable: {exc}")
    for email in emails:
        results.setdefault(email.message_id, error)
    return results


class Provider:
    """A provider plug-in. Subclasses set ``name`` and fill in the steps of ``send_batch``.

    The steps, in this order (the base class fixes them, as django-anymail's
    ``AnymailBaseBackend`` does with build_message_payload → post_to_esp → parse_response):

    1. ``check(email)``, per email: raise UnsupportedFeature for anything this provider cannot
       honour. That email fails (not suppressed); the others go on. Nothing is dropped silently.
    2. ``split(emails)``: the requests the batch becomes, one email each by default.
    3. ``send_request(request, guard)``: build the request, send it, read the answer: one
       SendResult per email, by our message id. By default, ``send_one`` of the request's one
       email. The base class has asked ``guard`` about every email of the request just before;
       a provider that puts the request on the wire in several steps asks again before each.
    """

    name: ClassVar[str] = ""
    # Which server this instance sends to, without credentials ("relay.example.com:587", an API
    # URL): one provider name may point at different servers in different processes (the bulk
    # pool's SMTP_HOST another relay than the transactional pool's), and each server gets its own
    # circuit, send-rate bucket and pause (delivery/services/gateway.py). Empty: the provider has
    # one endpoint, and its name alone names its circuit.
    endpoint: str = ""

    @classmethod
    def from_settings(cls) -> Self:
        """Build the provider from Django settings (its own block in emailhub/settings.py).
        Raises ProviderConfigurationError naming the setting when one is missing or wrong."""
        return cls()

    def send_batch(self, emails: Sequence[OutgoingEmail], guard: Guard = UNGUARDED) -> list[SendResult]:
        """Send every email `guard` allows; return one SendResult per email, in order (ABANDONED
        for those it did not allow).

        Raises ProviderUnavailable when the provider is down before anything was accepted, so
        the whole batch can move to the next provider (and the breaker counts one failure).
        If it goes down part-way, what was not sent is reported transient: it is retried, and
        what was accepted is not sent again elsewhere.
        """
        results: dict[int, SendResult] = {}
        sendable: list[OutgoingEmail] = []
        for email in emails:
            try:
                self.check(email)
            except UnsupportedFeature as exc:
                results[email.message_id] = SendResult.unsupported(str(exc))
            else:
                sendable.append(email)
        for request in self.split(sendable):
            held = [email for email in request if guard.allows(email.message_id)]
            if len(held) < len(request):
                kept = {email.message_id for email in held}
                results.update(
                    (e.message_id, SendResult.abandoned()) for e in request if e.message_id not in kept
                )
            if not held:
                continue
            try:
                results.update(self.send_request(held, guard))
            except ValueError as exc:  # raised by delivery.providers.mime for what it cannot encode
                results.update((email.message_id, SendResult.unbuildable(str(exc))) for email in held)
            except ProviderThrottled as exc:
                # Rate limited part-way: what was accepted stays accepted; the gateway pauses
                # the provider and reports the rest as not tried.
                exc.partial = {**results, **exc.partial}  # a request's own part-way results too
                raise
            except ProviderUnavailable as exc:
                gone_part_way(self.name, emails, results, exc)
                break
        return [results[email.message_id] for email in emails]

    def check(self, email: OutgoingEmail) -> None:
        """Step 1: raise UnsupportedFeature if this provider cannot send `email` as asked."""

    def split(self, emails: Sequence[OutgoingEmail]) -> list[list[OutgoingEmail]]:
        """Step 2: the provider requests that carry `emails`; one email per request by default."""
        return [[email] for email in emails]

    def send_request(self, request: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        """Step 3: send one request; a SendResult per email, keyed by our message id.

        Every email of `request` was allowed by `guard` just now; ask it again before any later
        write that hands an email over (ABANDONED for those it no longer allows). Raises
        ProviderUnavailable or ProviderThrottled for a provider-wide refusal, ValueError for a
        message that cannot be encoded."""
        return {email.message_id: self.send_one(email) for email in request}

    def send_one(self, email: OutgoingEmail) -> SendResult:
        raise NotImplementedError(f"{type(self).__name__} must implement send_one or send_request")

    def close(self) -> None:  # noqa: B027 - optional hook; most providers hold nothing open
        """Release connections. Called when a worker process shuts down."""


def url_endpoint(url: str) -> str:
    """An API URL as an endpoint: scheme, host, port and path, without user, password, query or
    fragment (which may carry credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}" if parts.scheme else url
