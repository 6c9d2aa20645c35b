"""Amazon SES on loopback: moto in server mode, behind a proxy that can inject failures.

boto3 reaches the proxy through `endpoint_url`; the proxy forwards to moto unless told to answer
every request with an error (HTTP 500, or a throttling 400) or to reject certain recipients with
SES's `MessageRejected`. Sent messages are read from moto's backend (moto runs in this process).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler
from typing import Any

from moto.server import ThreadedMotoServer

from delivery.testing.http_server import BackgroundHTTPServer
from delivery.testing.smtp_server import free_port

ACCOUNT_ID = "123456789012"  # moto's default account
REGION = "us-east-1"


class _State:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.lock = threading.Lock()
        self.fail_status: int | None = None
        self.rejected: set[str] = set()
        self.refused_count = 0
        self.forwarded_sends = 0


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # see sendgrid_server._Handler

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"message": message}).encode()
        self.send_response(status)
        self.send_header("x-amzn-ErrorType", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        state: _State = self.server.owner.state  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        is_send = self.command == "POST" and self.path.endswith("/outbound-emails")
        with state.lock:
            fail_status, rejected = state.fail_status, set(state.rejected)
        if is_send and fail_status is not None:
            with state.lock:
                state.refused_count += 1
            if fail_status == 429:
                return self._error(429, "TooManyRequestsException", "Too many requests")
            return self._error(fail_status, "InternalFailure", "injected failure")
        if is_send and rejected:
            to = json.loads(body or b"{}").get("Destination", {}).get("ToAddresses", [])
            if any(address.lower() in rejected for address in to):
                with state.lock:
                    state.refused_count += 1
                return self._error(400, "MessageRejected", f"Address blacklisted: {', '.join(to)}")
        connection = http.client.HTTPConnection("127.0.0.1", state.upstream_port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection"}}
        connection.request(self.command, self.path, body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        if is_send and response.status == 200:
            with state.lock:
                state.forwarded_sends += 1
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in {"content-length", "connection", "transfer-encoding", "server", "date"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        connection.close()

    do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815


class SESTestServer:
    """moto's SES plus the proxy. `endpoint_url` is what boto3 (SES_ENDPOINT_URL) should use."""

    def __init__(
        self, verified_domains: tuple[str, ...] = ("example.com", "emailhub.local", "demo.example.com")
    ):
        self.moto_port = free_port()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self._proxy = BackgroundHTTPServer(_Proxy)
        self._proxy.state = _State(self.moto_port)  # type: ignore[attr-defined]
        self.state: _State = self._proxy.state  # type: ignore[attr-defined]
        self.verified_domains = verified_domains

    @property
    def endpoint_url(self) -> str:
        return self._proxy.url

    def __enter__(self) -> SESTestServer:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._moto.start()
        self._proxy.start()
        self.reset()
        return self

    def __exit__(self, *exc: object) -> None:
        self._proxy.stop()
        self._moto.stop()

    def reset(self) -> None:
        """Forget sent mail and injected faults; verify the sender domains again."""
        import boto3
        from moto.ses.models import ses_backends

        ses_backends[ACCOUNT_ID][REGION].sent_messages.clear()
        with self.state.lock:
            self.state.fail_status = None
            self.state.rejected.clear()
            self.state.refused_count = 0
            self.state.forwarded_sends = 0
        client = boto3.client(
            "sesv2", region_name=REGION, endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            aws_access_key_id="test", aws_secret_access_key="test",
        )  # fmt: skip
        for domain in self.verified_domains:
            client.create_email_identity(EmailIdentity=domain)

    def fail_with(self, status: int | None) -> None:
        with self.state.lock:
            self.state.fail_status = status

    def reject(self, *addresses: str) -> None:
        with self.state.lock:
            self.state.rejected.update(a.lower() for a in addresses)

    @property
    def refused_count(self) -> int:
        with self.state.lock:
            return self.state.refused_count

    def sent(self) -> list[tuple[list[str], EmailMessage]]:
        """(recipients, parsed MIME) of every message moto accepted."""
        from moto.ses.models import ses_backends

        out = []
        for message in list(ses_backends[ACCOUNT_ID][REGION].sent_messages):
            raw = getattr(message, "raw_data", None)
            if raw is None:
                continue
            parsed = message_from_bytes(raw.encode() if isinstance(raw, str) else raw, policy=policy.default)
            # moto lists a recipient twice: once from the envelope, once from the To: header.
            out.append((sorted(set(message.destinations)), parsed))
        return out

    @property
    def count(self) -> int:
        from moto.ses.models import ses_backends

        return len(ses_backends[ACCOUNT_ID][REGION].sent_messages)
