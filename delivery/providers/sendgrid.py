"""SendGrid through the official `sendgrid` client (v3 `POST /mail/send`).

One request carries up to 1000 personalizations, so a campaign batch is one HTTP call, not one
per recipient. Recipients of identical content share the request's `content`. Recipients with
personalised content still share one request: the content is a placeholder that each
personalization's `substitutions` fills in — SendGrid caps substitutions at 10,000 bytes per
personalization, so a larger body is sent in a request of its own. Each email's own headers go
in its personalization's `headers`, so every recipient of a shared request gets exactly its own;
a header SendGrid does not let us set is refused (UnsupportedFeature), never dropped.
Attachments belong to the request, not to a personalization: only emails with the same files
share a request, and each file travels once per request in its `attachments` array.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from email.utils import parseaddr
from typing import Any
from urllib.error import URLError

import sendgrid
from django.conf import settings
from python_http_client.exceptions import HTTPError

from delivery.exceptions import (
    ProviderConfigurationError,
    ProviderThrottled,
    ProviderUnavailable,
    UnsupportedFeature,
)
from delivery.providers.base import (
    Attachment,
    Guard,
    OutgoingEmail,
    Provider,
    SendResult,
    parse_retry_after,
    url_endpoint,
)
from delivery.providers.mime import message_id_for

MAX_PERSONALIZATIONS = 1000
# https://www.twilio.com/docs/sendgrid/api-reference/mail-send — "The total collective size of
# your substitutions may not exceed 10,000 bytes per personalization object."
MAX_SUBSTITUTION_BYTES = 10_000
TEXT_TAG = "-emailhub-text-"
HTML_TAG = "-emailhub-html-"
_PERSONALIZATION_FIELD = re.compile(r"^personalizations\.(\d+)\.")
# "You may not overwrite the following reserved headers: x-sg-id, x-sg-eid, received,
# dkim-signature, Content-Type, Content-Transfer-Encoding, To, From, Subject, Reply-To, CC, BCC"
# (the mail-send reference above).
RESERVED_HEADERS = frozenset(
    {
        "x-sg-id", "x-sg-eid", "received", "dkim-signature", "content-type",
        "content-transfer-encoding", "to", "from", "subject", "reply-to", "cc", "bcc",
    }
)  # fmt: skip


def _address(value: str) -> dict[str, str]:
    name, email = parseaddr(value)
    return {"email": email or value, **({"name": name} if name else {})}


def _content(text: str, html: str) -> list[dict[str, str]]:
    # SendGrid requires text/plain first, and no empty values.
    parts = []
    if text:
        parts.append({"type": "text/plain", "value": text})
    if html:
        parts.append({"type": "text/html", "value": html})
    return parts or [{"type": "text/plain", "value": " "}]


class SendGridProvider(Provider):
    name = "sendgrid"

    def __init__(
        self, *, api_key: str, host: str, timeout: float = 10.0, message_id_domain: str = "emailhub.local"
    ) -> None:
        self.message_id_domain = message_id_domain
        if not api_key:
            raise ProviderConfigurationError("SENDGRID_API_KEY is empty; set it to use the sendgrid provider")
        self.api = sendgrid.SendGridAPIClient(api_key=api_key, host=host)
        self.endpoint = url_endpoint(host)
        # python_http_client passes this timeout to urllib for every request it builds.
        self.api.client.timeout = timeout

    @classmethod
    def from_settings(cls) -> SendGridProvider:
        return cls(
            api_key=settings.SENDGRID_API_KEY,
            host=settings.SENDGRID_HOST,
            timeout=settings.SENDGRID_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
        )

    def check(self, email: OutgoingEmail) -> None:
        reserved = sorted(name for name in email.headers if name.lower() in RESERVED_HEADERS)
        if reserved:
            raise UnsupportedFeature(
                f"SendGrid does not let us set the header(s) {', '.join(reserved)}",
                provider=self.name,
                feature="headers",
            )

    def split(self, emails: Sequence[OutgoingEmail]) -> list[list[OutgoingEmail]]:
        """Split a batch into requests: ≤1000 recipients each, one sender, reply-to and set of
        attachments each."""
        groups: dict[tuple[str, str | None, tuple[tuple[str, ...], ...]], list[OutgoingEmail]] = {}
        for email in emails:
            files = tuple(
                (a.sha256, a.filename, a.content_type, a.content_id or "") for a in email.attachments
            )
            groups.setdefault((email.from_email, email.reply_to, files), []).append(email)
        requests: list[list[OutgoingEmail]] = []
        for group in groups.values():
            shared = len({(e.text, e.html) for e in group}) == 1
            small = [e for e in group if shared or _substitution_size(e) <= MAX_SUBSTITUTION_BYTES]
            large = [e for e in group if not shared and _substitution_size(e) > MAX_SUBSTITUTION_BYTES]
            for start in range(0, len(small), MAX_PERSONALIZATIONS):
                requests.append(small[start : start + MAX_PERSONALIZATIONS])
            requests.extend([e] for e in large)
        return requests

    def payload(self, group: Sequence[OutgoingEmail]) -> dict[str, Any]:
        first = group[0]
        shared = len({(e.text, e.html) for e in group}) == 1
        personalizations = []
        for email in group:
            personalization: dict[str, Any] = {
                "to": [_address(email.to)],
                # Copies are per personalization: every recipient of a shared request gets
                # exactly its own (SendGrid refuses an address twice in one, which the API
                # refuses first).
                **({"cc": [_address(a) for a in email.cc]} if email.cc else {}),
                **({"bcc": [_address(a) for a in email.bcc]} if email.bcc else {}),
                "subject": email.subject,
                "custom_args": {"emailhub_id": str(email.message_id)},
                # This email's own headers (check() refused the reserved ones), and the same
                # Message-ID as through SMTP and SES, on every attempt (not a SendGrid reserved
                # header, so it is sent as given).
                "headers": {
                    **email.headers,
                    "Message-ID": message_id_for(email.message_id, self.message_id_domain),
                },
            }
            if not shared:
                personalization["substitutions"] = {TEXT_TAG: email.text, HTML_TAG: email.html}
            personalizations.append(personalization)
        if shared:
            content = _content(first.text, first.html)
        else:
            content = _content(
                TEXT_TAG if any(e.text for e in group) else "", HTML_TAG if any(e.html for e in group) else ""
            )
        body: dict[str, Any] = {
            "personalizations": personalizations,
            "from": _address(first.from_email),
            "content": content,
        }
        if first.reply_to:
            body["reply_to"] = _address(first.reply_to)
        if first.attachments:  # the same for every email of the request (split)
            body["attachments"] = [_attachment(a) for a in first.attachments]
        return body

    def send_request(self, group: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        try:
            response = self.api.client.mail.send.post(request_body=self.payload(group))
        except HTTPError as exc:
            return self._classify(exc, group, guard)
        except (URLError, OSError) as exc:  # refused, reset, timed out
            raise ProviderUnavailable(f"SendGrid unreachable: {exc}", provider=self.name) from exc
        message_id = response.headers.get("X-Message-Id")
        return {email.message_id: SendResult.accepted(message_id) for email in group}

    def _classify(self, exc: HTTPError, group: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        status = int(getattr(exc, "status_code", 0) or 0)
        body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body)
        detail = f"SendGrid {status}: {body[:500]}"
        if status in (401, 403):
            raise ProviderUnavailable(
                f"{detail} (check SENDGRID_API_KEY)", provider=self.name, status=status, body=body[:2000]
            ) from exc
        if status == 429:
            # Rate limited, not down: pause for as long as SendGrid asks.
            headers = getattr(exc, "headers", None)
            retry_after = parse_retry_after(headers.get("Retry-After") if headers else None)
            raise ProviderThrottled(
                detail, provider=self.name, status=status, body=body[:2000], retry_after=retry_after
            ) from exc
        if status >= 500:
            raise ProviderUnavailable(detail, provider=self.name, status=status, body=body[:2000]) from exc
        if status == 400:
            bad = _rejected_personalizations(body)
            if bad:
                # The whole request was refused because of these recipients: fail them for good
                # and send the others again without them (those the guard still allows).
                results = {group[i].message_id: SendResult.permanent(detail) for i in bad if i < len(group)}
                rest = []
                for i, email in enumerate(group):
                    if i in bad:
                        continue
                    if guard.allows(email.message_id):
                        rest.append(email)
                    else:
                        results[email.message_id] = SendResult.abandoned()
                if rest:
                    results.update(self.send_request(rest, guard))
                return results
        # A refusal we cannot pin on a recipient: not the recipients' fault, so no suppression.
        return {email.message_id: SendResult.transient(detail) for email in group}


def _attachment(attachment: Attachment) -> dict[str, str]:
    """One entry of the request's `attachments` (the mail-send reference above): an inline one
    is referenced from the HTML by its content_id."""
    entry = {
        "content": base64.b64encode(attachment.content).decode("ascii"),
        "filename": attachment.filename,
        "type": attachment.content_type,
        "disposition": "inline" if attachment.content_id else "attachment",
    }
    if attachment.content_id:
        entry["content_id"] = attachment.content_id
    return entry


def _substitution_size(email: OutgoingEmail) -> int:
    return len(email.text.encode()) + len(email.html.encode()) + len(TEXT_TAG) + len(HTML_TAG)


def _rejected_personalizations(body: str) -> set[int]:
    try:
        errors = json.loads(body).get("errors", [])
    except (ValueError, AttributeError):
        return set()
    indexes = set()
    for error in errors:
        match = _PERSONALIZATION_FIELD.match(str(error.get("field") or ""))
        if match:
            indexes.add(int(match.group(1)))
    return indexes
