"""Content negotiation for API views whose answer does not depend on the client's Accept header.

DRF picks a renderer from `Accept` and answers 406 when none matches. Two views must not: the
CSV download (`GET /imports/{id}/rejections.csv` streams CSV itself, so `Accept: text/csv` was a
406 because the only renderer is JSON's) and the provider webhooks (a provider that sends an odd
Accept would get a 406 and retry the batch forever). Their errors are still JSON in the one shape.
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class IgnoreAccept(DefaultContentNegotiation):
    """DRF's negotiation, but the renderer is the view's first (JSON) whatever `Accept` says."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type
