"""SMTP: one persistent connection per worker process, many messages per connection.

Reply codes (RFC 5321 §4.2.1): 4yz is transient, 5yz permanent. A dropped connection is
reopened once for the message that found it dropped; a second failure marks the provider
unavailable for the rest of the batch.

PIPELINING (RFC 2920), when the server offers it: smtplib waits for a reply after every command,
four round trips per message (MAIL, RCPT, DATA, the content). Pipelined, one write carries the
previous message's content and final dot, then this message's MAIL FROM, RCPT TO and DATA
(DATA is the last command of a group, §3.1: the content waits for its 354), and the replies are
read back in order: one round trip per message. Each reply is judged as smtplib's would be, so
outcomes, suppression, 421, throttling and reconnecting are the same as one by one
(`_pipeline`). A batch is also spread over up to SMTP_CONNECTIONS connections (one per
MESSAGES_PER_CONNECTION messages), driven in turn so that their round trips overlap
(`_send_pipelined`). Without the extension, messages go one by one through smtplib (`send_one`).

The batch's guard (base.Guard) is asked before each write: before a message's MAIL FROM is
written (or, one by one, before `sendmail`), and again before its content, which is what hands
it over; a message it no longer allows gets ABANDONED, and one whose content it no longer
allows is cut off by closing the connection (`_pipeline`).
"""

from __future__ import annotations

import logging
import re
import smtplib
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers.base import Guard, Outcome, OutgoingEmail, Provider, SendResult, nothing_sent
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
# RFC 5321 §4.5.2: a line of the content that starts with "." gets one more.
_LEADING_DOT = re.compile(rb"(?m)^\.")


@dataclass(slots=True)
class _Prepared:
    """One email rendered, signed and framed for the wire."""

    id: int
    message_id: str
    commands: bytes  # MAIL FROM, RCPT TO, DATA
    content: bytes  # dot-stuffed, ending in CRLF.CRLF


class _Stop:
    """Shared by the lanes of one batch: set when one of them meets a provider-wide refusal."""

    requested = False


class _Lost(Exception):
    """The connection went away (closed, reset, timed out, or a 421) while a message was in flight."""

    def __init__(self, error: str, exc: BaseException) -> None:
        super().__init__(error)
        self.exc = exc


class SMTPProvider(Provider):
    name = "smtp"
    # An extra connection costs a TCP + EHLO set-up and a slot of the relay's connection limit:
    # worth it for a share of at least this many messages.
    MESSAGES_PER_CONNECTION = 20

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
        connections: int = 1,
    ) -> None:
        self.host = host
        self.port = port
        self.endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.username = username
        self.password = password
        self.starttls = starttls
        self.timeout = timeout
        self.message_id_domain = message_id_domain
        # Loaded once per process with the provider; a domain without a key is sent unsigned.
        self.dkim = dkim or DkimSigner()
        self._connection: smtplib.SMTP | None = None
        # Connections a pipelined batch is spread over (SMTP_CONNECTIONS); the extra ones are
        # providers of their own (`_lanes`), opened when a batch first needs them.
        self.connections = max(1, connections)
        self._extra: list[SMTPProvider] = []
        self._needs_reset = False  # the connection's last transaction failed before its content

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
            connections=settings.SMTP_CONNECTIONS,
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

    def split(self, emails: Sequence[OutgoingEmail]) -> list[list[OutgoingEmail]]:
        # One request for the whole batch: pipelined over the one connection (see send_request).
        return [list(emails)] if emails else []

    def send_request(self, request: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        connection = self._connect()
        try:
            connection.ehlo_or_helo_if_needed()
        except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
            self._drop()
            raise ProviderUnavailable(f"SMTP EHLO failed: {exc}", provider=self.name) from exc
        if connection.has_extn("pipelining"):
            return self._send_pipelined(request, guard)
        return self._one_by_one(request, guard)

    def _one_by_one(self, emails: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        """send_one per email, with the base class's rules for a batch that goes wrong part-way."""
        results: dict[int, SendResult] = {}
        for email in emails:
            if not guard.allows(email.message_id):
                results[email.message_id] = SendResult.abandoned()
                continue
            try:
                results[email.message_id] = self.send_one(email)
            except ValueError as exc:  # raised by delivery.providers.mime for what it cannot encode
                results[email.message_id] = SendResult.unbuildable(str(exc))
            except ProviderThrottled as exc:
                exc.partial = dict(results)
                raise
            except ProviderUnavailable as exc:
                if nothing_sent(results):
                    raise
                return self._rest_unavailable(emails, results, exc)
        return results

    def _rest_unavailable(
        self, emails: list[OutgoingEmail], results: dict[int, SendResult], exc: ProviderUnavailable
    ) -> dict[int, SendResult]:
        # Gone part-way: what was accepted stays accepted, the rest is retried.
        error = SendResult.transient(f"{self.name} became unavailable: {exc}")
        for email in emails:
            results.setdefault(email.message_id, error)
        return results

    def _prepare(self, email: OutgoingEmail) -> _Prepared:
        message_id, data = render(email, message_id_domain=self.message_id_domain)
        sender = ascii_address(bare_address(email.from_email))
        recipient = ascii_address(email.to)
        # Signed once, after rendering: a reconnect resends the same signed bytes.
        data = self.dkim.sign(data, from_domain=sender.rpartition("@")[2])
        content = _LEADING_DOT.sub(b"..", data)
        if not content.endswith(b"\r\n"):
            content += b"\r\n"
        commands = f"MAIL FROM:<{sender}>\r\nRCPT TO:<{recipient}>\r\nDATA\r\n".encode("ascii")
        return _Prepared(email.message_id, message_id.strip("<>"), commands, content + b".\r\n")

    def _send_pipelined(self, emails: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        """The batch over up to `connections` connections, pipelined on each, driven in turn: each
        writes its next group before any waits for its replies, so their round trips overlap."""
        results: dict[int, SendResult] = {}
        prepared: list[_Prepared] = []
        for email in emails:
            try:
                prepared.append(self._prepare(email))
            except ValueError as exc:
                results[email.message_id] = SendResult.unbuildable(str(exc))
        lanes = self._lanes(len(prepared))
        stop = _Stop()
        runs = [lane._lane(prepared[i :: len(lanes)], results, stop, guard) for i, lane in enumerate(lanes)]
        failures: list[ProviderThrottled | ProviderUnavailable] = []
        while runs:
            for run in list(runs):
                try:
                    next(run)
                except StopIteration:
                    runs.remove(run)
                except (ProviderThrottled, ProviderUnavailable) as exc:
                    # The provider refuses as a whole: the other lanes start nothing new but
                    # finish what is in flight, so every message the server took is known.
                    runs.remove(run)
                    failures.append(exc)
                    stop.requested = True
        for failure in failures:
            if isinstance(failure, ProviderThrottled):
                failure.partial = dict(results)
                raise failure
        unavailable = [f for f in failures if isinstance(f, ProviderUnavailable)]
        if unavailable:
            if nothing_sent(results):
                raise unavailable[0]
            return self._rest_unavailable(emails, results, unavailable[0])
        return results

    def _lanes(self, messages: int) -> list[SMTPProvider]:
        """This provider's connection and one more per MESSAGES_PER_CONNECTION messages of the
        batch (at most `connections`), each an SMTPProvider of its own kept open for the next
        batch. A transactional batch (1 or 10 messages) keeps its one connection and its order:
        a refusal part-way stops it before the next message is started."""
        wanted = max(1, min(self.connections, messages // self.MESSAGES_PER_CONNECTION))
        while len(self._extra) < wanted - 1:
            self._extra.append(
                SMTPProvider(
                    host=self.host, port=self.port, username=self.username, password=self.password,
                    starttls=self.starttls, timeout=self.timeout, message_id_domain=self.message_id_domain,
                    dkim=self.dkim, connections=1,
                )
            )  # fmt: skip
        return [self, *self._extra[: wanted - 1]]

    def _lane(
        self, pending: list[_Prepared], results: dict[int, SendResult], stop: _Stop, guard: Guard
    ) -> Iterator[None]:
        """This connection's share of a batch; yields after each write (see _pipeline)."""
        reconnected: set[int] = set()
        while True:
            try:
                yield from self._pipeline(pending, results, stop, guard)
                return
            except _Lost as lost:
                # In flight when the connection went: the first message not finished. It gets
                # one new connection; if that goes too, the provider is unavailable.
                self._drop()
                pending = [p for p in pending if p.id not in results]
                if not pending:
                    return
                if pending[0].id in reconnected or stop.requested:
                    raise ProviderUnavailable(lost.args[0], **_lost_fields(lost.exc, self.name)) from lost.exc
                reconnected.add(pending[0].id)
            except (ProviderThrottled, ProviderUnavailable):
                self._drop()  # replies may still be on their way: never reuse a half-read stream
                raise

    def _pipeline(
        self, pending: list[_Prepared], results: dict[int, SendResult], stop: _Stop, guard: Guard
    ) -> Iterator[None]:
        """Send `pending` pipelined over this lane's connection, recording each outcome in
        `results` as its last reply arrives; yields after each write, before reading its
        replies. Raises _Lost when the connection goes."""
        connection = self._connect()
        try:
            connection.ehlo_or_helo_if_needed()  # a new connection after a reconnect
        except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
            raise _Lost(f"SMTP connection lost: {exc}", exc) from exc
        previous: _Prepared | None = None  # its DATA got 354: its content goes first in the next write
        previous_failure: SendResult | None = None  # refused before its content was even sent
        queue = iter(pending)
        while True:
            current = None if stop.requested else _next_held(queue, results, guard)
            if previous is not None and not guard.allows(previous.id):
                # Lost between its DATA and its content (the worker stalled waiting for the 354,
                # say): the content would hand over a message this worker no longer holds. The
                # transaction is left unfinished instead: a server takes a message at its final
                # dot (RFC 5321 §4.1.1.4), so closing the connection before it drops the message;
                # whatever is still held goes over a new connection.
                results[previous.id] = SendResult.abandoned()
                self._drop()
                if not stop.requested:
                    unsent = [] if current is None else [current]
                    rest = _held([*unsent, *queue], results, guard)
                    if rest:
                        yield from self._pipeline(rest, results, stop, guard)
                return
            if previous is None and current is None:
                return
            out = [previous.content] if previous is not None else []
            # The last transaction failed before its content (refused MAIL, RCPT or DATA):
            # RSET first, or a server still holding its MAIL would refuse the next one.
            reset = self._needs_reset and current is not None
            if reset:
                out.append(b"RSET\r\n")
            if current is not None:
                out.append(current.commands)
            try:
                connection.send(b"".join(out))
                yield
                if previous is not None:
                    code, reply = self._reply(connection)
                    results[previous.id] = previous_failure or self._judge_end(previous, code, reply)
                    previous, previous_failure = None, None
                if reset:
                    code, reply = self._reply(connection)
                    if code != 250:
                        raise _Lost(
                            f"SMTP {code} to RSET: {_decode(reply)}",
                            smtplib.SMTPResponseException(code, reply),
                        )
                    self._needs_reset = False
                if current is None:
                    return
                replies = [self._reply(connection) for _ in range(3)]  # MAIL, RCPT, DATA
            except _CONNECTION_ERRORS as exc:
                raise _Lost(f"SMTP connection lost: {exc}", exc) from exc
            failure = self._judge_envelope(replies)
            if replies[2][0] == 354:
                # (A server that said 354 after refusing the recipient still gets the content.)
                previous, previous_failure = current, failure
            else:
                # _judge_envelope names the refusal: a reply other than 354 to DATA is one.
                results[current.id] = failure or self._judge_data(*replies[2])
                self._needs_reset = True

    def _reply(self, connection: smtplib.SMTP) -> tuple[int, bytes]:
        code, reply = connection.getreply()
        if code in (421, -1):
            # 421: the server is closing the channel (RFC 5321 §3.8), whatever command it
            # answered; the connection is gone, unless it says we are going too fast.
            error = smtplib.SMTPResponseException(code, reply)
            _raise_if_throttled(error)
            raise _Lost(f"SMTP {code}: {_decode(reply)}", error)
        return code, reply

    def _judge_envelope(self, replies: list[tuple[int, bytes]]) -> SendResult | None:
        """The outcome decided by MAIL, RCPT or DATA's reply, or None when all three went well."""
        (mail_code, mail_reply), (rcpt_code, rcpt_reply), (data_code, data_reply) = replies
        if mail_code != 250:
            error = smtplib.SMTPResponseException(mail_code, mail_reply)
            _raise_if_throttled(error)
            if mail_code >= 500:
                # Refused at MAIL FROM (530 auth required, 553 sender not allowed): our
                # account or sender is wrong for every message. Not the recipients' fault.
                raise ProviderUnavailable(
                    f"SMTP {mail_code} at MAIL FROM: {_decode(mail_reply)} "
                    "(check SMTP_USERNAME/SMTP_PASSWORD and EMAILHUB_DEFAULT_FROM)",
                    **_fields(error),
                )
            return _result_for_code(mail_code, mail_reply, "refused at sender")
        if rcpt_code not in (250, 251):
            _raise_if_throttled(smtplib.SMTPResponseException(rcpt_code, rcpt_reply))
            return _result_for_code(rcpt_code, rcpt_reply, "refused at recipient")
        if data_code != 354:
            return self._judge_data(data_code, data_reply)
        return None

    def _judge_end(self, sent: _Prepared, code: int, reply: bytes) -> SendResult:
        if code == 250:
            return SendResult.accepted(sent.message_id)
        return self._judge_data(code, reply)

    def _judge_data(self, code: int, reply: bytes) -> SendResult:
        _raise_if_throttled(smtplib.SMTPResponseException(code, reply))
        result = _result_for_code(code, reply, "refused at data")
        if result.outcome is Outcome.PERMANENT:
            # 5xx after DATA (content rejected, too large): the message is at fault, the
            # address may be fine, so it is not suppressed.
            return SendResult(Outcome.PERMANENT, error=result.error, suppress=False)
        return result

    def close(self) -> None:
        for lane in self._extra:
            lane.close()
        self._extra = []
        if self._connection is not None:
            try:
                self._connection.quit()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
                self._connection.close()
            self._connection = None
        self._needs_reset = False

    def _drop(self) -> None:
        self._needs_reset = False
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


def _next_held(queue: Iterator[_Prepared], results: dict[int, SendResult], guard: Guard) -> _Prepared | None:
    """The next message of `queue` the guard allows; those it does not are ABANDONED on the way."""
    for prepared in queue:
        if guard.allows(prepared.id):
            return prepared
        results[prepared.id] = SendResult.abandoned()
    return None


def _held(prepared: Iterable[_Prepared], results: dict[int, SendResult], guard: Guard) -> list[_Prepared]:
    """The messages the guard allows; the others are ABANDONED."""
    held = []
    for message in prepared:
        if guard.allows(message.id):
            held.append(message)
        else:
            results[message.id] = SendResult.abandoned()
    return held


def lost_at(pending: list[_Prepared], results: dict[int, SendResult]) -> int:
    """Index of the first message of `pending` without an outcome yet."""
    return next(i for i, p in enumerate(pending) if p.id not in results)


def _lost_fields(exc: BaseException, provider: str) -> dict[str, Any]:
    if isinstance(exc, smtplib.SMTPResponseException):
        return _fields(exc)
    return {"provider": provider}


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
