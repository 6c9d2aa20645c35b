"""Sending a batch of messages: claim, render, deliver through the provider chain, record.

Every step is set-based: one UPDATE … RETURNING claims the whole batch (rows another worker
already claimed or finished are simply not returned, which is what makes a redelivered task
harmless), one query checks suppressions, and one UPDATE per outcome records the results.
The claim is held under a lease (delivery/services/lease.py): the providers ask it before every
message they hand over, and what it no longer allows is abandoned, neither sent nor recorded.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from campaigns.models import Campaign, Contact, Priority, Template
from campaigns.services import compile_template, contact_context
from campaigns.unsubscribe import (
    URL_VARIABLE,
    list_unsubscribe_headers,
    unsubscribe_url,
    wants_unsubscribe,
    with_footer,
)
from core.templating import EmailTemplate, TemplateSyntaxError
from delivery.exceptions import ProviderUnavailable
from delivery.providers import Outcome, OutgoingEmail
from delivery.services.gateway import BULK, TRANSACTIONAL, ProviderSkipped, send_via
from delivery.services.lease import CLOCK, ClaimLease
from delivery.services.recording import record
from delivery.services.transitions import ClaimedMessage, Outcomes, claim
from delivery.tracking.links import CONTEXT_CLICKS, CONTEXT_OPENS, TrackedHtml

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


def send_messages(message_ids: Sequence[int], *, clock: Callable[[], float] = CLOCK) -> BatchReport:
    """Send the given messages that are still `queued` (and whose campaign, if any, is sending).

    `clock` is the lease's (delivery.services.lease.CLOCK; tests pass their own)."""
    report = BatchReport()
    asked_at = clock()  # before the claim is sent: the lease is never overestimated
    claimed = claim(message_ids)
    report.claimed = len(claimed)
    if not claimed:
        return report
    lease = ClaimLease(
        claimed, asked_at=asked_at, lease_seconds=settings.EMAILHUB_SENDING_LEASE_SECONDS, clock=clock
    )
    outcomes = Outcomes()
    outcomes.suppressed = [(m.id, "address is on the suppression list") for m in claimed if m.suppressed]
    claimed = [m for m in claimed if not m.suppressed]
    by_id = {m.id: m for m in claimed}
    # A batch never mixes pools: fan-out and the sweeps group ids by priority.
    pool = pool_for(claimed[0].priority) if claimed else BULK
    pending, unbuildable = _render(claimed)
    outcomes.failed += unbuildable
    last_error: dict[int, str] = {}
    # Messages some provider really tried (it was called with them). The others were only ever
    # skipped (open circuit, paused, no quota) and wait for the soonest of these moments
    # without spending an attempt.
    tried: set[int] = set()
    ready_in: dict[int, float] = {}

    def skipped(email: OutgoingEmail, provider_name: str, error: str, retry_after: float) -> None:
        if email.message_id not in tried:  # a real provider's error says more than a skip
            last_error[email.message_id] = f"{provider_name}: {error}"
        ready_in[email.message_id] = min(ready_in.get(email.message_id, retry_after), retry_after)

    for provider_name in provider_chain(pool):
        # Nothing the claim no longer holds goes to the next provider (nor costs its tokens).
        pending = [email for email in pending if lease.allows(email.message_id)]
        if not pending:
            break
        try:
            results = send_via(provider_name, pending, transactional=pool == TRANSACTIONAL, guard=lease)
        except ProviderSkipped as exc:
            logger.warning("provider %s skipped for %d message(s): %s", provider_name, len(pending), exc)
            for email in pending:
                skipped(email, provider_name, str(exc), exc.retry_after)
            continue
        except ProviderUnavailable as exc:
            # Fail over: the whole batch moves to the next provider in the chain.
            logger.warning("provider %s unavailable for %d message(s): %s", provider_name, len(pending), exc)
            for email in pending:
                last_error[email.message_id] = f"{provider_name}: {exc}"
                tried.add(email.message_id)
            continue
        except Exception as exc:  # noqa: BLE001 - a bug must not strand the claimed batch
            # Whatever went wrong, this batch's rows are claimed: record what is known (the
            # outcomes so far, and a retry for the rest) instead of leaving them in `sending`.
            logger.exception("provider %s failed unexpectedly for %d message(s)", provider_name, len(pending))
            for email in pending:
                last_error[email.message_id] = f"{provider_name}: unexpected error: {exc!r}"
                tried.add(email.message_id)
            continue
        still_pending: list[OutgoingEmail] = []
        for email, result in zip(pending, results, strict=True):
            if result.outcome is Outcome.ABANDONED:
                continue  # another worker holds it now: no outcome of ours
            if result.outcome is Outcome.ACCEPTED:
                outcomes.sent[provider_name].append((email.message_id, result.provider_message_id))
            elif result.outcome is Outcome.PERMANENT:
                outcomes.failed.append((email.message_id, f"{provider_name}: {result.error}"))
                if result.suppress:
                    outcomes.bounced.append((email.to, result.error))
            else:
                if result.retry_after is not None:
                    skipped(email, provider_name, result.error, result.retry_after)
                else:
                    last_error[email.message_id] = f"{provider_name}: {result.error}"
                    tried.add(email.message_id)
                still_pending.append(email)
        pending = still_pending

    pending = [email for email in pending if email.message_id not in lease.lost]
    never_tried = [e for e in pending if e.message_id not in tried and e.message_id in ready_in]
    _plan_deferrals(never_tried, ready_in, last_error, outcomes)
    never_tried_ids = {e.message_id for e in never_tried}
    _plan_retries(
        [by_id[e.message_id] for e in pending if e.message_id not in never_tried_ids], last_error, outcomes
    )
    if lease.token is not None:
        record(outcomes, lease.token)
    report.abandoned = len(lease.lost)
    report.sent = sum(len(sent) for sent in outcomes.sent.values())
    report.failed = len(outcomes.failed)
    report.suppressed = len(outcomes.suppressed)
    report.retrying = len(outcomes.retry) + len(outcomes.deferred)
    return report


def _render(messages: Iterable[ClaimedMessage]) -> tuple[list[OutgoingEmail], list[tuple[int, str]]]:
    """The emails to send, and (id, error) for messages that cannot be built (a template that no
    longer compiles, say): those fail for good without suppressing anyone, instead of failing
    the whole batch over and over."""
    messages = list(messages)
    template_ids = {m.template_id for m in messages if m.template_id}
    # Compiled once per batch: a campaign's messages get its template with an unsubscribe footer
    # where it has no {{ unsubscribe_url }}; transactional ones get the template as written.
    compiled: dict[tuple[int, bool], EmailTemplate | str] = {}
    needed = {(m.template_id, m.campaign_id is not None) for m in messages if m.template_id}
    for template in Template.objects.filter(pk__in=template_ids) if template_ids else []:
        for footer in (f for t, f in needed if t == template.pk):
            try:
                compiled[(template.pk, footer)] = (
                    with_footer(template.subject, template.html, template.text, template.defaults)
                    if footer
                    else compile_template(template)
                )
            except TemplateSyntaxError as exc:
                compiled[(template.pk, footer)] = f"template {template.name!r} does not compile: {exc}"
    contact_ids = {m.contact_id for m in messages if m.contact_id}
    contacts = Contact.objects.in_bulk(contact_ids) if contact_ids else {}
    campaign_ids = {m.campaign_id for m in messages if m.campaign_id}
    campaign_rows = (
        Campaign.objects.filter(pk__in=campaign_ids).values_list(
            "pk", "from_email", "track_opens", "track_clicks"
        )
        if campaign_ids
        else []
    )
    campaign_from = {pk: sender for pk, sender, _, _ in campaign_rows if sender}
    campaign_tracking = {pk: (opens, clicks) for pk, _, opens, clicks in campaign_rows}
    # Tracked HTML, split into chunks and link slots once per batch and template (link rewriting
    # costs a parse here, never per recipient).
    tracked: dict[tuple[int, bool], TrackedHtml] = {}
    default_from = settings.EMAILHUB_DEFAULT_FROM
    issued_at = int(time.time())  # one issue time for the batch's unsubscribe tokens
    emails: list[OutgoingEmail] = []
    unbuildable: list[tuple[int, str]] = []
    for m in messages:
        headers: dict[str, str] = {}
        link = None
        if wants_unsubscribe(m.campaign_id, m.context):
            link = unsubscribe_url(m.id, issued_at)
            headers = list_unsubscribe_headers(link)
        if m.template_id:
            key = (m.template_id, m.campaign_id is not None)
            compiled_template = compiled.get(key, "the message's template was deleted")
            if isinstance(compiled_template, str):
                unbuildable.append((m.id, f"message cannot be built: {compiled_template}"))
                continue
            context = contact_context(contacts.get(m.contact_id) if m.contact_id else None, m.context)
            context.setdefault("email", m.to_email)
            if link is not None:
                context[URL_VARIABLE] = link  # ours, whatever the request context said
            opens, clicks = _tracking(m, campaign_tracking)
            if opens or clicks:
                if key not in tracked:
                    tracked[key] = TrackedHtml.from_compiled(compiled_template.html)
                # The subject and text as EmailTemplate.render makes them; the HTML from the slots.
                subject = (
                    compiled_template.subject.render(context).replace("\r", " ").replace("\n", " ").strip()
                )
                text = compiled_template.text.render(context)
                html = tracked[key].render(context, m.id, opens=opens, clicks=clicks)
                if not compiled_template.html.source:
                    html = ""  # an empty part stays empty (no lone pixel)
            else:
                rendered = compiled_template.render(context)
                subject, html, text = rendered.subject, rendered.html, rendered.text
        else:
            subject, html, text = m.subject or "", m.html or "", m.text or ""
            opens, clicks = _tracking(m, campaign_tracking)
            if html and (opens or clicks):
                # A transactional message's own HTML: one message, one parse.
                html = TrackedHtml(html, template=False).render({}, m.id, opens=opens, clicks=clicks)
        emails.append(
            OutgoingEmail(
                message_id=m.id,
                to=m.to_email,
                from_email=m.from_email
                or (m.campaign_id and campaign_from.get(m.campaign_id))
                or default_from,
                subject=subject,
                text=text,
                html=html,
                reply_to=m.reply_to,
                headers=headers,
            )
        )
    return emails, unbuildable


def _tracking(m: ClaimedMessage, campaigns: dict[int, tuple[bool, bool]]) -> tuple[bool, bool]:
    """(track opens, track clicks): the campaign's opt-ins, or a transactional message's flags."""
    if m.campaign_id is not None:
        return campaigns.get(m.campaign_id, (False, False))
    context = m.context if isinstance(m.context, dict) else {}
    return context.get(CONTEXT_OPENS) is True, context.get(CONTEXT_CLICKS) is True


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
