"""`/api/v1/recurring-schedules` and the schedule dashboard `GET /api/v1/schedules`."""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns.exceptions import Conflict
from campaigns.models import Campaign, ContactList, Segment, Template
from core import api_input
from core.validators import validate_mailbox
from scheduling import recurring
from scheduling.exceptions import NoAudience
from scheduling.models import RecurringSchedule
from scheduling.selectors import schedules_page


class RecurringScheduleSerializer(api_input.OneOfRequiredMixin, api_input.ModelSerializer):
    one_of_required = ("contact_list", "segment")
    template = serializers.SlugRelatedField(slug_field="name", queryset=Template.objects.all())
    contact_list = serializers.PrimaryKeyRelatedField(
        queryset=ContactList.objects.all(),
        required=False,
        allow_null=True,
        help_text="the list mailed; with `segment`, only its members that match the segment",
    )
    segment = serializers.PrimaryKeyRelatedField(
        queryset=Segment.objects.all(),
        required=False,
        allow_null=True,
        help_text="the segment mailed (its filter as it is when each campaign starts); with `contact_list`, narrowed to that list's members",
    )
    # `timezone` comes from the model field, with its validator (the one timezone rule).
    schedule_type = serializers.ChoiceField(
        choices=[Campaign.ScheduleType.IMMEDIATE], default=Campaign.ScheduleType.IMMEDIATE
    )

    class Meta:
        model = RecurringSchedule
        fields = [
            "id", "name", "cron", "timezone", "template", "contact_list", "segment", "priority", "schedule_type",
            "from_email", "active", "last_run", "next_run", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "last_run", "next_run", "created_at", "updated_at"]

    def validate_from_email(self, value: str) -> str:
        return validate_mailbox(value, allow_blank=True)

    def validate_cron(self, value: str) -> str:
        return recurring.clean_cron(value)

    def create(self, validated_data: dict[str, Any]) -> RecurringSchedule:
        return recurring.create_schedule(RecurringSchedule(**validated_data))

    def update(self, instance: RecurringSchedule, validated_data: dict[str, Any]) -> RecurringSchedule:
        try:
            return recurring.update_schedule(instance.pk, validated_data)
        except NoAudience as exc:
            raise Conflict(str(exc)) from None


class RecurringScheduleList(generics.ListCreateAPIView):
    queryset = RecurringSchedule.objects.select_related("template")
    serializer_class = RecurringScheduleSerializer


class RecurringScheduleDetail(generics.RetrieveUpdateDestroyAPIView):
    queryset = RecurringSchedule.objects.select_related("template")
    serializer_class = RecurringScheduleSerializer


class QueueCountsSerializer(api_input.Serializer):
    pending = serializers.IntegerField(help_text="queued, plus due but not yet dispatched")
    processing = serializers.IntegerField(help_text="sending")


class QueueSnapshotSerializer(api_input.Serializer):
    """Messages per priority (scheduling.selectors.queue_snapshot)."""

    critical = QueueCountsSerializer()
    high = QueueCountsSerializer()
    normal = QueueCountsSerializer()
    low = QueueCountsSerializer()


class ScheduleRowSerializer(api_input.Serializer):
    id = serializers.CharField(help_text="`recurring-<id>` or `campaign-<id>`")
    campaign_id = serializers.IntegerField(allow_null=True)
    type = serializers.ChoiceField(choices=["recurring", "scheduled"])
    cron = serializers.CharField(allow_null=True)
    timezone = serializers.CharField(allow_null=True)
    scheduled_at = serializers.DateTimeField(allow_null=True)
    next_run = serializers.DateTimeField(allow_null=True)
    last_run = serializers.DateTimeField(allow_null=True)
    status = serializers.CharField(help_text="active/inactive (recurring), else the campaign's status")
    pending_count = serializers.IntegerField(
        allow_null=True,
        help_text="null: a scheduled segment campaign whose count ran past the segment query timeout",
    )


class ScheduleDashboardSerializer(api_input.Serializer):
    count = serializers.IntegerField()
    page = serializers.IntegerField()
    page_size = serializers.IntegerField()
    schedules = ScheduleRowSerializer(many=True)
    queue_snapshot = QueueSnapshotSerializer()


class ScheduleDashboard(APIView):
    """Schedules (recurring and one-off) with next/last run and pending messages, and a snapshot
    of every priority queue in messages: pending (`queued`, plus due but not yet dispatched)
    and processing (`sending`)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("type", str, enum=["recurring", "scheduled"]),
            OpenApiParameter(
                "status", str, description="active or inactive (recurring), a campaign status (scheduled)"
            ),
            OpenApiParameter("page", {"type": "integer", "minimum": 1, "default": 1}),
            OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}),
        ],
        responses={200: ScheduleDashboardSerializer},
    )
    def get(self, request: Request) -> Response:
        kind = request.query_params.get("type")
        if kind not in (None, "recurring", "scheduled"):
            return Response({"type": ["one of recurring, scheduled"]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            page = int(request.query_params.get("page", 1))
            page_size = int(request.query_params.get("page_size", 50))
            if page < 1 or not 1 <= page_size <= 500:
                raise ValueError
        except ValueError:
            return Response(
                {"page": ["page ≥ 1 and 1 ≤ page_size ≤ 500"]}, status=status.HTTP_400_BAD_REQUEST
            )
        return Response(
            schedules_page(
                kind=kind, status=request.query_params.get("status"), page=page, page_size=page_size
            )
        )


urlpatterns = [
    path("recurring-schedules", RecurringScheduleList.as_view(), name="recurring-list"),
    path("recurring-schedules/<int:pk>", RecurringScheduleDetail.as_view(), name="recurring-detail"),
    path("schedules", ScheduleDashboard.as_view(), name="schedules"),
]
