"""Which headers an application may add to its message (`headers` in the message API).

Refused, whatever their case: the headers emailhub writes itself (the addresses, the subject, the
date, the Message-ID, the MIME structure, the unsubscribe headers, our own `X-Emailhub-*`), the
ones that record or prove a route (Received, Return-Path, DKIM/ARC signatures and their
verdicts), and the ones a provider reads as instructions rather than passing on (SendGrid's
X-SMTPAPI, SES's X-SES-*). Anything else that is an RFC 5322 field name with a one-line value is
sent unchanged through every provider (mime.render for SMTP and SES, the personalization's
`headers` for SendGrid) and covered by DKIM when it is one of dkim.SIGNED_HEADERS
(In-Reply-To, References, List-Id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# RFC 5322 §2.2: a field name is printable US-ASCII but the colon; 76 keeps `Name: ` and a
# folded value within the 78-character line the RFC recommends.
FIELD_NAME = re.compile(r"^[!-9;-~]{1,76}\Z")
MAX_VALUE_LENGTH = 998  # RFC 5322 §2.1.1: a line's hard limit
MAX_HEADERS = 50

RESERVED = frozenset(
    {
        "from", "sender", "to", "cc", "bcc", "reply-to", "subject", "date", "message-id",
        "mime-version", "received", "return-path", "delivered-to", "dkim-signature",
        "domainkey-signature", "authentication-results", "received-spf", "arc-seal",
        "arc-message-signature", "arc-authentication-results", "list-unsubscribe",
        "list-unsubscribe-post", "x-smtpapi", "x-sg-id", "x-sg-eid",
    }
)  # fmt: skip
RESERVED_PREFIXES = ("content-", "resent-", "x-emailhub-", "x-ses-")


def header_problems(headers: Mapping[str, str]) -> dict[str, str]:
    """Each header name refused, with why (empty when every header may be sent)."""
    problems: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if not FIELD_NAME.match(name):
            problems[name] = "is not a header name: 1 to 76 printable ASCII characters, no colon or space"
        elif lower in RESERVED or lower.startswith(RESERVED_PREFIXES):
            problems[name] = "is set by emailhub or changes routing or authentication; it cannot be given"
        elif lower in seen:
            problems[name] = f"repeats {seen[lower]!r} (header names are case-insensitive)"
        elif not isinstance(value, str) or re.search(r"[\r\n\x00]", value):
            problems[name] = "a value is one line: no CR, LF or NUL"
        elif len(value) > MAX_VALUE_LENGTH:
            problems[name] = f"has {len(value)} characters; at most {MAX_VALUE_LENGTH}"
        seen.setdefault(lower, name)
    return problems
