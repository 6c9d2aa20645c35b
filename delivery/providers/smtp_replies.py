"""What an SMTP server's reply means for the message in flight (RFC 5321 §4.2.1, §4.3.2), each
rule written once for delivery/providers/smtp.py's exchange, pipelined or not: a refusal at
MAIL FROM is the provider's (our account or sender), a refusal at RCPT TO the recipient's, a 5xx
after DATA the message's (not suppressed), and a reply that names a rate is throttling.
"""

from __future__ import annotations

import re
import smtplib
from typing import Any

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers.base import Outcome, SendResult

PROVIDER = "smtp"

# A temporary refusal that says we are sending too fast ("451 4.7.0 Too many messages, slow
# down", SES's SMTP "454 Throttling failure: Maximum sending rate exceeded", or a 421 — the
# server closing the channel — that tells us to "try again later"). That is the relay rate
# limiting the account, not a recipient's problem and not the relay being down: the provider
# is paused. A bare "451 4.3.0 try again later" names no rate and may concern one mailbox, so
# it stays a transient failure of that recipient.
_RATE_TEXT = re.compile(r"\brate\b|too many|throttl|slow down|exceeded", re.IGNORECASE)
_LATER_TEXT = re.compile(r"try (again )?later", re.IGNORECASE)
# The reply each command of the envelope needs for its transaction to go on (RFC 5321 §4.3.2):
# MAIL FROM 250, RCPT TO 250 (or 251, forwarded), DATA 354 (send the content); and the stage a
# refusal of each is reported at.
ENVELOPE = (("sender", (250,)), ("recipient", (250, 251)), ("data", (354,)))
Reply = tuple[int, bytes]  # a reply's code and text


def _core(replies: list[Reply], copies: int) -> list[Reply]:
    """The replies that decide the transaction: MAIL FROM, the recipient's RCPT TO and DATA,
    without those to the `copies` RCPT TOs (cc, bcc) that follow the recipient's."""
    return replies[:2] + replies[2 + copies :]


def refused_copies(replies: list[Reply], copies: int) -> list[tuple[int, Reply]]:
    """(position among the copies, reply) of each copy's RCPT TO that was refused."""
    expected = ENVELOPE[1][1]
    return [(index, reply) for index, reply in enumerate(replies[2 : 2 + copies]) if reply[0] not in expected]


def judge_envelope(replies: list[Reply], copies: int = 0) -> SendResult | None:
    """The outcome decided by the first reply to MAIL FROM, RCPT TO or DATA (in that order)
    that refused the transaction, or None when each got the reply its transaction needs. A
    refused copy (cc, bcc) does not refuse it: the message goes to the others."""
    for (code, reply), (stage, expected) in zip(_core(replies, copies), ENVELOPE, strict=False):
        if code in expected:
            continue
        if stage == "data":
            return judge_data(code, reply)
        error = smtplib.SMTPResponseException(code, reply)
        raise_if_throttled(error)
        if stage == "sender" and code >= 500:
            # Refused at MAIL FROM (530 auth required, 553 sender not allowed): our
            # account or sender is wrong for every message. Not the recipients' fault.
            raise ProviderUnavailable(
                f"SMTP {code} at MAIL FROM: {decode(reply)} "
                "(check SMTP_USERNAME/SMTP_PASSWORD and EMAILHUB_DEFAULT_FROM)",
                **fields(error),
            )
        return result_for_code(code, reply, f"refused at {stage}")
    return None


def judge_end(message_id: str, code: int, reply: bytes) -> SendResult:
    if code == 250:
        return SendResult.accepted(message_id)
    return judge_data(code, reply)


def judge_data(code: int, reply: bytes) -> SendResult:
    raise_if_throttled(smtplib.SMTPResponseException(code, reply))
    result = result_for_code(code, reply, "refused at data")
    if result.outcome is Outcome.PERMANENT:
        # 5xx after DATA (content rejected, too large): the message is at fault, the
        # address may be fine, so it is not suppressed.
        return SendResult(Outcome.PERMANENT, error=result.error, suppress=False)
    return result


def refused(envelope: list[Reply], copies: int = 0) -> bool:
    """Whether one of these replies to MAIL FROM, RCPT TO and DATA (in order) refused them (a
    refused copy does not)."""
    core = _core(envelope, copies)
    return any(code not in expected for (code, _), (_, expected) in zip(core, ENVELOPE, strict=False))


def raise_if_throttled(exc: smtplib.SMTPResponseException) -> None:
    reply = decode(exc.smtp_error)
    code = exc.smtp_code
    if (code in (421, 451, 454) and _RATE_TEXT.search(reply)) or (code == 421 and _LATER_TEXT.search(reply)):
        raise ProviderThrottled(f"SMTP {exc.smtp_code}: {reply}", **fields(exc)) from exc


def fields(exc: smtplib.SMTPResponseException) -> dict[str, Any]:
    """The ProviderError fields of an SMTP reply: its code as the status, its text as the body."""
    return {"provider": PROVIDER, "status": exc.smtp_code, "body": decode(exc.smtp_error)}


def decode(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def result_for_code(code: int, reply: bytes | str, what: str) -> SendResult:
    error = f"SMTP {code} {what}: {decode(reply)}"
    if 500 <= code < 600:
        return SendResult.permanent(error)
    return SendResult.transient(error)
