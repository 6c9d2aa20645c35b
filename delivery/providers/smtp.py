"""SMTP: one persistent connection per worker process, many messages per connection.

Reply codes (RFC 5321 §4.2.1): 4yz is transient, 5yz permanent. A dropped connection is
reopened once for the message that found it dropped; a second failure marks the provider
unavailable for the rest of the batch.

One exchange path, whether or not the server offers PIPELINING (RFC 2920). Each round of a
connection (`_round`) is the previous message's content and final dot, an RSET if the last
transaction was refused before its content, then this message's MAIL FROM, RCPT TO and DATA
(DATA is the last command of a group, §3.1: the content waits for its 354). With PIPELINING the
round is one write and its replies are read back in order: one round trip per message, where
smtplib's `sendmail` makes four. Without it, every command is a group of one, written once the
reply before it has been read (the lock-step dialogue the extension relaxes), and a transaction
refused is sent no further.
Every reply is judged by the same rules either way (`_reply`, and delivery/providers/smtp_replies.py).
A pipelined batch is also spread over up to SMTP_CONNECTIONS connections (one per
MESSAGES_PER_CONNECTION messages), driven in turn so that their round trips overlap (`_drive`);
without PIPELINING a batch keeps one connection.

The batch's guard (base.Guard) is asked before each message's MAIL FROM is written, and again
before its content, which is what hands it over; a message it no longer allows gets ABANDONED,
and one whose content it no longer allows is cut off by closing the connection (`_cut_off`).
"""

from __future__ import annotations

import re
import smtplib
import socket
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers import smtp_replies as replies
from delivery.providers.base import (
    CopyRefused,
    Guard,
    Outcome,
    OutgoingEmail,
    Provider,
    SendResult,
    gone_part_way,
)
from delivery.providers.dkim import DkimSigner
from delivery.providers.mime import ascii_address, bare_address, render
from delivery.providers.smtp_replies import Reply

_CONNECTION_ERRORS = (smtplib.SMTPServerDisconnected, ConnectionError, socket.timeout, OSError)
# RFC 5321 §4.5.2: a line of the content that starts with "." gets one more.
_LEADING_DOT = re.compile(rb"(?m)^\.")
_RSET = b"RSET\r\n"


@dataclass(slots=True)
class _Prepared:
    """One email rendered, signed and framed for the wire."""

    id: int
    message_id: str
    # The MAIL FROM, RCPT TO and DATA command lines: a RCPT TO for the recipient, then one per
    # copy (cc, then bcc), whose addresses `copies` lists in that order.
    envelope: tuple[bytes, tuple[bytes, ...], bytes]
    content: bytes  # dot-stuffed, ending in CRLF.CRLF
    copies: tuple[str, ...] = ()


@dataclass(slots=True)
class _Open:
    """A transaction whose DATA got 354: its content goes first in the connection's next round."""

    message: _Prepared
    failure: SendResult | None  # refused at RCPT by a server that still said 354 to DATA
    # The copies the server refused at RCPT while it took the recipient: the message goes on.
    refused_copies: tuple[CopyRefused, ...] = ()
    # Its recipient refused while a copy was taken: the content must not go (it would reach the
    # copies alone), so the connection is closed instead (`_cut_off`).
    abort: bool = False


# A command of a round and what its reply settles: the envelope's replies (a list to add it to),
# an open transaction's outcome, or (None) the RSET.
_Step = tuple[bytes, _Open | list[Reply] | None]


@dataclass(slots=True)
class _Batch:
    """What the lanes of one batch share: the outcomes so far, the guard, and whether one of
    them met a provider-wide refusal (the others then start nothing new)."""

    guard: Guard
    results: dict[int, SendResult] = field(default_factory=dict)
    stopped: bool = False


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
                    f"SMTP login refused by {self.host}:{self.port}: {exc}", **replies.fields(exc)
                ) from exc
            except smtplib.SMTPResponseException as exc:
                # A greeting of "421 too many connections, try later" is a rate limit too.
                replies.raise_if_throttled(exc)
                raise ProviderUnavailable(
                    f"cannot connect to SMTP {self.host}:{self.port}: {exc}", **replies.fields(exc)
                ) from exc
            except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
                raise ProviderUnavailable(
                    f"cannot connect to SMTP {self.host}:{self.port}: {exc}", provider=self.name
                ) from exc
            self._connection = connection
        return self._connection

    def split(self, emails: Sequence[OutgoingEmail]) -> list[list[OutgoingEmail]]:
        # One request for the whole batch, spread over this provider's connections (send_request).
        return [list(emails)] if emails else []

    def send_request(self, request: list[OutgoingEmail], guard: Guard) -> dict[int, SendResult]:
        """The batch over this connection and, when the server offers PIPELINING, up to
        `connections` of them (`_lanes`), driven in turn (`_drive`)."""
        connection = self._connect()
        try:
            connection.ehlo_or_helo_if_needed()
        except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
            self._drop()
            raise ProviderUnavailable(f"SMTP EHLO failed: {exc}", provider=self.name) from exc
        batch = _Batch(guard)
        prepared = self._prepare_all(request, batch.results)
        lanes = self._lanes(len(prepared)) if connection.has_extn("pipelining") else [self]
        failures = _drive(
            [lane._lane(prepared[i :: len(lanes)], batch) for i, lane in enumerate(lanes)], batch
        )
        for failure in failures:
            if isinstance(failure, ProviderThrottled):
                failure.partial = dict(batch.results)
                raise failure
        for failure in failures:
            if isinstance(failure, ProviderUnavailable):
                return gone_part_way(self.name, request, batch.results, failure)
        return batch.results

    def _prepare_all(self, emails: list[OutgoingEmail], results: dict[int, SendResult]) -> list[_Prepared]:
        prepared = []
        for email in emails:
            try:
                prepared.append(self._prepare(email))
            except ValueError as exc:  # raised by delivery.providers.mime for what it cannot encode
                results[email.message_id] = SendResult.unbuildable(str(exc))
        return prepared

    def _prepare(self, email: OutgoingEmail) -> _Prepared:
        """`email` rendered to MIME, DKIM-signed and framed: done once per message, so a
        reconnect resends the same signed bytes."""
        message_id, data = render(email, message_id_domain=self.message_id_domain)
        sender = ascii_address(bare_address(email.from_email))
        # A path is the mailbox alone (RFC 5321 §4.1.2), without the display name `to` may carry.
        recipients = [ascii_address(bare_address(address)) for address in (email.to, *email.cc, *email.bcc)]
        data = self.dkim.sign(data, from_domain=sender.rpartition("@")[2])
        content = _LEADING_DOT.sub(b"..", data)
        if not content.endswith(b"\r\n"):
            content += b"\r\n"
        envelope = (
            f"MAIL FROM:<{sender}>\r\n".encode("ascii"),
            tuple(f"RCPT TO:<{recipient}>\r\n".encode("ascii") for recipient in recipients),
            b"DATA\r\n",
        )
        copies = (*email.cc, *email.bcc)
        return _Prepared(email.message_id, message_id.strip("<>"), envelope, content + b".\r\n", copies)

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

    def _lane(self, pending: list[_Prepared], batch: _Batch) -> Iterator[None]:
        """This connection's share of a batch; yields after each write (see _round)."""
        reconnected: set[int] = set()
        while True:
            try:
                yield from self._exchange(pending, batch)
                return
            except _Lost as lost:
                # In flight when the connection went: the first message not finished. It gets
                # one new connection; if that goes too, the provider is unavailable.
                self._drop()
                pending = [p for p in pending if p.id not in batch.results]
                if not pending:
                    return
                if pending[0].id in reconnected or batch.stopped:
                    raise ProviderUnavailable(lost.args[0], **_lost_fields(lost.exc, self.name)) from lost.exc
                reconnected.add(pending[0].id)
            except (ProviderThrottled, ProviderUnavailable):
                self._drop()  # replies may still be on their way: never reuse a half-read stream
                raise

    def _exchange(self, pending: list[_Prepared], batch: _Batch) -> Iterator[None]:
        """Send `pending` over this lane's connection, one round per message, recording each
        outcome in `batch.results` as its last reply arrives. Raises _Lost when the connection goes."""
        connection = self._connect()
        try:
            connection.ehlo_or_helo_if_needed()  # a new connection after a reconnect
        except (*_CONNECTION_ERRORS, smtplib.SMTPException) as exc:
            raise _Lost(f"SMTP connection lost: {exc}", exc) from exc
        pipelining = connection.has_extn("pipelining")
        queue = iter(pending)
        open_: _Open | None = None
        while True:
            current = None if batch.stopped else _next_held(queue, batch)
            if open_ is not None and (open_.abort or not batch.guard.allows(open_.message.id)):
                yield from self._cut_off(open_, current, queue, batch)
                return
            if open_ is None and current is None:
                return
            open_ = yield from self._round(connection, pipelining, open_, current, batch)

    def _cut_off(
        self, open_: _Open, current: _Prepared | None, queue: Iterator[_Prepared], batch: _Batch
    ) -> Iterator[None]:
        """`open_` lost between its DATA and its content (the worker stalled waiting for the 354,
        say): the content would hand over a message this worker no longer holds; or its
        recipient was refused while a copy was taken, and the content would reach the copies
        alone. The transaction is left unfinished instead: a server takes a message at its final
        dot (RFC 5321 §4.1.1.4), so closing the connection before it drops the message; whatever
        is still held goes over a new connection."""
        batch.results[open_.message.id] = (open_.abort and open_.failure) or SendResult.abandoned()
        self._drop()
        if batch.stopped:
            return
        rest = _held([*([] if current is None else [current]), *queue], batch)
        if rest:
            yield from self._exchange(rest, batch)

    def _round(
        self,
        connection: smtplib.SMTP,
        pipelining: bool,
        open_: _Open | None,
        current: _Prepared | None,
        batch: _Batch,
    ) -> Generator[None, None, _Open | None]:
        """One round of a connection: `open_`'s content, RSET if the last transaction was refused
        before its content (a server still holding its MAIL would refuse the next one), then
        `current`'s MAIL FROM, RCPT TO and DATA. With PIPELINING they are one group: one write,
        its replies read in order. Without, each command is a group of one, and a transaction
        refused is sent no further. Yields after each write, before reading its replies; returns
        `current` if its DATA got 354 (its content starts the next round)."""
        envelope: list[Reply] = []
        steps: list[_Step] = []
        if open_ is not None:
            steps.append((open_.message.content, open_))
        if current is not None:
            if self._needs_reset:
                steps.append((_RSET, None))
            mail, rcpts, data = current.envelope
            steps += [(mail, envelope), *((rcpt, envelope) for rcpt in rcpts), (data, envelope)]
        size = len(steps) if pipelining else 1
        try:
            for start in range(0, len(steps), size):
                if envelope and replies.refused(envelope, len(current.copies) if current else 0):
                    break  # (only without PIPELINING, where the refusal is known before the next write)
                group = steps[start : start + size]
                connection.send(b"".join([line for line, _ in group]))
                yield
                self._settle(connection, group, batch)
        except _CONNECTION_ERRORS as exc:
            raise _Lost(f"SMTP connection lost: {exc}", exc) from exc
        return None if current is None else self._opened(current, envelope, batch)

    def _settle(self, connection: smtplib.SMTP, group: list[_Step], batch: _Batch) -> None:
        """Read the replies to a group, in order, each settling what its command was for: one
        more of the envelope's, an open transaction's outcome, or the RSET."""
        for _, settles in group:
            code, reply = self._reply(connection)
            if isinstance(settles, list):
                settles.append((code, reply))
            elif settles is not None:
                result = settles.failure or replies.judge_end(settles.message.message_id, code, reply)
                if result.outcome is Outcome.ACCEPTED and settles.refused_copies:
                    result = SendResult.accepted(result.provider_message_id, settles.refused_copies)
                batch.results[settles.message.id] = result
            elif code != 250:
                raise _Lost(
                    f"SMTP {code} to RSET: {replies.decode(reply)}",
                    smtplib.SMTPResponseException(code, reply),
                )
            else:
                self._needs_reset = False

    def _opened(self, current: _Prepared, envelope: list[Reply], batch: _Batch) -> _Open | None:
        """`current` once its envelope's replies are in: open when DATA got 354; otherwise
        refused, its outcome recorded and the connection due an RSET."""
        copies = len(current.copies)
        failure = replies.judge_envelope(envelope, copies)
        opened = len(envelope) == 3 + copies and envelope[-1][0] == 354
        refused = replies.refused_copies(envelope, copies)
        if failure is None:
            return _Open(
                current, None, tuple(_copy_refused(current.copies[i], reply) for i, reply in refused)
            )
        if opened:
            # A server that said 354 after refusing the recipient: with no copy taken it drops
            # the content itself (no recipient), so it still gets it; with one, it must not.
            return _Open(current, failure, abort=len(refused) < copies)
        batch.results[current.id] = failure
        self._needs_reset = True
        return None

    def _reply(self, connection: smtplib.SMTP) -> Reply:
        code, reply = connection.getreply()
        if code in (421, -1):
            # 421: the server is closing the channel (RFC 5321 §3.8), whatever command it
            # answered; the connection is gone, unless it says we are going too fast.
            error = smtplib.SMTPResponseException(code, reply)
            replies.raise_if_throttled(error)
            raise _Lost(f"SMTP {code}: {replies.decode(reply)}", error)
        return code, reply

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


def _drive(lanes: list[Iterator[None]], batch: _Batch) -> list[ProviderThrottled | ProviderUnavailable]:
    """Run a batch's lanes in turn, one write each, so their round trips overlap, until all are
    done; return the provider-wide refusals that ended any of them."""
    failures: list[ProviderThrottled | ProviderUnavailable] = []
    while lanes:
        for lane in list(lanes):
            try:
                next(lane)
            except StopIteration:
                lanes.remove(lane)
            except (ProviderThrottled, ProviderUnavailable) as exc:
                # The provider refuses as a whole: the other lanes start nothing new but
                # finish what is in flight, so every message the server took is known.
                lanes.remove(lane)
                failures.append(exc)
                batch.stopped = True
    return failures


def _next_held(queue: Iterator[_Prepared], batch: _Batch) -> _Prepared | None:
    """The next message of `queue` the guard allows; those it does not are ABANDONED on the way."""
    for prepared in queue:
        if batch.guard.allows(prepared.id):
            return prepared
        batch.results[prepared.id] = SendResult.abandoned()
    return None


def _held(prepared: Iterable[_Prepared], batch: _Batch) -> list[_Prepared]:
    """The messages the guard allows; the others are ABANDONED (`_next_held`'s rule)."""
    queue, held = iter(prepared), []
    while (message := _next_held(queue, batch)) is not None:
        held.append(message)
    return held


def _copy_refused(address: str, reply: Reply) -> CopyRefused:
    code, text = reply
    return CopyRefused(
        address, f"SMTP {code} refused at recipient: {replies.decode(text)}", 500 <= code < 600
    )


def _lost_fields(exc: BaseException, provider: str) -> dict[str, Any]:
    if isinstance(exc, smtplib.SMTPResponseException):
        return replies.fields(exc)
    return {"provider": provider}
