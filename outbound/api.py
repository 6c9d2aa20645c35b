"""`/api/v1/webhook-endpoints`: an application's endpoints, their delivery log, secret rotation
and replays (routes in `urlpatterns`). Writes go through outbound.services.endpoints.

A key sees and changes its own endpoints; a `manage` key every one. Registering needs `send` or
`manage` (a `manage` key's endpoint hears of every key's mail and of campaigns); reading, any
scope.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns.exceptions import Conflict
from core import api_input
from core.api_schema import error_response
from core.outbound_events import TYPES
from core.validators import ONE_LINE
from delivery.models import ApiKey, ApiKeyScope
from outbound import selectors
from outbound.exceptions import BeingDelivered, NotReplayable, UnsafeUrl
from outbound.models import Attempt, Endpoint
from outbound.services import addresses, endpoints

_READ = (ApiKeyScope.READ, ApiKeyScope.SEND, ApiKeyScope.MANAGE)
_WRITE = (ApiKeyScope.SEND, ApiKeyScope.MANAGE)
_SCOPES = {"GET": _READ, "POST": _WRITE, "PATCH": _WRITE, "DELETE": _WRITE}


def _key(request: Request) -> ApiKey:
    if not isinstance(request.auth, ApiKey):
        raise exceptions.NotAuthenticated()
    return request.auth


class EndpointSerializer(api_input.ClosedModelSerializer):
    url = serializers.URLField(
        max_length=2000,
        help_text="https on a public address; no redirect is followed",
    )
    description = serializers.CharField(
        max_length=200, required=False, allow_blank=True, validators=[ONE_LINE]
    )
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=TYPES),
        required=False,
        max_length=len(TYPES),
        help_text="the event types to send; empty or absent: every type",
    )
    batch = serializers.BooleanField(
        required=False, help_text="true: up to 100 events per request, as a JSON array under one signature"
    )

    class Meta:
        model = Endpoint
        fields = [
            "id", "url", "description", "event_types", "batch", "enabled", "all_messages",
            "disabled_reason", "disabled_at", "failing_since", "previous_secret_until",
            "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = [
            "id", "all_messages", "disabled_reason", "disabled_at", "failing_since",
            "previous_secret_until", "created_at", "updated_at",
        ]  # fmt: skip

    def validate_url(self, value: str) -> str:
        try:
            addresses.check(value)
        except UnsafeUrl as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class CreatedEndpointSerializer(EndpointSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="whsec_…: shown this once; verify each request's webhook-signature with it"
    )

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]


class AttemptSerializer(api_input.ModelSerializer):
    webhook_id = serializers.CharField(source="delivery.webhook_id", read_only=True)
    event_ids = serializers.ListField(
        child=serializers.IntegerField(), source="delivery.event_ids", read_only=True
    )
    delivery_status = serializers.CharField(source="delivery.status", read_only=True)

    class Meta:
        model = Attempt
        fields = [
            "id", "delivery", "webhook_id", "event_ids", "delivery_status", "number", "attempted_at",
            "status_code", "succeeded", "latency_ms", "response", "error",
        ]  # fmt: skip
        read_only_fields = fields


class ReplaySerializer(api_input.ClosedSerializer):
    webhook_id = serializers.CharField(
        required=False,
        max_length=64,
        help_text="a request you received (its webhook-id header), sent again as it was",
    )
    event_id = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        help_text="one event (`evt_<event_id>`), sent again as it was (same webhook-id)",
    )
    since = serializers.DateTimeField(
        required=False, help_text="every delivery that failed and was created since"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if sum(name in attrs for name in ("webhook_id", "event_id", "since")) != 1:
            raise serializers.ValidationError(
                {"event_id": ["give exactly one of `webhook_id`, `event_id` or `since`"]}
            )
        return attrs


class EndpointListCreateView(generics.ListCreateAPIView):
    required_scopes = _SCOPES

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return CreatedEndpointSerializer if self.request.method == "POST" else EndpointSerializer

    def get_queryset(self) -> QuerySet[Endpoint]:
        return selectors.endpoints_for(_key(self.request))

    @extend_schema(
        request=EndpointSerializer,
        responses={201: CreatedEndpointSerializer},
        description=(
            "Register an endpoint: 201 with its `secret` (shown this once). Requests to it carry "
            "Standard Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`); "
            "verify them with any Standard Webhooks library and the secret."
        ),
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        given = EndpointSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        try:
            endpoint, secret = endpoints.create(_key(request), **given.validated_data)
        except UnsafeUrl as exc:  # the address changed since validation
            raise serializers.ValidationError({"url": [str(exc)]}) from None
        shown = CreatedEndpointSerializer(endpoint).data
        return Response({**shown, "secret": secret}, status=status.HTTP_201_CREATED)


class EndpointDetailView(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = EndpointSerializer
    required_scopes = _SCOPES
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Endpoint]:
        return selectors.endpoints_for(_key(self.request))

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        assert isinstance(serializer.instance, Endpoint)
        try:
            endpoints.update(serializer.instance, **serializer.validated_data)
        except UnsafeUrl as exc:
            raise serializers.ValidationError({"url": [str(exc)]}) from None


def _endpoint(request: Request, endpoint_id: int) -> Endpoint:
    return get_object_or_404(selectors.endpoints_for(_key(request)), pk=endpoint_id)


class AttemptListView(generics.ListAPIView):
    serializer_class = AttemptSerializer
    required_scopes = _SCOPES

    def get_queryset(self) -> QuerySet[Attempt]:
        endpoint = _endpoint(self.request, self.kwargs["pk"])
        return Attempt.objects.filter(endpoint=endpoint).select_related("delivery")


class RotateSecretView(APIView):
    required_scopes = _SCOPES

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer(
                "RotatedSecret",
                {"secret": serializers.CharField(), "previous_secret_until": serializers.DateTimeField()},
            )
        },
        description=(
            "A new secret, shown this once. The old one keeps signing for "
            "EMAILHUB_WEBHOOKS_SECRET_GRACE_SECONDS (default 24 h): meanwhile every request "
            "carries both signatures, so the receiver can switch without losing an event."
        ),
    )
    def post(self, request: Request, pk: int) -> Response:
        endpoint = _endpoint(request, pk)
        secret = endpoints.rotate_secret(endpoint)
        return Response({"secret": secret, "previous_secret_until": endpoint.previous_secret_until})


class ReplayView(APIView):
    required_scopes = _SCOPES

    @extend_schema(
        request=ReplaySerializer,
        responses={
            202: inline_serializer("Replayed", {"replayed": serializers.IntegerField()}),
            404: error_response(404, "the endpoint, or the event was never delivered to it"),
            409: error_response(409, "the event is being delivered to this endpoint right now"),
        },
        description=(
            "Send again a request you received (`webhook_id`) or one event (`event_id`, the number "
            "in `evt_<id>`), each as it was with its webhook-id, or every delivery that failed since "
            "a time (`since`). 202 with how many deliveries go again."
        ),
    )
    def post(self, request: Request, pk: int) -> Response:
        endpoint = _endpoint(request, pk)
        given = ReplaySerializer(data=request.data)
        given.is_valid(raise_exception=True)
        chosen = given.validated_data
        if "since" in chosen:
            replayed = endpoints.replay_failed(endpoint, chosen["since"])
        else:
            try:
                if "webhook_id" in chosen:
                    replayed = endpoints.replay_webhook(endpoint, chosen["webhook_id"])
                else:
                    replayed = endpoints.replay_event(endpoint, chosen["event_id"])
            except BeingDelivered as exc:
                raise Conflict(str(exc)) from None
            except NotReplayable as exc:
                raise exceptions.NotFound(str(exc)) from None
        return Response({"replayed": replayed}, status=status.HTTP_202_ACCEPTED)


urlpatterns = [
    path("webhook-endpoints", EndpointListCreateView.as_view(), name="webhook-endpoint-list"),
    path("webhook-endpoints/<int:pk>", EndpointDetailView.as_view(), name="webhook-endpoint-detail"),
    path("webhook-endpoints/<int:pk>/attempts", AttemptListView.as_view(), name="webhook-endpoint-attempts"),
    path(
        "webhook-endpoints/<int:pk>/rotate-secret", RotateSecretView.as_view(), name="webhook-endpoint-rotate"
    ),
    path("webhook-endpoints/<int:pk>/replay", ReplayView.as_view(), name="webhook-endpoint-replay"),
]
