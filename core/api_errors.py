"""One JSON shape for every error under `/api/`, whoever raised it.

    {"error": {"status": 400, "code": "invalid", "message": "…",
               "fields": {"to": ["…"]}, "limit": {"name": "EMAILHUB_API_MAX_BODY_BYTES", "value": 5242880}}}

`fields` is always there (empty when no field is at fault); `limit` only when a limit was hit
(a 413, the JSON depth, or a field refused for a limit of core.limits, `code: limit_exceeded`).
Two layers make it: `exception_handler` (DRF's EXCEPTION_HANDLER) shapes what DRF views raise,
and `ApiErrorMiddleware` shapes everything else on `/api/` paths: Django's own 400/404/500 pages
(an unknown path, a disallowed host, an exception outside DRF), and any error response a view
built by hand in DRF's `{"field": [...]}` or `{"detail": "…"}` form. Clients therefore never see
Django's HTML pages on `/api/`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.api_json import RequestTooLarge
from core.limits import limit_hit
from core.outages import DEPENDENCY_UNREACHABLE
from core.validators import unstorable_reason

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"

# The code a response gets when nothing more specific is known (a view's own Response, a
# Django page). DRF exceptions bring their own `default_code`.
CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    411: "length_required",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}

# A dependency briefly out of reach (PostgreSQL restarting, Redis or the broker away) is not the
# client's fault nor a bug: 503 with Retry-After, so clients retry (issue 18: a PostgreSQL restart
# answered 442 requests with 500). Nothing is half-stored: every accept is one transaction.
UNAVAILABLE_RETRY_AFTER_SECONDS = 5


def error_body(
    status_code: int,
    message: str,
    *,
    code: str | None = None,
    fields: dict[str, Any] | None = None,
    limit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    error: dict[str, Any] = {
        "status": status_code,
        "code": code or CODES.get(status_code, "error"),
        "message": message,
        "fields": fields or {},
    }
    if limit is not None:
        error["limit"] = limit
    return {"error": error}


def is_error_body(data: Any) -> bool:
    return isinstance(data, dict) and set(data) == {"error"} and isinstance(data["error"], dict)


def _phrase(status_code: int) -> str:
    try:
        return HTTPStatus(status_code).phrase.lower()
    except ValueError:
        return "error"


def shape(
    status_code: int, data: Any, *, code: str | None = None, limit: dict[str, Any] | None = None
) -> dict[str, Any]:
    """DRF's error data (`{"detail": …}`, `{"field": […]}` or `[…]`) in the common shape."""
    if is_error_body(data):
        return data
    # DRF's {"detail": "…"} (a string; a field named `detail` has a list of errors).
    if isinstance(data, dict) and set(data) <= {"detail"} and not isinstance(data.get("detail"), list):
        return error_body(
            status_code, str(data.get("detail") or _phrase(status_code)), code=code, limit=limit
        )
    if isinstance(data, list) and any(isinstance(item, dict) for item in data):
        # A list serializer's errors, one entry per item: fields by item index.
        data = {str(index): item for index, item in enumerate(data) if item}
    if isinstance(data, list):
        return error_body(
            status_code, "; ".join(str(item) for item in data) or _phrase(status_code), code=code, limit=limit
        )
    fields = dict(data) if isinstance(data, dict) else {}
    general = fields.pop("non_field_errors", None)
    if general:
        message = "; ".join(str(item) for item in general) if isinstance(general, list) else str(general)
    else:
        message = "invalid input: " + ", ".join(fields) if fields else _phrase(status_code)
    return error_body(status_code, message, code=code, fields=fields, limit=limit)


def _django_exception(exc: Exception) -> exceptions.APIException | None:
    """Django's request errors as API exceptions (DRF re-raises them, and Django would answer
    with an HTML 400 page)."""
    if isinstance(exc, RequestDataTooBig):
        size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        # It follows EMAILHUB_API_MAX_BODY_BYTES unless set apart; name the one to change.
        same = size == settings.EMAILHUB_API_MAX_BODY_BYTES
        return RequestTooLarge(size, "EMAILHUB_API_MAX_BODY_BYTES" if same else "DATA_UPLOAD_MAX_MEMORY_SIZE")
    if isinstance(exc, TooManyFieldsSent):
        error = RequestTooLarge(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS, "DATA_UPLOAD_MAX_NUMBER_FIELDS")
        error.detail = exceptions.ErrorDetail(str(exc), code="request_too_large")
        return error
    if isinstance(exc, SuspiciousOperation):
        return exceptions.ParseError(str(exc) or "bad request")
    return None


def _unavailable(exc: Exception) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and headers for a dependency that is briefly unreachable."""
    logger.warning("a dependency is unreachable, answering 503: %r", exc)
    body = error_body(503, "a service emailhub depends on is briefly unreachable; try again shortly")
    return 503, body, {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, with Django's request errors added, answering in the common shape."""
    if isinstance(exc, DEPENDENCY_UNREACHABLE):
        status_code, body, headers = _unavailable(exc)
        return Response(body, status=status_code, headers=headers)
    exc = _django_exception(exc) or exc
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a bug: ApiErrorMiddleware logs it and answers a JSON 500
    code = exc.default_code if isinstance(exc, exceptions.APIException) else None
    limit = getattr(exc, "limit", None)
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
        hit = limit_hit(exc.detail)  # a field refused for a configured limit (core.limits)
        if hit is not None:
            code, limit = "limit_exceeded", hit.error_member()
    response.data = shape(response.status_code, response.data, code=code, limit=limit)
    return response


def _json(status_code: int, body: dict[str, Any]) -> JsonResponse:
    return JsonResponse(body, status=status_code)


class ApiErrorMiddleware:
    """Every error response on `/api/` in the common shape. Install it first (outermost), so it
    also sees the pages Django's other middleware produce."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(API_PREFIX):
            # The admin's list filters pass query values to SQL as they are: NUL was a 500 there.
            refused = self._check_query(request)
            if refused is not None:
                message = "; ".join(refused["fields"].popitem()[1])
                return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
            return self.get_response(request)
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower() and not request.META.get(
            "CONTENT_LENGTH"
        ):
            # Django (and so DRF) reads no body without Content-Length: a chunked body would
            # silently parse as empty. Say so instead.
            return _json(
                411, error_body(411, "send the body with a Content-Length; chunked bodies are not read")
            )
        refused = self._check_query(request) or self._check_repeated(request) or self._check_headers(request)
        if refused is not None:
            return _json(400, shape(400, refused["fields"]))
        response = self.get_response(request)
        if response.status_code >= 400 and not getattr(response, "streaming", False):
            self._reshape(request, response)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not request.path_info.startswith(API_PREFIX):
            return None
        if isinstance(exc, DEPENDENCY_UNREACHABLE):  # raised outside a DRF view
            status_code, body, headers = _unavailable(exc)
            response = _json(status_code, body)
            for name, value in headers.items():
                response[name] = value
            return response
        known = _django_exception(exc)
        if known is not None:
            return _json(
                known.status_code,
                shape(
                    known.status_code,
                    {"detail": known.detail},
                    code=known.default_code,
                    limit=getattr(known, "limit", None),
                ),
            )
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _json(500, error_body(500, "internal error; it has been logged"))

    @staticmethod
    def _check_query(request: HttpRequest) -> dict[str, Any] | None:
        """{"fields": …} naming each query parameter that holds text PostgreSQL cannot store."""
        query = request.META.get("QUERY_STRING", "")
        if "%00" not in query and "\x00" not in query:
            return None  # the decoded query cannot hold NUL (Django decodes bad UTF-8 as U+FFFD)
        fields = {}
        for name, values in request.GET.lists():
            for value in [name, *values]:
                reason = unstorable_reason(value)
                if reason:
                    fields[name] = [f"query parameter {name!r} {reason}"]
        return {"fields": fields} if fields else None

    @staticmethod
    def _check_repeated(request: HttpRequest) -> dict[str, Any] | None:
        """{"fields": …} naming each query parameter given more than once: every one the API
        documents takes one value, and Django's QueryDict silently used the last."""
        if "&" not in request.META.get("QUERY_STRING", ""):
            return None
        fields = {
            name: [f"query parameter {name!r} is given {len(values)} times; give it once"]
            for name, values in request.GET.lists()
            if len(values) > 1
        }
        return {"fields": fields} if fields else None

    @staticmethod
    def _check_headers(request: HttpRequest) -> dict[str, Any] | None:
        """Headers reach PostgreSQL too (Idempotency-Key): NUL in one is a 400 naming it."""
        fields = {
            name: [f"header {name!r} {reason}"]
            for name, value in request.headers.items()
            if isinstance(value, str) and (reason := unstorable_reason(value))
        }
        return {"fields": fields} if fields else None

    @staticmethod
    def _reshape(request: HttpRequest, response: HttpResponse) -> None:
        data: Any = getattr(response, "data", None)
        if data is None and response.get("Content-Type", "").startswith("application/json"):
            try:
                data = json.loads(response.content or b"null")
            except ValueError:
                data = None
        if is_error_body(data):
            return
        if data is None:  # a Django page (HTML or empty): only the status is worth keeping
            if response.status_code == 404:
                data = {"detail": f"no such endpoint: {request.method} {request.path}"}
            elif response.status_code >= 500:
                data = {"detail": "internal error; it has been logged"}
            else:
                data = {"detail": _phrase(response.status_code)}
        response.content = json.dumps(shape(response.status_code, data)).encode()
        response["Content-Type"] = "application/json"
        response.headers.pop("Content-Length", None)
