"""A local server that speaks SendGrid's v3 `POST /v3/mail/send` contract.

It checks requests the way SendGrid does (bearer key, 1–1000 personalizations, a valid address
in each `to`, a sender, a subject, text/plain before text/html, attachments with base64 content,
a filename and a content_id when inline), answers 202 with an
`X-Message-Id`, and records each delivered recipient with substitutions applied. It can be told
to answer 500/429 (with a `Retry-After`)/503 to everything, or to reject particular addresses with a 400 that names the
personalization, as SendGrid does.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from delivery.testing.http_server import BackgroundHTTPServer

_ADDRESS = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


@dataclass(frozen=True)
class Delivered:
    to: str
    subject: str
    text: str
    html: str
    custom_args: dict[str, str]
    message_id: str
    headers: dict[str, str]  # the request's headers overlaid with the personalization's
    # The request's attachments: (filename, type, disposition, content_id or None, decoded bytes).
    attachments: tuple[tuple[str, str, str, str | None, bytes], ...] = ()


class _State:
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.delivered: list[Delivered] = []
        self.fail_status: int | None = None
        self.fail_headers: dict[str, str] = {}
        self.rejected: set[str] = set()
        self.refused_count = 0


def _errors(status: int, errors: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    return status, {"errors": errors}


def _validate(body: Any, rejected: set[str]) -> tuple[int, dict[str, Any]] | None:
    if not isinstance(body, dict):
        return _errors(400, [{"message": "Bad Request", "field": None}])
    personalizations = body.get("personalizations")
    if not isinstance(personalizations, list) or not 1 <= len(personalizations) <= 1000:
        return _errors(
            400,
            [
                {
                    "message": "The personalizations field is required and must have at least one personalization.",
                    "field": "personalizations",
                }
            ],
        )
    if not isinstance(body.get("from"), dict) or not _ADDRESS.match(str(body["from"].get("email", ""))):
        return _errors(
            400, [{"message": "The from email does not contain a valid address.", "field": "from.email"}]
        )
    content = body.get("content") or []
    if not content or any(not part.get("value") for part in content):
        return _errors(
            400, [{"message": "Content values must be at least one character.", "field": "content"}]
        )
    types = [part.get("type") for part in content]
    if "text/plain" in types and types.index("text/plain") != 0:
        return _errors(400, [{"message": "If present, text/plain must be first.", "field": "content.0.type"}])
    errors = _attachment_errors(body.get("attachments"))
    for index, personalization in enumerate(personalizations):
        for to_index, recipient in enumerate(personalization.get("to") or [{}]):
            email = str(recipient.get("email", ""))
            if not _ADDRESS.match(email) or email.lower() in rejected:
                errors.append(
                    {
                        "message": "Does not contain a valid address.",
                        "field": f"personalizations.{index}.to.{to_index}.email",
                    }
                )
        if not (personalization.get("subject") or body.get("subject")):
            errors.append(
                {"message": "The subject is required.", "field": f"personalizations.{index}.subject"}
            )
    return _errors(400, errors) if errors else None


def _attachment_errors(attachments: Any) -> list[dict[str, Any]]:
    """SendGrid's rules for `attachments`: content (base64) and filename required, disposition
    `attachment` or `inline`, an inline one with a content_id."""
    if attachments is None:
        return []
    if not isinstance(attachments, list):
        return [{"message": "The attachments field must be an array.", "field": "attachments"}]
    errors = []
    for index, item in enumerate(attachments):
        field = f"attachments.{index}"
        try:
            base64.b64decode(str(item.get("content", "")), validate=True)
        except binascii.Error:
            errors.append(
                {"message": "The attachment content must be base64 encoded.", "field": f"{field}.content"}
            )
        if not item.get("content"):
            errors.append({"message": "The attachment content is required.", "field": f"{field}.content"})
        if not item.get("filename"):
            errors.append({"message": "The attachment filename is required.", "field": f"{field}.filename"})
        if item.get("disposition", "attachment") not in ("attachment", "inline"):
            errors.append({"message": "Invalid disposition.", "field": f"{field}.disposition"})
        if item.get("disposition") == "inline" and not item.get("content_id"):
            errors.append(
                {
                    "message": "The content_id is required for an inline attachment.",
                    "field": f"{field}.content_id",
                }
            )
    return errors


def _attachments(body: dict[str, Any]) -> tuple[tuple[str, str, str, str | None, bytes], ...]:
    return tuple(
        (
            item["filename"],
            item.get("type", ""),
            item.get("disposition", "attachment"),
            item.get("content_id"),
            base64.b64decode(item["content"]),
        )
        for item in body.get("attachments") or ()
    )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK, ~45 ms a request (found by bench/delivery.py).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _reply(
        self, status: int, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        payload = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        state: _State = self.server.owner.state  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.rstrip("/") != "/v3/mail/send":
            return self._reply(404, {"errors": [{"message": "not found"}]})
        if self.headers.get("Authorization") != f"Bearer {state.api_key}":
            return self._reply(
                401,
                {
                    "errors": [
                        {
                            "message": "The provided authorization grant is invalid, expired, or revoked",
                            "field": None,
                        }
                    ]
                },
            )
        with state.lock:
            fail_status, fail_headers, rejected = state.fail_status, state.fail_headers, set(state.rejected)
        if fail_status is not None:
            with state.lock:
                state.refused_count += 1
            return self._reply(
                fail_status, {"errors": [{"message": "injected failure", "field": None}]}, fail_headers
            )
        try:
            body = json.loads(raw)
        except ValueError:
            return self._reply(400, {"errors": [{"message": "Bad Request", "field": None}]})
        invalid = _validate(body, rejected)
        if invalid is not None:
            return self._reply(*invalid)
        message_id = uuid.uuid4().hex[:22]
        attachments = _attachments(body)
        delivered = []
        for personalization in body["personalizations"]:
            values = dict(personalization.get("substitutions") or {})
            parts = {part["type"]: part["value"] for part in body["content"]}

            def fill(text: str, values: dict[str, str] = values) -> str:
                for tag, value in values.items():
                    text = text.replace(tag, value)
                return text

            for recipient in personalization["to"]:
                delivered.append(
                    Delivered(
                        to=recipient["email"],
                        subject=personalization.get("subject") or body.get("subject", ""),
                        text=fill(parts.get("text/plain", "")),
                        html=fill(parts.get("text/html", "")),
                        custom_args=dict(personalization.get("custom_args") or {}),
                        message_id=message_id,
                        headers={**(body.get("headers") or {}), **(personalization.get("headers") or {})},
                        attachments=attachments,
                    )
                )
        with state.lock:
            state.requests.append(body)
            state.delivered.extend(delivered)
        self._reply(202, None, {"X-Message-Id": message_id})


class SendGridTestServer(BackgroundHTTPServer):
    def __init__(self, api_key: str = "SG.test-key", port: int = 0) -> None:
        super().__init__(_Handler, port=port)
        self.state = _State(api_key)

    def __enter__(self) -> SendGridTestServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def api_key(self) -> str:
        return self.state.api_key

    @property
    def delivered(self) -> list[Delivered]:
        with self.state.lock:
            return list(self.state.delivered)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    @property
    def refused_count(self) -> int:
        with self.state.lock:
            return self.state.refused_count

    def fail_with(self, status: int | None, retry_after: str | None = None) -> None:
        """Answer every request with this status (None: behave), e.g. 429 with `Retry-After: 45`."""
        with self.state.lock:
            self.state.fail_status = status
            self.state.fail_headers = {"Retry-After": retry_after} if retry_after is not None else {}

    def reject(self, *addresses: str) -> None:
        with self.state.lock:
            self.state.rejected.update(a.lower() for a in addresses)

    def clear(self) -> None:
        with self.state.lock:
            self.state.requests.clear()
            self.state.delivered.clear()
            self.state.fail_status = None
            self.state.fail_headers = {}
            self.state.rejected.clear()
            self.state.refused_count = 0
