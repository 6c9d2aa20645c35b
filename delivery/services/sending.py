"""Sending a batch of messages: claim, compose, deliver through the provider chain, record.

Every step is set-based: one UPDATE … RETURNING claims the whole batch and tells which
addresses are suppressed (rows another worker already claimed or finished are simply not
returned, which is what makes a redelivered task harmless), compose (delivery/services/compose.py)
loads what the emails are built from once per batch, and one UPDATE per outcome records the
results.
The claim is held under a lease (delivery/services/lease.py): the providers ask it before every
message they hand over, and what it no longer allows is abandoned, neither sent nor recorded.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from campaigns.models import Priority
from delivery.exceptions import ProviderSkipped, ProviderUnavailable
from delivery.models import EmailEvent
from delivery.providers import Outcome, OutgoingEmail, SendResult
from delivery.providers.base import CopyRefused
from delivery.services import send_tasks
from delivery.services.compose import compose
from delivery.services.events import ProviderEvent, record_events
from delivery.services.gateway import BULK, TRANSACTIONAL, send_via
from delivery.services.lease import CLOCK, ClaimLease
from delivery.services.recording import record
from delivery.services.transitions import ClaimedMessage, Outcomes, claim, claim_pool

logger = logging.getLogger(__name__)


def pool_for(priority: str) -> str:
    return TRANSACTIONAL if priority in (Priority.CRITICAL, Priority.HIGH) else BULK


def provider_chain(pool: str) -> list[str]:
    if pool == TRANSACTIONAL:
        return list(settings.EMAILHUB_PROVIDERS_TRANSACTIONAL)
    return list(settings.EMAILHUB_PROVIDERS_BULK)


@dataclass
class BatchReport:
    claimed: int = 0
    sent: int = 0
    failed: int = 0
    suppressed: int = 0
    retrying: int = 0
    # Claimed, then lost before they were sent (the worker stalled past its lease): not recorded.
    abandoned: int = 0

    def add(self, other: BatchReport) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def send_messages(
    message_ids: Sequence[int],
    *,
    priority: str | None = None,
    wake: bool = False,
    clock: Callable[[], float] = CLOCK,
) -> BatchReport:
    """Send the given messages that are still `queued` (and whose campaign, if any, is sending):
    claim → compose → deliver over the provider chain → record.

    A task of the transactional pool (`priority` critical or high) claims from the pool instead,
    as long as messages wait (`_send_pooled`); `wake`: the task was published for the pool (an
    accepted message's doorbell, a full claim's call for help), not for ids of its own.
    `clock` is the lease's (delivery.services.lease.CLOCK; tests pass their own)."""
    if priority in send_tasks.POOLED and (wake or send_tasks.pooling()):
        return _send_pooled(message_ids, priority, wake=wake, clock=clock)
    asked_at = clock()  # before the claim is sent: the lease is never overestimated
    return _send_claimed(claim(message_ids), asked_at, clock)


def _send_pooled(
    message_ids: Sequence[int], priority: str, *, wake: bool, clock: Callable[[], float]
) -> BatchReport:
    """The adaptive claim (docs/architecture.md "Adaptive claims"): claim the pool's oldest waiting
    messages, up to EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT (one when one waits), and send them; then
    wait up to EMAILHUB_TRANSACTIONAL_LINGER_SECONDS for a wake-up and claim again when one comes
    (at once after a full claim; after a claim of several, EMAILHUB_TRANSACTIONAL_GATHER_SECONDS
    later, so the next one takes more). While this runs the pool's doorbell stays set, so what is
    accepted meanwhile publishes no task (it pushes a wake-up): this loop takes it, a batch at a
    time. When no wake-up comes, the doorbell is unset and the pool claimed until none waits, for
    what was committed before that.

    A full claim asks for another task, so the pool's other processes help (a slow provider,
    one message at a time, would otherwise hold the pool to one process). A task that has run
    EMAILHUB_TRANSACTIONAL_TASK_SECONDS hands what is left to a new one and ends (Celery's other
    queues, the visibility timeout); one that is not a doorbell also hands on the ids of its own
    it did not take (a campaign's, which no pool scan finds)."""
    limit = max(settings.EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT, 1)
    deadline = time.monotonic() + settings.EMAILHUB_TRANSACTIONAL_TASK_SECONDS
    report = BatchReport()
    taken: set[int] = set()
    ringing = True  # the doorbell is set: what is accepted meanwhile pushes a wake-up
    token = uuid.uuid4().hex  # this task's mark on the doorbell, while it lingers on it
    asked_at = clock()
    claimed = claim_pool(message_ids, priority, limit)
    while claimed or ringing:
        full = len(claimed) >= limit
        if claimed:
            if full:
                send_tasks.ring(priority)
            taken.update(m.id for m in claimed)
            report.add(_send_claimed(claimed, asked_at, clock))
            if time.monotonic() >= deadline:
                if not full:  # a full claim's helper is the new task already
                    send_tasks.ring(priority)
                left = [i for i in message_ids if i not in taken]
                if left and not wake:
                    send_tasks.record_send(left, priority)
                return report
        # A claim short of the limit took everything waiting that no other claim holds; what is
        # accepted after it pushes a wake-up while the doorbell is set. So: claim again at once
        # after a full claim, or once the doorbell is unset (draining); else wait for a wake-up.
        if ringing and not full:
            linger = settings.EMAILHUB_TRANSACTIONAL_LINGER_SECONDS
            if time.monotonic() >= deadline or not send_tasks.linger(linger, token):
                send_tasks.answer(token)
                ringing = False
            elif len(claimed) > 1:
                # Under load (the last claim found several): let the next few arrive first.
                time.sleep(settings.EMAILHUB_TRANSACTIONAL_GATHER_SECONDS)
        asked_at = clock()
        claimed = claim_pool(message_ids, priority, limit)
    return report


def _send_claimed(claimed: list[ClaimedMessage], asked_at: float, clock: Callable[[], float]) -> BatchReport:
    if not claimed:
        return BatchReport()
    lease = ClaimLease(
        claimed, asked_at=asked_at, lease_seconds=settings.EMAILHUB_SENDING_LEASE_SECONDS, clock=clock
    )
    outcomes = Outcomes()
    outcomes.suppressed = [(m.id, "address is on the suppression list") for m in claimed if m.suppressed]
    sendable = [m for m in claimed if not m.suppressed]
    # A batch never mixes pools: fan-out and the sweeps group ids by priority.
    delivery = _Delivery(outcomes, lease, pool_for(sendable[0].priority) if sendable else BULK)
    for part in by_attachment_bytes(sendable, settings.EMAILHUB_SEND_PART_BYTES):
        emails, unbuildable = compose(part)
        outcomes.failed += unbuildable
        delivery.settle(delivery.over_chain(emails), {m.id: m for m in part})
    if lease.token is not None:
        record(outcomes, lease.token, campaign_rows=any(m.campaign_id is not None for m in claimed))
        _record_left_out(sendable, outcomes, delivery.refused_copies)
    return BatchReport(
        claimed=len(claimed),
        sent=sum(len(sent) for sent in outcomes.sent.values()),
        failed=len(outcomes.failed),
        suppressed=len(outcomes.suppressed),
        retrying=len(outcomes.retry) + len(outcomes.deferred),
        abandoned=len(lease.lost),
    )


def by_attachment_bytes(messages: list[ClaimedMessage], budget: int) -> list[list[ClaimedMessage]]:
    """`messages` in consecutive parts whose attachments add up to at most `budget` bytes (a
    message over it alone): each part is composed, sent and let go before the next, so a
    worker holds one part's contents and rendered MIME, not a batch's (a batch of 100 with a
    10 MiB file each would be 1 GiB of contents and 1.4 GiB of base64). A batch without
    attachments is one part: nothing changes for it."""
    parts: list[list[ClaimedMessage]] = [[]]
    held = 0
    for message in messages:
        size = sum(int(a.get("size", 0)) for a in message.attachments or ())
        if parts[-1] and held + size > budget:
            parts.append([])
            held = 0
        parts[-1].append(message)
        held += size
    return parts if parts[0] else []


class _Delivery:
    """One batch's way down the provider chain, and what it learnt on the way: the outcomes, each
    message's last error, the messages some provider really tried (it was called with them), and
    for the others, only ever skipped (open circuit, paused, no quota), the soonest moment one
    could be tried, which they wait for without spending an attempt."""

    def __init__(self, outcomes: Outcomes, lease: ClaimLease, pool: str) -> None:
        self.outcomes = outcomes
        self.lease = lease
        self.pool = pool
        self.last_error: dict[int, str] = {}
        self.tried: set[int] = set()
        self.ready_in: dict[int, float] = {}
        # Message id → (provider, the copies it refused while it took the message).
        self.refused_copies: dict[int, tuple[str, tuple[CopyRefused, ...]]] = {}

    def over_chain(self, pending: list[OutgoingEmail]) -> list[OutgoingEmail]:
        """Offer the emails to each provider of the pool in turn; return those none accepted
        or refused for good."""
        for provider_name in provider_chain(self.pool):
            # Nothing the claim no longer holds goes to the next provider (nor costs its tokens).
            pending = [email for email in pending if self.lease.allows(email.message_id)]
            if not pending:
                break
            pending = self.through(provider_name, pending)
        return pending

    def through(self, provider_name: str, pending: list[OutgoingEmail]) -> list[OutgoingEmail]:
        """Send through one provider; return what is left for the next."""
        try:
            results = send_via(
                provider_name, pending, transactional=self.pool == TRANSACTIONAL, guard=self.lease
            )
        except ProviderSkipped as exc:
            logger.warning("provider %s skipped for %d message(s): %s", provider_name, len(pending), exc)
            for email in pending:
                self.skipped(email, provider_name, str(exc), exc.retry_after)
            return pending
        except ProviderUnavailable as exc:
            # Fail over: the whole batch moves to the next provider in the chain.
            logger.warning("provider %s unavailable for %d message(s): %s", provider_name, len(pending), exc)
            self.not_taken(pending, f"{provider_name}: {exc}")
            return pending
        except Exception as exc:  # noqa: BLE001 - a bug must not strand the claimed batch
            # Whatever went wrong, this batch's rows are claimed: record what is known (the
            # outcomes so far, and a retry for the rest) instead of leaving them in `sending`.
            logger.exception("provider %s failed unexpectedly for %d message(s)", provider_name, len(pending))
            self.not_taken(pending, f"{provider_name}: unexpected error: {exc!r}")
            return pending
        return [
            email
            for email, result in zip(pending, results, strict=True)
            if self.classify(provider_name, email, result)
        ]

    def classify(self, provider_name: str, email: OutgoingEmail, result: SendResult) -> bool:
        """Note one provider's result for one email; True when the email goes on to the next."""
        if result.outcome is Outcome.ABANDONED:
            return False  # another worker holds it now: no outcome of ours
        if result.outcome is Outcome.ACCEPTED:
            self.outcomes.sent[provider_name].append((email.message_id, result.provider_message_id))
            if result.refused_copies:
                self.refused_copies[email.message_id] = (provider_name, result.refused_copies)
            return False
        if result.outcome is Outcome.PERMANENT:
            self.outcomes.failed.append((email.message_id, f"{provider_name}: {result.error}"))
            if result.suppress:
                self.outcomes.bounced.append((email.to, result.error))
            return False
        if result.retry_after is not None:
            self.skipped(email, provider_name, result.error, result.retry_after)
        else:
            self.not_taken([email], f"{provider_name}: {result.error}")
        return True

    def skipped(self, email: OutgoingEmail, provider_name: str, error: str, retry_after: float) -> None:
        if email.message_id not in self.tried:  # a real provider's error says more than a skip
            self.last_error[email.message_id] = f"{provider_name}: {error}"
        self.ready_in[email.message_id] = min(self.ready_in.get(email.message_id, retry_after), retry_after)

    def not_taken(self, emails: list[OutgoingEmail], error: str) -> None:
        """A provider was called with these and did not take them (yet)."""
        for email in emails:
            self.last_error[email.message_id] = error
            self.tried.add(email.message_id)

    def settle(self, pending: list[OutgoingEmail], by_id: dict[int, ClaimedMessage]) -> None:
        """What no provider took: deferred when none was ever tried, else retried or failed."""
        pending = [email for email in pending if email.message_id not in self.lease.lost]
        never_tried = [e for e in pending if e.message_id not in self.tried and e.message_id in self.ready_in]
        _plan_deferrals(never_tried, self.ready_in, self.last_error, self.outcomes)
        never_tried_ids = {e.message_id for e in never_tried}
        _plan_retries(
            [by_id[e.message_id] for e in pending if e.message_id not in never_tried_ids],
            self.last_error,
            self.outcomes,
        )


def _record_left_out(
    sendable: list[ClaimedMessage],
    outcomes: Outcomes,
    refused: dict[int, tuple[str, tuple[CopyRefused, ...]]],
) -> None:
    """The copies a sent message went without, as events of that message (what its result says,
    `GET /messages/{id}/events`): `dropped` for one on the suppression list, `bounced` for one
    the provider refused (permanent: suppressed, as a bounced recipient is). Only when there
    are any: a batch without copies runs no statement here."""
    sent = {message_id for rows in outcomes.sent.values() for message_id, _ in rows}
    now = timezone.now()
    events = [
        ProviderEvent(
            provider="emailhub", event_id=f"left-out:{m.id}:{address.lower()}", kind=EmailEvent.Kind.DROPPED,
            occurred_at=now, message_id=m.id, recipient=address, detail="left out: the address is on the suppression list",
        )
        for m in sendable if m.id in sent
        for address in m.suppressed_copies or ()
    ]  # fmt: skip
    for message_id, (provider, copies) in refused.items():
        events += [
            ProviderEvent(
                provider=provider, event_id=f"copy-refused:{message_id}:{copy.address.lower()}",
                kind=EmailEvent.Kind.BOUNCED, occurred_at=now, message_id=message_id, recipient=copy.address,
                bounce=EmailEvent.Bounce.PERMANENT if copy.permanent else EmailEvent.Bounce.TRANSIENT,
                detail=f"copy refused: {copy.error}",
            )
            for copy in copies
        ]  # fmt: skip
    if events:
        record_events(events)


def retry_delay(attempt: int) -> timedelta:
    """Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter")."""
    ceiling = min(
        settings.EMAILHUB_RETRY_MAX_SECONDS,
        settings.EMAILHUB_RETRY_BASE_SECONDS * (2 ** max(attempt - 1, 0)),
    )
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


# A message deferred because no provider could be tried waits until the soonest one could be,
# plus a little jitter (a tenth of the wait, at least half a second, at most 30 s) so a backlog
# deferred together does not arrive together when the circuit's probe is due: one probes, the
# others find the probe taken and wait another second, and no burst hits a provider just back.
_DEFER_MIN_JITTER = 0.5
_DEFER_MAX_JITTER = 30.0


def _plan_deferrals(
    emails: list[OutgoingEmail], ready_in: dict[int, float], errors: dict[int, str], outcomes: Outcomes
) -> None:
    """Every provider skipped these (circuit open, paused, no quota): nothing was tried, so they
    wait in retry_wait for the earliest moment one could be tried, and keep their attempt."""
    now = timezone.now()
    for email in emails:
        wait = ready_in[email.message_id]
        jitter = random.uniform(0, min(max(wait * 0.1, _DEFER_MIN_JITTER), _DEFER_MAX_JITTER))
        due = now + timedelta(seconds=wait + jitter)
        outcomes.deferred.append(
            (email.message_id, due, errors.get(email.message_id, "no provider could be tried"))
        )


def _plan_retries(messages: list[ClaimedMessage], errors: dict[int, str], outcomes: Outcomes) -> None:
    """Transient failure on every provider: wait in retry_wait, or fail after the last attempt."""
    now = timezone.now()
    for m in messages:
        error = errors.get(m.id, "no provider accepted the message")
        if m.attempts >= settings.EMAILHUB_MAX_ATTEMPTS:
            outcomes.failed.append((m.id, f"gave up after {m.attempts} attempts; last error: {error}"))
        else:
            outcomes.retry.append((m.id, now + retry_delay(m.attempts), error))
