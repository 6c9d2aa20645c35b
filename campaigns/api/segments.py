"""Segments: `/api/v1/segments`, a segment's `count` and `sample`, and `preview` of an unsaved filter.

Writes and reads go through campaigns.segments (the one place a filter is validated, counted,
sampled, saved and deleted); this module only maps their refusals onto the API's errors:

- InvalidFilter: 400, `fields` keyed by the node's path under the field that held the filter
  (`filter.and[2].value`; the whole filter is `filter`). A refusal for a limit a setting holds
  (EMAILHUB_SEGMENT_MAX_BYTES, …_MAX_CONDITIONS, …_MAX_DEPTH) is `code: limit_exceeded` with
  `limit` naming the setting. A saved segment whose filter no longer passes (a limit lowered
  since it was saved, a campaign it names gone) is the segment's state, not the request's: 409.
- SegmentQueryTimeout: 422 with `limit` EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS.
- SegmentInUse: 409 naming the campaigns and recurring schedules that use the segment.

The filter's JSON Schema (campaigns.segment_schema) is registered as OpenAPI components by
`SegmentFilterFieldExtension`, so /api/schema/ documents the language node by node.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404
from django.urls import path
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns import segment_schema, segments
from campaigns.exceptions import Conflict, InvalidFilter, SegmentInUse, SegmentQueryTimeout
from campaigns.models import Contact, ContactList, Segment
from core import api_input
from core.api_errors import error_body
from core.api_json import LimitExceeded
from core.api_schema import error_response
from core.limits import Limit

SAMPLE_SIZE = 10  # contacts a sample shows unless asked (at most EMAILHUB_SEGMENT_SAMPLE_MAX)


# --- errors -------------------------------------------------------------------------------------


def query_timed_out(exc: SegmentQueryTimeout) -> Response:
    """The 422 of a count or sample stopped at EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS, in the one
    error shape with the setting as its `limit` (a Response: an app's exception classes live in
    its exceptions module)."""
    seconds = settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS
    limit = {
        "name": "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS",
        "value": int(seconds) if float(seconds).is_integer() else seconds,
    }
    return Response(
        error_body(422, str(exc), code="query_timeout", limit=limit),
        status=status.HTTP_422_UNPROCESSABLE_ENTITY,
    )


def _field_path(field: str, path: str) -> str:
    return f"{field}.{path}" if path else field


def filter_refused(exc: InvalidFilter, field: str = "filter") -> exceptions.APIException:
    """The 400 for a refused filter: each bad node by its path under `field`, with the limit's
    setting when a limit was hit."""
    fields = {_field_path(field, path): [message] for path, message in exc.errors.items()}
    if exc.limit is None:
        return serializers.ValidationError(fields)
    error = LimitExceeded(str(exc), limit=Limit(exc.limit).error_member())
    error.detail = fields  # type: ignore[assignment]  # the nodes at fault, as any 400 names them
    return error


@contextmanager
def refusals() -> Iterator[None]:
    """campaigns.segments' refusals of a filter the request gave, as the API's errors."""
    try:
        yield
    except InvalidFilter as exc:
        raise filter_refused(exc) from None


@contextmanager
def saved_refusals(segment: Segment) -> Iterator[None]:
    """A saved segment's filter that no longer passes (a limit lowered since it was saved, a
    campaign it names gone) as a 409: the segment's state, not the request's fault."""
    try:
        yield
    except InvalidFilter as exc:
        raise Conflict(
            f"segment {segment.pk}'s filter no longer passes ({exc}); "
            f"change it with PATCH /api/v1/segments/{segment.pk}"
        ) from None


# --- the filter field and its schema ------------------------------------------------------------


class SegmentFilterField(serializers.JSONField):
    """A segment filter: any JSON here, checked by campaigns.segments (which names each bad
    node's path); the schema is campaigns.segment_schema's."""


class SegmentFilterFieldExtension(OpenApiSerializerFieldExtension):
    """Registers the filter language's components and points the field at `SegmentFilter`."""

    target_class = SegmentFilterField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        for name, schema in segment_schema.components().items():
            auto_schema.registry.register_on_missing(
                ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema)
            )
        return {"$ref": f"#/components/schemas/{segment_schema.FILTER}"}


# --- serializers --------------------------------------------------------------------------------


class SegmentSerializer(api_input.ClosedModelSerializer):
    filter = SegmentFilterField(help_text="the filter (see the SegmentFilter schema)")

    class Meta:
        model = Segment
        fields = ["id", "name", "description", "filter", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def create(self, validated_data: dict[str, Any]) -> Segment:
        with _name_taken():
            return segments.create(**validated_data)

    def update(self, instance: Segment, validated_data: dict[str, Any]) -> Segment:
        with _name_taken():
            return segments.update(instance.pk, validated_data)


@contextmanager
def _name_taken() -> Iterator[None]:
    try:
        with transaction.atomic():
            yield
    except IntegrityError:  # another request took the name between validation and save
        raise serializers.ValidationError({"name": ["a segment has this name already"]}) from None


def _sample_max() -> int:
    return int(settings.EMAILHUB_SEGMENT_SAMPLE_MAX)


def _sample_size(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1,
        validators=[
            MaxValueValidator(_sample_max, message="at most %(limit_value)s (EMAILHUB_SEGMENT_SAMPLE_MAX)")
        ],
        **kwargs,
    )


class AudienceParameters(api_input.QueryParameters):
    contact_list = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=segment_schema.ID_MAX,
        help_text="only this list's members",
    )

    def validate_contact_list(self, value: int) -> int:
        if not ContactList.objects.filter(pk=value).exists():
            raise serializers.ValidationError(f"there is no list {value}")
        return value


class SampleParameters(AudienceParameters):
    size = _sample_size(
        required=False,
        help_text=f"how many contacts (default {SAMPLE_SIZE}; at most EMAILHUB_SEGMENT_SAMPLE_MAX)",
    )


class SegmentPreviewSerializer(api_input.ClosedSerializer):
    filter = SegmentFilterField(help_text="the filter to try (see the SegmentFilter schema)")
    contact_list = api_input.ObjectIdField(
        queryset=ContactList.objects.all(),
        required=False,
        allow_null=True,
        help_text="only this list's members",
    )
    sample_size = _sample_size(
        required=False,
        help_text=f"how many contacts to show (default {SAMPLE_SIZE}; at most EMAILHUB_SEGMENT_SAMPLE_MAX)",
    )


class SegmentContactSerializer(api_input.Serializer):
    """A contact of a sample (only active, unsuppressed contacts are in an audience)."""

    id = serializers.IntegerField()
    email = serializers.CharField()
    name = serializers.CharField()
    timezone = serializers.CharField()
    # An audience holds active contacts only (campaigns.segment_sql.AUDIENCE_SQL).
    status = serializers.ChoiceField(choices=[Contact.Status.ACTIVE])
    attributes = serializers.DictField()
    created_at = serializers.DateTimeField()


class SegmentCountSerializer(api_input.Serializer):
    count = serializers.IntegerField(help_text="contacts in the audience now (active, not suppressed)")
    as_of = serializers.DateTimeField(help_text="the instant relative windows end at")


class SegmentSampleSerializer(api_input.Serializer):
    contacts = SegmentContactSerializer(many=True, help_text="the first contacts by id")


class SegmentPreviewResultSerializer(api_input.Serializer):
    count = serializers.IntegerField(help_text="contacts in the audience now (active, not suppressed)")
    sample = SegmentContactSerializer(many=True, help_text="the first contacts by id")
    as_of = serializers.DateTimeField(help_text="the instant relative windows end at")


# --- views --------------------------------------------------------------------------------------

QUERY_TIMEOUT = error_response(
    422, "the query ran longer than EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS and was stopped (`limit`)"
)
FILTER_NO_LONGER_PASSES = error_response(
    409, "the saved filter no longer passes (a limit lowered since it was saved, a campaign it names gone)"
)


def _query(request: Request, parameters: type[serializers.Serializer]) -> dict[str, Any]:
    query = parameters(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data


class SegmentList(generics.ListCreateAPIView):
    queryset = Segment.objects.all()
    serializer_class = SegmentSerializer

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        with refusals():
            serializer.save()


class SegmentDetail(generics.RetrieveUpdateDestroyAPIView):
    queryset = Segment.objects.all()
    serializer_class = SegmentSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        with refusals():
            serializer.save()

    @extend_schema(
        responses={204: None, 409: error_response(409, "a campaign or recurring schedule uses this segment")}
    )
    def delete(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().delete(request, *args, **kwargs)

    def perform_destroy(self, instance: Segment) -> None:
        try:
            segments.delete(instance)
        except SegmentInUse as exc:
            raise Conflict(str(exc)) from None


class SegmentCount(APIView):
    """How many contacts the segment matches now (optionally among a list's members)."""

    @extend_schema(
        parameters=[AudienceParameters],
        responses={200: SegmentCountSerializer, 409: FILTER_NO_LONGER_PASSES, 422: QUERY_TIMEOUT},
    )
    def get(self, request: Request, pk: int) -> Response:
        segment = get_object_or_404(Segment, pk=pk)
        query = _query(request, AudienceParameters)
        as_of = timezone.now()
        try:
            with saved_refusals(segment):
                count = segments.count(segment.filter, list_id=query.get("contact_list"), anchor=as_of)
        except SegmentQueryTimeout as exc:
            return query_timed_out(exc)
        return Response(SegmentCountSerializer({"count": count, "as_of": as_of}).data)


class SegmentSample(APIView):
    """The segment's first contacts by id (optionally among a list's members)."""

    @extend_schema(
        parameters=[SampleParameters],
        responses={200: SegmentSampleSerializer, 409: FILTER_NO_LONGER_PASSES, 422: QUERY_TIMEOUT},
    )
    def get(self, request: Request, pk: int) -> Response:
        segment = get_object_or_404(Segment, pk=pk)
        query = _query(request, SampleParameters)
        size = query.get("size", min(SAMPLE_SIZE, _sample_max()))
        try:
            with saved_refusals(segment):
                contacts = segments.sample(segment.filter, size=size, list_id=query.get("contact_list"))
        except SegmentQueryTimeout as exc:
            return query_timed_out(exc)
        return Response(SegmentSampleSerializer({"contacts": contacts}).data)


class SegmentPreview(APIView):
    """Count and sample a filter without saving it: what a segment of it would match now."""

    @extend_schema(
        request=SegmentPreviewSerializer,
        responses={200: SegmentPreviewResultSerializer, 422: QUERY_TIMEOUT},
    )
    def post(self, request: Request) -> Response:
        body = SegmentPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        contact_list = data.get("contact_list")
        list_id = contact_list.pk if contact_list is not None else None
        size = data.get("sample_size") or min(SAMPLE_SIZE, _sample_max())
        as_of = timezone.now()
        try:
            with refusals():
                count, sample = segments.preview(data["filter"], size=size, list_id=list_id, anchor=as_of)
        except SegmentQueryTimeout as exc:
            return query_timed_out(exc)
        result = {"count": count, "sample": sample, "as_of": as_of}
        return Response(SegmentPreviewResultSerializer(result).data)


urlpatterns = [
    path("segments", SegmentList.as_view(), name="segment-list"),
    path("segments/preview", SegmentPreview.as_view(), name="segment-preview"),
    path("segments/<int:pk>", SegmentDetail.as_view(), name="segment-detail"),
    path("segments/<int:pk>/count", SegmentCount.as_view(), name="segment-count"),
    path("segments/<int:pk>/sample", SegmentSample.as_view(), name="segment-sample"),
]
