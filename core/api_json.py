"""The API's JSON parser: a bounded body, strict UTF-8, a depth cap, and only what PostgreSQL stores.

DRF's JSONParser hands the body to `json.load`, which recurses in C and raises RecursionError
(a 500) at about 1,000 levels, reads a body of any size (Django's DATA_UPLOAD_MAX_MEMORY_SIZE is
only checked for `request.body`, which DRF does not use), accepts NaN and Infinity (jsonb
refuses them) and strings PostgreSQL cannot store: U+0000 in text or jsonb, and unpaired
surrogates (`"\\ud800"`), which psycopg cannot encode. Each of those was a 500 after validation
had passed. Here they are refused before any view code runs, naming the field and the limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import IO, Any

from django.conf import settings
from rest_framework import exceptions, parsers, status
from rest_framework.exceptions import ParseError, ValidationError

from core.validators import unstorable_reason

# Strings (with their escapes) removed before the brackets are counted, so "[[[" inside a string
# is not depth.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # "unrolled": 10x faster than (a|b)*
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # bytes.translate deletes these
_MAYBE_UNSTORABLE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class RequestTooLarge(exceptions.APIException):
    """A 413 beyond a configured limit; `limit` names the setting and its value. The apps' own
    413s (a CSV import, a batch, a webhook body) are this with their setting and wording."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(
        self, max_bytes: int, name: str = "EMAILHUB_API_MAX_BODY_BYTES", *, message: str | None = None
    ) -> None:
        super().__init__(message or f"the request body is larger than {max_bytes} bytes")
        self.limit = {"name": name, "value": max_bytes}


class LimitExceeded(exceptions.APIException):
    """A 400 for input beyond a configured limit; `limit` names the setting and its value."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "limit_exceeded"

    def __init__(self, message: str, *, limit: dict[str, Any]) -> None:
        super().__init__(message)
        self.limit = limit


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body`, without recursion (C-speed scans)."""
    if body.count(b"[") + body.count(b"{") == 0:
        return 0
    if b'\\"' in body:  # an escaped quote: find where strings end with the regex
        outside = _JSON_STRING.sub(b"", body)
    else:  # no escaped quote: every other piece between quotes is outside the strings
        outside = b"".join(body.split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _walk(data: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, reason) for every unstorable key or string, breadth first and without recursion."""
    pending: list[tuple[str, Any]] = [(path, data)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            reason = unstorable_reason(value)
            if reason:
                yield where, reason
        elif isinstance(value, Mapping):
            for key, item in value.items():
                child = f"{where}.{key}" if where else str(key)
                reason = unstorable_reason(key)
                if reason:
                    yield where or "(body)", f"has the key {key!r}, which {reason}"
                pending.append((child, item))
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", item) for index, item in enumerate(value))


def unstorable_fields(data: Any) -> dict[str, list[str]]:
    """Errors by top-level field for every string or key in `data` PostgreSQL cannot store."""
    errors: dict[str, list[str]] = {}
    for where, reason in _walk(data, ""):
        field = re.split(r"[.\[ ]", where, maxsplit=1)[0] or "(body)"
        errors.setdefault(field, []).append(f"{where} {reason}")
    return errors


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number PostgreSQL can store")


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large for a JSON number")
    return number


class JSONParser(parsers.JSONParser):
    """DRF's JSONParser with the checks described in this module's docstring."""

    def parse(
        self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        max_bytes = settings.EMAILHUB_API_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise RequestTooLarge(max_bytes)
        body = stream.read(max_bytes + 1) if stream is not None else b""
        if len(body) > max_bytes:  # a chunked body without Content-Length
            raise RequestTooLarge(max_bytes)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"the body is not UTF-8: byte {exc.start} (0x{body[exc.start]:02x}) cannot be decoded"
            ) from None
        max_depth = settings.EMAILHUB_API_MAX_JSON_DEPTH
        if json_depth(body) > max_depth:
            raise LimitExceeded(
                f"JSON nested deeper than {max_depth} levels",
                limit={"name": "EMAILHUB_API_MAX_JSON_DEPTH", "value": max_depth},
            )
        try:
            data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        except ValueError as exc:  # JSONDecodeError is a ValueError, and so are ours
            raise ParseError(f"JSON parse error - {exc}") from None
        # Valid JSON can only hold NUL or a surrogate as a \u escape, so most bodies skip the walk.
        errors = unstorable_fields(data) if _MAYBE_UNSTORABLE.search(text) else {}
        if errors:
            raise ValidationError(errors)
        return data
