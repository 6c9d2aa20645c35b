"""SMTP: one persistent connection per worker process, many messages per connection.

Reply codes (RFC 5321 §4.2.1): 4yz is transient, 5yz permanent. A dropped connection is
reopened once for the message that found it dropped; a second failure marks the provider
unavailable for the rest of the batch.
"""

from __future__ import annotations

import logging
import re
import smtplib
import socket
from typing import Any

from django.conf import settings

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers.base import Outcome, OutgoingEmail, Provider, SendResult
from delivery.providers.dkim import DkimSigner
from delivery.providers.mime import ascii_address, bare_address, render

logger = logging.getLogger(__name__)

_CONNECTION_ERRORS = (smtplib.SMTPServerDisconnected, ConnectionError, socket.timeout, OSError)
# A temporary refusal that says we are sending too fast ("451 4.7.0 Too many messages, slow
# down", SES's SMTP "454 Throttling failure: Maximum sending rate exceeded", or a 421 — the
# server closing the channel — that tells us to "try again later"). That is the relay rate
# limiting the account, not a recipient's problem and not the relay being down: the provider
# is paused. A bare "451 4.3.0 try again later" names no rate and may concern one mailbox, so
# it stays a transient failure of that recipient.
_RATE_TEXT = re.compile(r"\brate\b|too many|throttl|slow down|exceeded", re.IGNORECASE)
_LATER_TEXT = re.compile(r"try (again )?later", re.IGNORECASE)


class SMTPProvider(Provider):
    name = "smtp"

    def __init__(
        self,
        *,
        host: str,
        port: int,
        username: str = "",
        password: str = "",
        starttls: bool = False,
        timeout: float = 10.0,
        message_id_domain: str = "emailhub.local",
        dkim: DkimSigner | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.starttls = starttls
        self.timeout = timeout
        self.message_id_domain = message_id_domain
        # Loaded once per process with the provider; a domain without a key is sent unsigned.
        self.dkim = dkim or DkimSigner()
        self._connection: smtplib.SMTP | None = None

    @classmethod
    def from_settings(cls) -> SMTPProvider:
        return cls(
            host=settings.SMTP_HOST,
            port=settings.SMTP_PORT,
            username=settings.SMTP_USERNAME,
            password=settings.SMTP_PASSWORD,
            starttls=settings.SMTP_STARTTLS,
            timeout=settings.SMTP_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
            dkim=DkimSigner.from_setting(settings.EMAILHUB_DKIM_KEYS),
        )

    def _connect(self) -> smtplib.SMTP:
        if self._connection is None:
            try:
                connection = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
                if self.starttls:
                    connection.starttls()
                if self.username:
                    connection.login(self.username, self.password)
            except smtplib.SMTPAuthenticationError as exc:
                raise ProviderUnavailable(
                    f"SMTP login refused by {self.host}:{self.port}: {exc}", **_fields(exc)
                ) from exc
            except smtplib.SMTPResponseException as exc:
                # A greeting of "421 too many connections, try later" is a rate limit too.
                _raise_if_throttled(exc)
                raise ProviderUnavailable(
                    f"cannot connect to SMTP {self.host}:{self.port}: {exc}", **_fields(exc)
                ) from exc
            except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
                raise ProviderUnavailable(
                    f"cannot connect to SMTP {self.host}:{self.port}: {exc}", provider=self.name
                ) from exc
            self._connection = connection
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.quit()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
                self._connection.close()
            self._connection = None

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            finally:
                self._connection = None

    def send_one(self, email: OutgoingEmail) -> SendResult:
        message_id, data = render(email, message_id_domain=self.message_id_domain)
        sender = ascii_address(bare_address(email.from_email))
        # Signed once, after rendering: a reconnect below resends the same signed bytes.
        data = self.dkim.sign(data, from_domain=sender.rpartition("@")[2])
        for attempt in (1, 2):
            connection = self._connect()
            stage = "recipient"
            try:
                try:
                    refused = connection.sendmail(sender, [ascii_address(email.to)], data)
                except smtplib.SMTPRecipientsRefused as exc:
                    code, reply = next(iter(exc.recipients.values()))
                    raise smtplib.SMTPResponseException(code, reply) from exc
                except smtplib.SMTPSenderRefused:
                    stage = "sender"
                    raise
                except smtplib.SMTPDataError:
                    stage = "data"
                    raise
            except smtplib.SMTPResponseException as exc:
                if exc.smtp_code in (421, -1):
                    # 421: the server is closing the channel (RFC 5321 §3.8), whatever command
                    # it answered. That is the server going away, not a bad recipient.
                    self._drop()
                    _raise_if_throttled(exc)  # ... unless it says we are going too fast
                    if attempt == 1:
                        continue
                    raise ProviderUnavailable(
                        f"SMTP {exc.smtp_code}: {_decode(exc.smtp_error)}", **_fields(exc)
                    ) from exc
                _raise_if_throttled(exc)
                if stage == "sender" and exc.smtp_code >= 500:
                    # Refused at MAIL FROM (530 auth required, 553 sender not allowed): our
                    # account or sender is wrong for every message. Not the recipients' fault.
                    raise ProviderUnavailable(
                        f"SMTP {exc.smtp_code} at MAIL FROM: {_decode(exc.smtp_error)} "
                        "(check SMTP_USERNAME/SMTP_PASSWORD and EMAILHUB_DEFAULT_FROM)",
                        **_fields(exc),
                    ) from exc
                result = _result_for_code(exc.smtp_code, exc.smtp_error, f"refused at {stage}")
                if stage == "data" and result.outcome is Outcome.PERMANENT:
                    # 5xx after DATA (content rejected, too large): the message is at fault,
                    # the address may be fine, so it is not suppressed.
                    return SendResult(Outcome.PERMANENT, error=result.error, suppress=False)
                return result
            except _CONNECTION_ERRORS as exc:
                self._drop()
                if attempt == 1:
                    continue  # the persistent connection went stale: reconnect once
                raise ProviderUnavailable(f"SMTP connection lost: {exc}", provider=self.name) from exc
            if refused:
                code, reply = next(iter(refused.values()))
                return _result_for_code(code, reply, "recipient refused")
            return SendResult.accepted(message_id.strip("<>"))
        raise AssertionError("unreachable")  # pragma: no cover


def _raise_if_throttled(exc: smtplib.SMTPResponseException) -> None:
    reply = _decode(exc.smtp_error)
    code = exc.smtp_code
    if (code in (421, 451, 454) and _RATE_TEXT.search(reply)) or (code == 421 and _LATER_TEXT.search(reply)):
        raise ProviderThrottled(f"SMTP {exc.smtp_code}: {reply}", **_fields(exc)) from exc


def _fields(exc: smtplib.SMTPResponseException) -> dict[str, Any]:
    """The ProviderError fields of an SMTP reply: its code as the status, its text as the body."""
    return {"provider": SMTPProvider.name, "status": exc.smtp_code, "body": _decode(exc.smtp_error)}


def _decode(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def _result_for_code(code: int, reply: bytes | str, what: str) -> SendResult:
    error = f"SMTP {code} {what}: {_decode(reply)}"
    if 500 <= code < 600:
        return SendResult.permanent(error)
    return SendResult.transient(error)
