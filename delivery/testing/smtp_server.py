"""An aiosmtpd server on loopback that records what it receives and can be told to misbehave.

Used by the tests (inspect messages, answer 421/451/550, drop connections) and by the demo as
its SMTP sink. It runs in a background thread; use it as a context manager so it always stops.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class ReceivedMessage:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes
    received_at: float = field(default_factory=time.time)
    # The client's (host, port): messages that share it came over one SMTP connection.
    peer: tuple[str, int] | None = None

    def parsed(self) -> EmailMessage:
        return message_from_bytes(self.data, policy=policy.default)  # type: ignore[return-value]


class _Handler:
    def __init__(self, pipelining: bool = True) -> None:
        self.lock = threading.Lock()
        # Advertise PIPELINING (RFC 2920) in the EHLO reply, as Postfix does. aiosmtpd reads
        # pipelined commands in order either way; the flag decides which client path is used.
        self.pipelining = pipelining
        self.messages: list[ReceivedMessage] = []
        self.recipient_replies: dict[str, str] = {}
        self.reply_to_all: str | None = None
        self.mail_reply: str | None = None
        self.data_reply: str | None = None
        self.drop_connections = 0
        # While set, the end of DATA is received (and counted in `held`) but not answered, so a
        # test can act while a message is at the provider and not yet accepted.
        self.hold_data = threading.Event()
        self.held = 0

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        if self.pipelining:
            return [*responses[:-1], "250-PIPELINING", responses[-1]]
        return responses

    async def handle_MAIL(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        with self.lock:
            if self.drop_connections > 0:
                self.drop_connections -= 1
                server.transport.close()
                return "421 closing"
            if self.mail_reply:
                return self.mail_reply
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        with self.lock:
            reply = self.recipient_replies.get(address.lower()) or self.reply_to_all
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            if self.data_reply:
                return self.data_reply
        received = ReceivedMessage(
            envelope.mail_from, list(envelope.rcpt_tos), envelope.content, peer=tuple(session.peer[:2])
        )
        if self.hold_data.is_set():
            with self.lock:
                self.held += 1
            while self.hold_data.is_set():
                await asyncio.sleep(0.01)
        with self.lock:
            self.messages.append(received)
        return "250 Message accepted for delivery"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class SMTPTestServer:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None, *, pipelining: bool = True) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.handler = _Handler(pipelining)
        self._controller = Controller(self.handler, hostname=host, port=self.port)

    def __enter__(self) -> SMTPTestServer:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    @property
    def messages(self) -> list[ReceivedMessage]:
        with self.handler.lock:
            return list(self.handler.messages)

    @property
    def count(self) -> int:
        with self.handler.lock:
            return len(self.handler.messages)

    def clear(self) -> None:
        with self.handler.lock:
            self.handler.messages.clear()
            self.handler.recipient_replies.clear()
            self.handler.reply_to_all = None
            self.handler.mail_reply = None
            self.handler.data_reply = None
            self.handler.drop_connections = 0
            self.handler.held = 0
        self.handler.hold_data.clear()

    def hold_data_replies(self, hold: bool = True) -> None:
        """Hold (or release) the reply to the end of DATA; `held` counts messages waiting for it."""
        if hold:
            self.handler.hold_data.set()
        else:
            self.handler.hold_data.clear()

    @property
    def held(self) -> int:
        with self.handler.lock:
            return self.handler.held

    def reply_for(self, address: str, reply: str) -> None:
        """Answer RCPT TO for this address with e.g. ``"550 5.1.1 no such user"``."""
        with self.handler.lock:
            self.handler.recipient_replies[address.lower()] = reply

    def reply_to_everyone(self, reply: str | None) -> None:
        with self.handler.lock:
            self.handler.reply_to_all = reply

    def reply_to_mail_from(self, reply: str | None) -> None:
        """Answer MAIL FROM with e.g. ``"530 5.7.0 Authentication required"``."""
        with self.handler.lock:
            self.handler.mail_reply = reply

    def reply_to_data(self, reply: str | None) -> None:
        """Answer the end of DATA with e.g. ``"554 5.6.0 content rejected"``."""
        with self.handler.lock:
            self.handler.data_reply = reply

    def drop_next_connections(self, count: int) -> None:
        with self.handler.lock:
            self.handler.drop_connections = count

    def wait_for(self, count: int, timeout: float = 10.0) -> list[ReceivedMessage]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count >= count:
                return self.messages
            time.sleep(0.02)
        raise TimeoutError(f"SMTP server got {self.count} message(s), expected {count}")
