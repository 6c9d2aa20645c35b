"""A webhook endpoint on loopback that checks Standard Webhooks signatures and answers as told.

Tests, the demo and the outbound benchmark point an endpoint at `Receiver.url`. Every request is
recorded (`received`) with the outcome of `standardwebhooks`' verification against the raw body
bytes, so a test can assert what the dispatcher signed and sent; `events()` holds the events of
the requests that passed. The answer is programmable at any time: a default (`answer`) and a queue
of one-shot answers for the next requests (`answer_next`), each a status with headers and body,
after a delay, or a connection held open (`hang`) or closed with no response (`drop`).

    with Receiver(secret) as receiver:
        receiver.answer_next(503)  # the first attempt is refused, the retry taken
        ...  # register receiver.url as an endpoint, make something happen
        assert receiver.wait_for(lambda r: len(r.events(answered_2xx=True)) == 1)
        assert [r.status for r in receiver.received] == [503, 200]
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

_REDIRECTS = (301, 302, 303, 307, 308)
# How often a request held until a test's Event is set looks at whether the receiver is closing:
# one thread cannot wait on two Events, and this bounds how long close() waits for it.
_HANG_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Received:
    """One request as it arrived, and what the receiver answered."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased; a repeated header's values joined with ", "
    body: bytes  # exactly as received: what the signature covers
    json: Any  # the body parsed, or None when it is not JSON
    verified: bool
    verified_by: list[int]  # indexes into the receiver's secrets (at the time) that verified it
    # Why no secret verified it; None when one did, or when the receiver had no secret to check.
    error: str | None
    received_at: float  # time.time()
    # The status answered; None while the answer is pending (a delay, a hang), and for ever when
    # the connection was dropped or closed unanswered.
    status: int | None = None

    @property
    def passed(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: dict[str, str] | None = None
    body: bytes = b""
    delay: float = 0.0
    # True: hold the request until the receiver closes, then drop it. An Event: hold it until the
    # Event is set, then answer as above (or drop it if the receiver closes first).
    hang: bool | threading.Event = False
    drop: bool = False  # close the connection without a response

    def __post_init__(self) -> None:
        if self.hang is not False and self.drop:
            raise ValueError("an answer can hang or drop, not both")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0, not {self.delay}")
        names = {name.lower() for name in self.headers or {}}
        if self.status in _REDIRECTS and "location" not in names:
            raise ValueError(f"a {self.status} answer needs a Location header")


class _Server(ThreadingHTTPServer):
    # ThreadingMixIn's server_close() joins only non-daemon handler threads, and a non-daemon one
    # held by a receiver never closed would keep the interpreter from exiting. So the handler
    # threads are daemons, tracked here with their connections, and close() ends and joins them.
    block_on_close = False

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        self.threads: list[threading.Thread] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Registered here, in the serving thread, so that once shutdown() returns every accepted
        # connection and its thread are known, even a thread that has not started yet.
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        with self.lock:
            self.connections.add(request)
            self.threads = [t for t in self.threads if t.is_alive()]
            self.threads.append(thread)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A sender that gives up (a timeout during a delay or a hang) and close() cutting a
        # connection both end in an OSError on the socket: expected here, not worth a traceback.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint: senders reuse connections
    disable_nagle_algorithm = True  # see delivery/testing/sendgrid_server._Handler
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        receiver = self.server.receiver
        try:
            body = self._read_body()
        except ValueError:  # a Content-Length or chunk size that is not a number
            self.close_connection = True
            return self.send_error(400, "malformed body framing")
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        request, answer = receiver.record_request(self.command, self.path, headers, body)
        if answer.hang is not False and not self._hold(answer.hang, receiver.closing):
            return self._drop()
        if answer.delay and receiver.closing.wait(answer.delay):
            return self._drop()
        if answer.drop:
            return self._drop()
        receiver.mark_answered(request, answer.status)
        self.send_response(answer.status)
        for name, value in (answer.headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def _hold(self, release: bool | threading.Event, closing: threading.Event) -> bool:
        """Wait until `release` is set (True) or the receiver closes (False)."""
        if not isinstance(release, threading.Event):
            closing.wait()
            return False
        while not release.wait(_HANG_POLL_SECONDS):
            if closing.is_set():
                return False
        return True

    def _drop(self) -> None:
        self.close_connection = True  # shutdown_request() then closes it, having written nothing

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET = _handle  # noqa: N815


class Receiver:
    """A running endpoint from construction until `close()` (or the end of its `with` block)."""

    def __init__(self, secret: str | None = None, *, secrets: Sequence[str] | None = None) -> None:
        if secret is not None and secrets is not None:
            raise ValueError("give either secret or secrets, not both")
        self._cond = threading.Condition(threading.RLock())  # re-entrant: predicates read state
        self._webhooks: list[Webhook] = []
        self._secrets: list[str] = []
        if secrets is None:
            secrets = [secret] if secret is not None else []
        self.secrets = secrets
        self._received: list[Received] = []
        # The events of the requests that passed, kept as they arrive so that wait_for(count),
        # woken on every request of a benchmark, does not flatten every body each time.
        self._events: list[dict[str, Any]] = []
        self._default: Answer | None = None
        self._next: deque[Answer] = deque()
        # Set by close(): every held or delayed answer ends on it (the handlers wait on it).
        self.closing = threading.Event()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"webhook-receiver-{self.port}", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return self.url_for("/hook")

    def url_for(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    @property
    def secret(self) -> str | None:
        """The first secret requests are verified with (None: none, every request passes)."""
        with self._cond:
            return self._secrets[0] if self._secrets else None

    @secret.setter
    def secret(self, secret: str | None) -> None:
        self.secrets = [secret] if secret is not None else []

    @property
    def secrets(self) -> list[str]:
        """A request passes if any of these verifies it; `verified_by` says which did."""
        with self._cond:
            return list(self._secrets)

    @secrets.setter
    def secrets(self, secrets: Sequence[str]) -> None:
        webhooks = [Webhook(secret) for secret in secrets]  # a malformed secret fails here
        with self._cond:
            self._secrets, self._webhooks = list(secrets), webhooks

    def answer(
        self,
        status: int = 200,
        *,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        delay: float = 0.0,
        hang: bool | threading.Event = False,
        drop: bool = False,
    ) -> None:
        """How to answer every request from now on, once the `answer_next` queue is empty (a
        request that fails verification is answered this way too). See `Answer` for hang and drop."""
        answer = Answer(status, headers, body, delay, hang, drop)
        with self._cond:
            self._default = answer

    def answer_next(
        self,
        status: int = 200,
        *,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        delay: float = 0.0,
        hang: bool | threading.Event = False,
        drop: bool = False,
        times: int = 1,
    ) -> None:
        """Answer the next `times` requests this way, after those queued before."""
        answer = Answer(status, headers, body, delay, hang, drop)
        with self._cond:
            self._next.extend([answer] * times)

    def clear(self) -> None:
        """Forget the requests received and the answers programmed (the secrets stay)."""
        with self._cond:
            self._received.clear()
            self._events.clear()
            self._next.clear()
            self._default = None

    @property
    def received(self) -> list[Received]:
        with self._cond:
            return list(self._received)

    def events(self, *, answered_2xx: bool = False) -> list[dict[str, Any]]:
        """The events of the requests that passed verification, in order of arrival: a body is
        one event object or, from a batching endpoint, an array of them. With `answered_2xx`,
        only those of the requests answered with a 2xx, i.e. the deliveries the sender saw
        succeed."""
        if not answered_2xx:
            with self._cond:
                return list(self._events)
        events: list[dict[str, Any]] = []
        for request in self.received:
            if request.passed and 200 <= (request.status or 0) < 300:
                events.extend(_events_of(request.json))
        return events

    def wait_for(self, condition: int | Callable[[Receiver], bool], timeout: float = 10.0) -> bool:
        """Wait until `events()` holds `condition` events, or `condition(self)` is true (checked
        on each request and each answer). False if that has not happened within `timeout`.

        A request counts once recorded, before it is answered (a held one never is): to wait for
        the answers too, test `events(answered_2xx=True)` or the statuses in a predicate."""
        if isinstance(condition, int):
            count = condition

            def predicate() -> bool:
                return len(self._events) >= count
        else:

            def predicate() -> bool:
                return condition(self)

        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def close(self) -> None:
        """Stop serving and end every connection; held and delayed requests are dropped."""
        if self.closing.is_set():
            return
        self.closing.set()
        with self._cond:
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        with self._server.lock:
            connections, threads = list(self._server.connections), list(self._server.threads)
        for connection in connections:
            # Wakes a handler blocked reading the next request of a kept-alive connection, or
            # reading a body the client is slow to send.
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the client closed it already
        for thread in threads:
            # Every wait in a handler ends on `closing` or on its socket's shutdown; one still
            # running is a bug here, better reported than a test run that never ends.
            thread.join(timeout=5)
            if thread.is_alive():
                raise RuntimeError(f"webhook receiver: {thread.name} did not end on close()")

    def record_request(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[Received, Answer]:
        """Verify and record one request (the request handler calls it); the answer to give."""
        received_at = time.time()
        with self._cond:
            webhooks = list(self._webhooks)
        verified_by, errors = [], []
        for index, webhook in enumerate(webhooks):
            try:
                webhook.verify(body, headers, json_parse=False)
                verified_by.append(index)
            except WebhookVerificationError as exc:
                errors.append(str(exc))
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        request = Received(
            method=method,
            path=path,
            headers=headers,
            body=body,
            json=parsed,
            verified=bool(verified_by),
            verified_by=verified_by,
            error=None if verified_by or not webhooks else "; ".join(dict.fromkeys(errors)),
            received_at=received_at,
        )
        with self._cond:
            self._received.append(request)
            if request.passed:
                self._events.extend(_events_of(parsed))
            if self._next:
                answer = self._next.popleft()
            elif self._default is not None:
                answer = self._default
            elif request.passed:
                answer = Answer(200)
            else:
                # The reason in the body, for the sender's delivery log.
                answer = Answer(400, headers={"Content-Type": "text/plain"}, body=str(request.error).encode())
            self._cond.notify_all()
        return request, answer

    def mark_answered(self, request: Received, status: int) -> None:
        """Note the status a recorded request was answered with (the request handler calls it)."""
        with self._cond:
            # Found by identity: clear() may have emptied the list while it was being answered.
            for index in range(len(self._received) - 1, -1, -1):
                if self._received[index] is request:
                    self._received[index] = replace(request, status=status)
                    break
            self._cond.notify_all()


def _events_of(body: Any) -> list[dict[str, Any]]:
    """A body's events: one event object, or an array of them from a batching endpoint."""
    items = body if isinstance(body, list) else [body]
    return [item for item in items if isinstance(item, dict)]
