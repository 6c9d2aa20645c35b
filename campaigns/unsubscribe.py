"""One-click unsubscribe links (RFC 8058 + RFC 2369): tokens, and the headers and footer the send
path adds. Recording an unsubscribe is campaigns/unsubscribing.py's: this module sits below
delivery (its send path builds these links), that one above it (it records through delivery).

**Token.** One per message: the message id fixes the contact and the campaign (a campaign has one
message per contact, `UNIQUE(campaign, contact)`), so the token says (message id, issue time)
and nothing else. It is those 12 bytes sealed by core/signing.py (authenticated encryption in the
SIV shape: an HMAC-SHA256 tag cut to 128 bits, the plaintext XORed with a keystream from the
tag; keys derived from SECRET_KEY and this kind's namespace). The URL therefore reveals neither
the message id nor how many messages we send (two consecutive messages' tokens share nothing),
cannot be guessed (2^128 tags) and cannot be made for another message without SECRET_KEY.
28 bytes, 38 base64url characters. A token is valid for `EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS` (90 by
default, never fewer than 30) after it was issued, at send time. A rotated SECRET_KEY keeps
every link already sent working while the old one is in SECRET_KEY_FALLBACKS (core/signing.py,
"Rotation").

**Scope.** An unsubscribe is global for marketing mail: the address is suppressed with reason
`unsubscribed`, which blocks every campaign message (and transactional messages sent with
`unsubscribe: true`) to it, but not ordinary transactional mail (password resets still go).
There is no per-list opt-out: one click must be honoured without asking which list, and a
recipient who clicks "unsubscribe" means "stop the marketing". The rule lives in
`campaigns.selectors.suppressed_sql`, which the send claim composes.

"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from django.conf import settings

from campaigns.exceptions import ExpiredToken, InvalidToken
from core import signing
from core.templating import EmailTemplate

# The template variable the send path fills with this message's link.
URL_VARIABLE = "unsubscribe_url"

ONE_CLICK = "List-Unsubscribe=One-Click"

_NAMESPACE = "emailhub.unsubscribe"  # core/signing.py derives this kind's keys from it
_PAYLOAD = struct.Struct(">QI")  # message id, issue time (Unix seconds, good until 2106)
TOKEN_LENGTH = 38  # base64url of 16 + 12 bytes, unpadded
_TOKEN_CHARS = re.compile(rf"^[A-Za-z0-9_-]{{{TOKEN_LENGTH}}}$")
# A token issued this far in the future was not issued by a server with a sane clock.
_CLOCK_SKEW_SECONDS = 300


def make_token(message_id: int, issued_at: int | None = None) -> str:
    """The unsubscribe token of message `message_id`, issued at `issued_at` (Unix seconds, now)."""
    issued = int(time.time()) if issued_at is None else issued_at
    plain = _PAYLOAD.pack(message_id, issued)
    return signing.encode(signing.seal(_NAMESPACE, plain, plain))


def read_token(token: str, *, now: float | None = None) -> int:
    """The message id a token was issued for. Raises InvalidToken or ExpiredToken."""
    if not _TOKEN_CHARS.match(token):
        raise InvalidToken("malformed token")
    try:
        raw = signing.decode(token, TOKEN_LENGTH)
        plain, _ = signing.unseal(_NAMESPACE, raw, _PAYLOAD.size, lambda header, _: header)
    except signing.BadToken as exc:
        raise InvalidToken(str(exc)) from None
    message_id, issued = _PAYLOAD.unpack(plain)
    current = time.time() if now is None else now
    if issued > current + _CLOCK_SKEW_SECONDS:
        raise InvalidToken("token issued in the future")
    if current - issued > settings.EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS * 86400:
        raise ExpiredToken("this unsubscribe link has expired")
    return message_id


# --- what the send path adds to a message ----------------------------------------------------


def unsubscribe_url(message_id: int, issued_at: int | None = None) -> str:
    return f"{settings.EMAILHUB_PUBLIC_URL.rstrip('/')}/u/{make_token(message_id, issued_at)}"


def list_unsubscribe_headers(url: str) -> dict[str, str]:
    """RFC 2369 List-Unsubscribe with the one HTTPS URI RFC 8058 §3.1 requires (plus a mailto:
    when EMAILHUB_UNSUBSCRIBE_MAILTO is set), and RFC 8058's List-Unsubscribe-Post. A DKIM
    signature must cover both (RFC 8058 §4), which the signer's header list does."""
    uris = [f"<{url}>"]
    mailbox = settings.EMAILHUB_UNSUBSCRIBE_MAILTO
    if mailbox:
        token = url.rsplit("/", 1)[1]
        uris.append(f"<mailto:{mailbox}?subject={quote('unsubscribe ' + token)}>")
    return {"List-Unsubscribe": ", ".join(uris), "List-Unsubscribe-Post": ONE_CLICK}


def wants_unsubscribe(campaign_id: int | None, list_unsubscribe: bool) -> bool:
    """Every campaign message carries the link; a transactional one when it asked for it
    (`Message.list_unsubscribe`; the same rule in SQL: delivery's `transitions.MARKETING_SQL`)."""
    return campaign_id is not None or list_unsubscribe


HTML_FOOTER = (
    '<p style="font-size:12px;color:#666666">You receive this because you subscribed. '
    f'<a href="{{{{ {URL_VARIABLE} }}}}">Unsubscribe</a></p>'
)
TEXT_FOOTER = f"\n\n--\nUnsubscribe: {{{{ {URL_VARIABLE} }}}}\n"
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)


def with_footer(
    subject: str, html: str, text: str, defaults: Mapping[str, Any] | None = None
) -> EmailTemplate:
    """A campaign template compiled once per batch, with an unsubscribe footer added to each part
    (HTML before `</body>`, text at the end) that does not already use `{{ unsubscribe_url }}`.
    An empty part stays empty (the MIME writer's fallback text says to read the HTML)."""
    compiled = EmailTemplate(subject, html, text, defaults)
    html_uses, text_uses = compiled.html.uses(URL_VARIABLE), compiled.text.uses(URL_VARIABLE)
    if (html_uses or not html) and (text_uses or not text):
        return compiled
    if html and not html_uses:
        ends = list(_BODY_END.finditer(html))
        at = ends[-1].start() if ends else len(html)
        html = html[:at] + HTML_FOOTER + html[at:]
    if text and not text_uses:
        text = text.rstrip("\n") + TEXT_FOOTER
    return EmailTemplate(subject, html, text, defaults)
