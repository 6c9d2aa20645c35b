from __future__ import annotations

from collections.abc import Callable

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
    CancelCarryingSerializer,
    CancelReportSerializer,
    EmailEventSerializer,
    EventFilterSerializer,
    MessageCreateSerializer,
    MessageFilterSerializer,
    MessageRescheduleSerializer,
    MessageSerializer,
    new_message,
)
from delivery.api.serializing import represented, validated
from delivery.exceptions import IdempotencyConflict, MessageNotChangeable
from delivery.models import ApiKey, ApiKeyScope, EmailEvent, Message
from delivery.permissions import request_key
from delivery.selectors import (
    events_matching,
    events_of,
    messages_tagged,
    messages_visible_to,
    provider_chains,
    provider_health,
)
from delivery.services import message_changes
from delivery.services.messages import accept_message, request_fingerprint

IDEMPOTENCY_HEADER = "Idempotency-Key"


class MessageListView(mixins.ListModelMixin, generics.GenericAPIView):
    # Sending and reading one's own mail are an application's scopes; `manage` reads everyone's.
    required_scopes = {"POST": (ApiKeyScope.SEND,), "GET": (ApiKeyScope.READ, ApiKeyScope.MANAGE)}
    serializer_class = MessageSerializer

    def get_queryset(self) -> QuerySet[Message]:
        messages = messages_visible_to(request_key(self.request))
        filters = MessageFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        if "tag" in filters.validated_data:
            messages = messages_tagged(messages, filters.validated_data["tag"])
        return messages

    @extend_schema(parameters=[MessageFilterSerializer])
    def get(self, request: Request) -> Response:
        """The key's own messages, newest first (every key's with `manage`); `tag` narrows them
        to those carrying it."""
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
            OpenApiExample(
                "A reminder to cancel by its tag, with copies and headers",
                {
                    "to": "ada@example.com",
                    "cc": ["team@example.com"],
                    "bcc": ["audit@example.com"],
                    "template": "finish-signup",
                    "send_at": "2026-12-07T09:00:00Z",
                    "tags": ["reminder:user-42", "signup"],
                    "metadata": {"user_id": "42"},
                    "headers": {"X-Entity-Ref-ID": "signup-42"},
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


# The 409 of a cancel or a reschedule that comes too late.
NOT_CHANGEABLE = error_response(
    409, "the message was handed to a provider or is finished (the message says its status)"
)


def _changed(request: Request, message_id: int, change: Callable[[Message], Message]) -> Response:
    """`change` applied to the key's message `message_id` (404 if it may not see it): 200 with
    the message as it is now, or the 409 of a change that came too late."""
    message = get_object_or_404(messages_visible_to(request_key(request)), pk=message_id)
    try:
        message = change(message)
    except MessageNotChangeable as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(MessageSerializer(message).data)


class MessageDetailView(APIView):
    # Rescheduling one's own message is the sending application's; `manage` may move any.
    required_scopes = {
        "GET": (ApiKeyScope.READ, ApiKeyScope.MANAGE),
        "PATCH": (ApiKeyScope.SEND, ApiKeyScope.MANAGE),
    }

    @extend_schema(responses={200: MessageSerializer})
    def get(self, request: Request, message_id: int) -> Response:
        message = get_object_or_404(messages_visible_to(request_key(request)), pk=message_id)
        return Response(MessageSerializer(message).data)

    @extend_schema(
        request=MessageRescheduleSerializer,
        responses={200: MessageSerializer, 409: NOT_CHANGEABLE},
        examples=[
            OpenApiExample("Send tomorrow instead", {"send_at": "2026-12-07T09:00:00Z"}, request_only=True)
        ],
    )
    def patch(self, request: Request, message_id: int) -> Response:
        """Reschedule a message that has not been handed to a provider (`scheduled`, `queued`,
        `retry_wait`): a future `send_at` schedules it then (its old due instant never fires
        it); now or past queues it at once."""
        send_at = validated(MessageRescheduleSerializer, request.data)["send_at"]
        return _changed(request, message_id, lambda message: message_changes.reschedule(message, send_at))


class MessageCancelView(APIView):
    required_scopes = {"POST": (ApiKeyScope.SEND, ApiKeyScope.MANAGE)}

    @extend_schema(
        operation_id="v1_messages_cancel_one",
        request=None,
        responses={200: MessageSerializer, 409: NOT_CHANGEABLE},
    )
    def post(self, request: Request, message_id: int) -> Response:
        """Cancel a message that has not been handed to a provider: it is never sent. Cancelling
        a cancelled message again answers 200; one `sending`, sent or otherwise finished is a 409
        naming its status."""
        return _changed(request, message_id, message_changes.cancel_message)


class MessageCancelCarryingView(APIView):
    required_scopes = {"POST": (ApiKeyScope.SEND, ApiKeyScope.MANAGE)}

    @extend_schema(
        operation_id="v1_messages_cancel_carrying",
        request=CancelCarryingSerializer,
        responses={200: CancelReportSerializer},
        examples=[
            OpenApiExample("The user completed the action", {"tag": "reminder:user-42"}, request_only=True),
            OpenApiExample(
                "By the Idempotency-Key it was sent with",
                {"idempotency_key": "order-1234"},
                request_only=True,
            ),
            OpenApiExample(
                "Report", {"cancelled": 2, "already_cancelled": 0, "past_cancelling": 1}, response_only=True
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        """Cancel every message of the calling key that carries `tag` (or was accepted under
        `idempotency_key`) and has not been handed to a provider, in one statement however many
        match; answers how many moved, how many were cancelled before, and how many were past
        cancelling. Other keys' messages are never touched (not even with `manage`)."""
        data = validated(CancelCarryingSerializer, request.data)
        report = message_changes.cancel_carrying(request_key(request), **data)
        return Response(CancelReportSerializer(report).data)


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
