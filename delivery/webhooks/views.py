"""`POST /api/v1/webhooks/{provider}`: the one view every provider webhook is served by."""

from __future__ import annotations

import logging

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import metrics
from core.api_negotiation import IgnoreAccept
from delivery.api.schemas import WebhookResultSerializer
from delivery.webhooks import (
    ForgedWebhook,
    InvalidWebhook,
    Webhook,
    WebhookRequest,
    WebhookTooLarge,
    WebhookUnavailable,
    get_webhook,
)

logger = logging.getLogger(__name__)


class SignatureIsTheAuth(BasePermission):
    """Providers hold no API key: the webhook's signature check (step 1 of `Webhook.handle`) is
    the authentication. Named here instead of an AllowAny so that nobody mistakes the open door
    for an accident, and so that `ApiKeyScopes` (the default) is explicitly not applied."""

    def has_permission(self, request: Request, view: object) -> bool:
        return True


class WebhookView(APIView):
    authentication_classes: list[type] = []  # no key, no session: hence no CSRF check either
    permission_classes = [SignatureIsTheAuth]
    parser_classes: list[type] = []  # the raw body is read, never DRF's parsed data
    content_negotiation_class = IgnoreAccept  # a provider's odd Accept is no reason to refuse (406)
    required_scopes: dict[str, tuple[str, ...]] = {"POST": ()}

    @extend_schema(
        request={
            "application/json": {
                "description": "SendGrid: an array of events; SES: an SNS message",
                "oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "object"}],
            },
            "text/plain": {"type": "string", "description": "SES: the SNS message's JSON, as SNS posts it"},
        },
        responses={
            200: OpenApiResponse(
                WebhookResultSerializer,
                description="events received: counts of new and duplicate events, and of those "
                "skipped because they cannot be used (the others are recorded)",
            ),
            400: OpenApiResponse(
                description="forged (signature, certificate URL, topic, SNS message-type header) "
                "or unreadable as a whole (not JSON, not the provider's array or object)"
            ),
            404: OpenApiResponse(description="no webhook for this provider"),
            413: OpenApiResponse(description="body beyond EMAILHUB_WEBHOOK_MAX_BODY_BYTES"),
            503: OpenApiResponse(
                description="the signature could not be checked now (a certificate "
                "fetch failed): the provider retries"
            ),
        },
        auth=[],
    )
    def post(self, request: Request, provider: str) -> Response:
        """A provider's event notification, authenticated by its signature on the raw body."""
        webhook = get_webhook(provider)
        if webhook is None:
            metrics.count_webhook_request("unknown", "unknown_provider")  # the path is anyone's
            raise exceptions.NotFound(f"no webhook for provider {provider!r}")
        try:
            response = self._handle(request, webhook)
        except WebhookTooLarge:
            metrics.count_webhook_request(webhook.name, "too_large")
            raise
        except ForgedWebhook:
            metrics.count_webhook_request(webhook.name, "forged")
            raise
        except InvalidWebhook:
            metrics.count_webhook_request(webhook.name, "invalid")
            raise
        except WebhookUnavailable:
            metrics.count_webhook_request(webhook.name, "unavailable")
            raise
        metrics.count_webhook_request(webhook.name, "accepted")
        return response

    def _handle(self, request: Request, webhook: Webhook) -> Response:
        """Size checks, then the webhook's steps (delivery/webhooks/base.py)."""
        provider = webhook.name
        limit = settings.EMAILHUB_WEBHOOK_MAX_BODY_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        # Refused before the body is read into memory (Django's own limit is the API's, larger).
        if declared > limit:
            raise WebhookTooLarge(limit)
        body = request.body  # Django's HttpRequest.body, through DRF's Request (no parser has read it)
        if len(body) > limit:
            raise WebhookTooLarge(limit)
        try:
            result = webhook.handle(WebhookRequest(body=body, headers=request.headers))
        except (ForgedWebhook, InvalidWebhook) as exc:
            logger.warning("webhook %s refused: %s", provider, exc.detail)
            raise
        return Response(result)
