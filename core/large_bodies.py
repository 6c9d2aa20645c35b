"""Garbage collection before a request with a large body (an attachment's megabytes of base64).

A request's objects sit in reference cycles (DRF's Request holds itself in its parser_context),
so its body, its parsed JSON and its decoded files are freed only by the cyclic garbage
collector, whose thresholds count objects, not bytes: a web process handling 14 MB requests
of attachments kept ~10 MB more after each one, 1.2 GB after a hundred (bench/attachments.py),
where a collection between them keeps it flat (140 MB). Collecting before each request whose
body is at least COLLECT_ABOVE_BYTES frees what the previous large ones left; a small request
pays nothing (the usual case: an OTP is a few hundred bytes).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

COLLECT_ABOVE_BYTES = 1024 * 1024


class CollectBeforeLargeBodies:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django refuses it later, in its own words
        if length >= COLLECT_ABOVE_BYTES:
            gc.collect()
        return self.get_response(request)
