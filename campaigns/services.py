"""Writes to audiences and templates that other apps may call."""

from __future__ import annotations

from typing import Any

from campaigns.models import Contact, Suppression, Template
from campaigns.templating import EmailTemplate


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


def suppressed_addresses(emails: list[str]) -> set[str]:
    """Which of these addresses are on the suppression list (one query)."""
    if not emails:
        return set()
    lowered = {email.lower() for email in emails}
    return set(Suppression.objects.filter(email__in=lowered).values_list("email", flat=True))


def suppress(email: str, reason: str, detail: str = "") -> bool:
    """Put an address on the suppression list; True when it was not there yet."""
    _, created = Suppression.objects.get_or_create(
        email=email.lower(), defaults={"reason": reason, "detail": detail[:2000]}
    )
    return created
