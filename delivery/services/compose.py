"""Composing a claimed batch's outgoing emails: what each message says, and to whom.

Everything a batch's emails are built from is loaded once per batch, never per recipient: its
templates (compiled once each, with an unsubscribe footer for campaign messages), its contacts,
its campaigns' sender and tracking opt-ins, and the tracked HTML of each template (links and
pixel cut into slots once), and its attachments' contents (one SELECT, each distinct content
once however many messages attach it). Per message only the merge context is made and rendered,
the unsubscribe link and its List-Unsubscribe headers added, and the tracking tokens signed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings

from campaigns.models import Campaign, Contact, Template
from campaigns.services import compile_template, contact_context
from campaigns.unsubscribe import (
    URL_VARIABLE,
    list_unsubscribe_headers,
    unsubscribe_url,
    wants_unsubscribe,
    with_footer,
)
from core.templating import EmailTemplate, TemplateSyntaxError
from delivery.providers import Attachment, OutgoingEmail
from delivery.services.attachments import load_contents
from delivery.services.transitions import ClaimedMessage
from delivery.tracking.links import TrackedHtml

# A template compiled for a batch, by (template id, with the unsubscribe footer), or why not.
_TemplateKey = tuple[int, bool]
_Compiled = EmailTemplate | str
# An email's subject, HTML and text.
_Parts = tuple[str, str, str]


@dataclass
class _Batch:
    """What a batch's emails are built from, each loaded once for the whole batch."""

    templates: dict[_TemplateKey, _Compiled]
    contacts: dict[int, Contact]
    senders: dict[int, str]  # campaign id → its from address, where it has one
    tracking: dict[int, tuple[bool, bool]]  # campaign id → (track opens, track clicks)
    issued_at: int  # one issue time for the batch's unsubscribe tokens
    default_from: str
    contents: Mapping[str, bytes]  # attachment contents by SHA-256, each distinct one once
    # Tracked HTML, split into chunks and link slots once per batch and template (link
    # rewriting costs a parse here, never per recipient).
    tracked: dict[_TemplateKey, TrackedHtml] = field(default_factory=dict)


def compose(messages: Iterable[ClaimedMessage]) -> tuple[list[OutgoingEmail], list[tuple[int, str]]]:
    """The emails to send, and (id, error) for messages that cannot be built (a template that no
    longer compiles, say): those fail for good without suppressing anyone, instead of failing
    the whole batch over and over."""
    messages = list(messages)
    batch = _load(messages)
    emails: list[OutgoingEmail] = []
    unbuildable: list[tuple[int, str]] = []
    for m in messages:
        email = _compose_one(m, batch)
        if isinstance(email, str):
            unbuildable.append((m.id, f"message cannot be built: {email}"))
        else:
            emails.append(email)
    return emails, unbuildable


def _load(messages: Sequence[ClaimedMessage]) -> _Batch:
    contact_ids = {m.contact_id for m in messages if m.contact_id}
    campaign_ids = {m.campaign_id for m in messages if m.campaign_id}
    campaign_rows = (
        Campaign.objects.filter(pk__in=campaign_ids).values_list(
            "pk", "from_email", "track_opens", "track_clicks"
        )
        if campaign_ids
        else []
    )
    return _Batch(
        templates=_compile_templates(messages),
        contacts=Contact.objects.in_bulk(contact_ids) if contact_ids else {},
        senders={pk: sender for pk, sender, _, _ in campaign_rows if sender},
        tracking={pk: (opens, clicks) for pk, _, opens, clicks in campaign_rows},
        issued_at=int(time.time()),
        default_from=settings.EMAILHUB_DEFAULT_FROM,
        contents=load_contents(a["sha256"] for m in messages for a in m.attachments or ()),
    )


def _compile_templates(messages: Sequence[ClaimedMessage]) -> dict[_TemplateKey, _Compiled]:
    """Compiled once per batch: a campaign's messages get its template with an unsubscribe footer
    where it has no {{ unsubscribe_url }}; transactional ones get the template as written."""
    needed = {(m.template_id, m.campaign_id is not None) for m in messages if m.template_id}
    compiled: dict[_TemplateKey, _Compiled] = {}
    if not needed:
        return compiled
    for template in Template.objects.filter(pk__in={template_id for template_id, _ in needed}):
        for footer in (f for t, f in needed if t == template.pk):
            compiled[(template.pk, footer)] = _compile(template, footer=footer)
    return compiled


def _compile(template: Template, *, footer: bool) -> _Compiled:
    try:
        if footer:
            return with_footer(template.subject, template.html, template.text, template.defaults)
        return compile_template(template)
    except TemplateSyntaxError as exc:
        return f"template {template.name!r} does not compile: {exc}"


def _compose_one(m: ClaimedMessage, batch: _Batch) -> OutgoingEmail | str:
    """One message's email, or why it cannot be built."""
    headers: dict[str, str] = dict(m.headers or {})  # the application's own (delivery.headers)
    link = None
    if wants_unsubscribe(m.campaign_id, m.list_unsubscribe):
        link = unsubscribe_url(m.id, batch.issued_at)
        headers.update(list_unsubscribe_headers(link))
    opens, clicks = _tracking(m, batch.tracking)
    if m.template_id:
        parts = _from_template(m, batch, link, opens=opens, clicks=clicks)
        if isinstance(parts, str):
            return parts
    else:
        parts = _inline(m, opens=opens, clicks=clicks)
    subject, html, text = parts
    left_out = {address.lower() for address in m.suppressed_copies or ()}
    attachments = _attachments(m, batch.contents)
    if isinstance(attachments, str):
        return attachments
    return OutgoingEmail(
        message_id=m.id,
        to=m.to_email,
        # The copies not on the suppression list (the send path records those left out).
        cc=tuple(a for a in m.cc or () if a.lower() not in left_out),
        bcc=tuple(a for a in m.bcc or () if a.lower() not in left_out),
        from_email=m.from_email or (m.campaign_id and batch.senders.get(m.campaign_id)) or batch.default_from,
        subject=subject,
        text=text,
        html=html,
        reply_to=m.reply_to,
        headers=headers,
        attachments=attachments,
    )


def _attachments(m: ClaimedMessage, contents: Mapping[str, bytes]) -> tuple[Attachment, ...] | str:
    """A message's attachments with their contents, or why they cannot be had (a content that
    is not stored: the message fails rather than going out without a file it promised)."""
    attached = []
    for described in m.attachments or ():
        content = contents.get(described["sha256"])
        if content is None:
            return f"the content of attachment {described['filename']!r} is not stored"
        attached.append(
            Attachment(
                filename=described["filename"],
                content_type=described["content_type"],
                content=content,
                sha256=described["sha256"],
                content_id=described.get("content_id"),
            )
        )
    return tuple(attached)


def _from_template(
    m: ClaimedMessage, batch: _Batch, link: str | None, *, opens: bool, clicks: bool
) -> _Parts | str:
    """A template message rendered with its contact's variables and its own context."""
    key = (m.template_id or 0, m.campaign_id is not None)
    template = batch.templates.get(key, "the message's template was deleted")
    if isinstance(template, str):
        return template
    context = contact_context(batch.contacts.get(m.contact_id) if m.contact_id else None, m.context)
    context.setdefault("email", m.to_email)
    if link is not None:
        context[URL_VARIABLE] = link  # ours, whatever the request context said
    if not (opens or clicks):
        rendered = template.render(context)
        return rendered.subject, rendered.html, rendered.text
    if key not in batch.tracked:
        batch.tracked[key] = TrackedHtml.from_compiled(template.html)
    # The subject and text as EmailTemplate.render makes them; the HTML from the slots.
    subject = template.subject.render(context).replace("\r", " ").replace("\n", " ").strip()
    text = template.text.render(context)
    html = batch.tracked[key].render(context, m.id, opens=opens, clicks=clicks)
    if not template.html.source:
        html = ""  # an empty part stays empty (no lone pixel)
    return subject, html, text


def _inline(m: ClaimedMessage, *, opens: bool, clicks: bool) -> _Parts:
    """A transactional message's own subject and bodies."""
    subject, html, text = m.subject or "", m.html or "", m.text or ""
    if html and (opens or clicks):
        # A transactional message's own HTML: one message, one parse.
        html = TrackedHtml(html, template=False).render({}, m.id, opens=opens, clicks=clicks)
    return subject, html, text


def _tracking(m: ClaimedMessage, campaigns: dict[int, tuple[bool, bool]]) -> tuple[bool, bool]:
    """(track opens, track clicks): the campaign's opt-ins, or a transactional message's flags."""
    if m.campaign_id is not None:
        return campaigns.get(m.campaign_id, (False, False))
    return m.track_opens, m.track_clicks
