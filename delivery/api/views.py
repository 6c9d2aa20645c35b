from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import generics, mixins, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_schema import error_response
from delivery.api.schemas import ProviderHealthSerializer
from delivery.api.serializers import (
    EmailEventSerializer,
    EventFilterSerializer,
    MessageCreateSerializer,
    MessageSerializer,
    new_message,
)
from delivery.api.serializing import represented, validated
from delivery.exceptions import IdempotencyConflict
from delivery.models import ApiKey, ApiKeyScope, EmailEvent, Message
from delivery.permissions import request_key
from delivery.selectors import (
    events_matching,
    events_of,
    messages_visible_to,
    provider_chains,
    provider_health,
)
from delivery.services.messages import accept_message, request_fingerprint

IDEMPOTENCY_HEADER = "Idempotency-Key"


class MessageListView(mixins.ListModelMixin, generics.GenericAPIView):
    # Sending and reading one's own mail are an application's scopes; `manage` reads everyone's.
    required_scopes = {"POST": (ApiKeyScope.SEND,), "GET": (ApiKeyScope.READ, ApiKeyScope.MANAGE)}
    serializer_class = MessageSerializer

    def get_queryset(self) -> QuerySet[Message]:
        return messages_visible_to(request_key(self.request))

    def get(self, request: Request) -> Response:
        """The key's own messages, newest first (every key's with `manage`)."""
        return self.list(request)

    @extend_schema(
        request=MessageCreateSerializer,
        responses={
            202: MessageSerializer,
            422: error_response(422, f"the {IDEMPOTENCY_HEADER} was used before with another body"),
        },
        examples=[
            OpenApiExample(
                "Content in the request",
                {
                    "to": "ada@example.com",
                    "subject": "Your code",
                    "text": "Your code is 123456",
                    "priority": "critical",
                },
                request_only=True,
            ),
            OpenApiExample(
                "From a template",
                {
                    "to": "ada@example.com",
                    "template": "welcome",
                    "context": {"name": "Ada"},
                    "priority": "high",
                },
                request_only=True,
            ),
        ],
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                {"type": "string", "minLength": 1, "maxLength": 255},
                OpenApiParameter.HEADER,
                description="retry safely: the same key and body answer the first message again",
            ),
            OpenApiParameter(
                "Idempotent-Replayed",
                {"type": "string", "enum": ["true"]},
                OpenApiParameter.HEADER,
                response=[202],
                description="present when the message was accepted before under this key",
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        idempotency_key = request.headers.get(IDEMPOTENCY_HEADER)
        if idempotency_key is not None and not (0 < len(idempotency_key) <= 255):
            return Response(
                {IDEMPOTENCY_HEADER: ["must be between 1 and 255 characters"]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        data = validated(MessageCreateSerializer, request.data)
        new = new_message(data)
        try:
            message, created = accept_message(
                new,
                api_key=request.auth if isinstance(request.auth, ApiKey) else None,
                idempotency_key=idempotency_key,
                # Only a keyed request is ever compared with an earlier one.
                fingerprint=request_fingerprint(request.data) if idempotency_key is not None else None,
            )
        except IdempotencyConflict as exc:
            return Response({IDEMPOTENCY_HEADER: [str(exc)]}, status=status.HTTP_422_UNPROCESSABLE_ENTITY)
        response = Response(represented(MessageSerializer, message), status=status.HTTP_202_ACCEPTED)
        if not created:
            response["Idempotent-Replayed"] = "true"
        return response


class MessageDetailView(APIView):
    required_scopes = {"GET": (ApiKeyScope.READ, ApiKeyScope.MANAGE)}

    @extend_schema(responses={200: MessageSerializer})
    def get(self, request: Request, message_id: int) -> Response:
        message = get_object_or_404(messages_visible_to(request_key(request)), pk=message_id)
        return Response(MessageSerializer(message).data)


class ProviderHealthView(APIView):
    """Circuit state, failures, last error and send-rate tokens of every configured provider."""

    @extend_schema(responses={200: ProviderHealthSerializer})
    def get(self, request: Request) -> Response:
        return Response({"chains": provider_chains(), "providers": provider_health()})


class MessageEventsView(mixins.ListModelMixin, generics.GenericAPIView):
    """What providers and recipients reported about one message, newest first (cursor pages)."""

    # The same rule as the message itself: a key reads its own messages' events (another key's
    # message is a 404), `manage` reads every message's.
    required_scopes = {"GET": (ApiKeyScope.READ, ApiKeyScope.MANAGE)}
    serializer_class = EmailEventSerializer

    def get_queryset(self) -> QuerySet[EmailEvent]:
        visible = messages_visible_to(request_key(self.request))
        return events_of(get_object_or_404(visible, pk=self.kwargs["message_id"]))

    def get(self, request: Request, message_id: int) -> Response:
        return self.list(request)


class EventListView(mixins.ListModelMixin, generics.GenericAPIView):
    """Every event, newest first, keyset-paginated by id (`cursor`); `manage` scope only (events
    of campaign mail belong to no application key)."""

    serializer_class = EmailEventSerializer

    def get_queryset(self) -> QuerySet[EmailEvent]:
        filters = EventFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return events_matching(filters.validated_data)

    @extend_schema(parameters=[EventFilterSerializer])
    def get(self, request: Request) -> Response:
        return self.list(request)
