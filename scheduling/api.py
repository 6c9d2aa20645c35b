"""`/api/v1/recurring-schedules` and the schedule dashboard `GET /api/v1/schedules`."""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns.models import Campaign, ContactList, Template
from core.validators import validate_mailbox
from scheduling import recurring
from scheduling.models import RecurringSchedule
from scheduling.selectors import schedules_page


class RecurringScheduleSerializer(serializers.ModelSerializer):
    template = serializers.SlugRelatedField(slug_field="name", queryset=Template.objects.all())
    contact_list = serializers.PrimaryKeyRelatedField(queryset=ContactList.objects.all())
    # `timezone` comes from the model field, with its validator (the one timezone rule).
    schedule_type = serializers.ChoiceField(
        choices=[Campaign.ScheduleType.IMMEDIATE], default=Campaign.ScheduleType.IMMEDIATE
    )

    class Meta:
        model = RecurringSchedule
        fields = [
            "id", "name", "cron", "timezone", "template", "contact_list", "priority", "schedule_type",
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
        return recurring.update_schedule(instance.pk, validated_data)


class RecurringScheduleList(generics.ListCreateAPIView):
    queryset = RecurringSchedule.objects.select_related("template")
    serializer_class = RecurringScheduleSerializer


class RecurringScheduleDetail(generics.RetrieveUpdateDestroyAPIView):
    queryset = RecurringSchedule.objects.select_related("template")
    serializer_class = RecurringScheduleSerializer


class ScheduleDashboard(APIView):
    """Schedules (recurring and one-off) with next/last run and pending messages, and a snapshot
    of every priority queue in messages: pending (`queued`, plus due but not yet dispatched)
    and processing (`sending`)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("type", str, enum=["recurring", "scheduled"]),
            OpenApiParameter("status", str),
            OpenApiParameter("page", int),
            OpenApiParameter("page_size", int),
        ],
        responses={200: dict},
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
