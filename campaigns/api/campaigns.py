"""Templates and campaigns: `/api/v1/templates`, `/api/v1/campaigns` and their actions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError
from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import (
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns import lifecycle
from campaigns.exceptions import CampaignStateError, InvalidSchedule
from campaigns.models import Campaign, Contact, ContactList, Segment, Template
from campaigns.reporting import campaign_report
from campaigns.services import compile_template, contact_context
from core import api_input, limits
from core.api_schema import error_response
from core.validators import ONE_LINE, validate_mailbox


class TemplateSerializer(api_input.ModelSerializer):
    # One line (Template.clean says so too; here the schema shows it as a pattern).
    subject = serializers.CharField(max_length=998, validators=[ONE_LINE])
    defaults = api_input.JSONObjectField(
        required=False, help_text="values for variables a recipient has none for"
    )

    class Meta:
        model = Template
        fields = ["id", "name", "subject", "html", "text", "defaults", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The template rules are the model's (Template.clean, which the admin runs too), checked
        # on the template as this request would leave it.
        content = {f: attrs.get(f, getattr(self.instance, f, "")) or "" for f in ("subject", "html", "text")}
        try:
            Template(**content).clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return attrs


class ProgressSerializer(api_input.Serializer):
    """A campaign's counters (campaigns.progress), as `progress` shows them."""

    total = serializers.IntegerField(help_text="messages fanned out so far (the audience once done)")
    queued = serializers.IntegerField()
    sent = serializers.IntegerField()
    failed = serializers.IntegerField()
    suppressed = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    excluded = serializers.IntegerField(help_text="list members left out (suppressed, unsubscribed)")
    fanout_done = serializers.BooleanField()
    percent_done = serializers.FloatField(min_value=0, max_value=100)


AUDIENCE_HELP = {
    "contact_list": "the list mailed; with `segment`, only its members that match the segment",
    "segment": "the segment mailed (its filter as it is when the campaign is scheduled); "
    "with `contact_list`, narrowed to that list's members",
}


class CampaignSerializer(api_input.OneOfRequiredMixin, api_input.ModelSerializer):
    one_of_required = ("contact_list", "segment")
    template = serializers.SlugRelatedField(slug_field="name", queryset=Template.objects.all())
    contact_list = serializers.PrimaryKeyRelatedField(
        queryset=ContactList.objects.all(),
        required=False,
        allow_null=True,
        help_text=AUDIENCE_HELP["contact_list"],
    )
    segment = serializers.PrimaryKeyRelatedField(
        queryset=Segment.objects.all(), required=False, allow_null=True, help_text=AUDIENCE_HELP["segment"]
    )
    progress = serializers.SerializerMethodField()
    local_time = api_input.WallTimeField(read_only=True, allow_null=True)
    # The admin's form runs this field too (core.validators.ApiValidatedForm): an empty one is null.
    tags = api_input.TagsField(required=False, allow_null=True)

    class Meta:
        model = Campaign
        fields = [
            "id", "name", "template", "contact_list", "segment", "from_email", "priority", "status",
            "schedule_type", "scheduled_at", "local_date", "local_time", "past_time_policy", "progress", "created_at", "started_at", "completed_at",
            "window_start", "window_hours", "holdout_percent",
            "track_opens", "track_clicks",  # opt-ins (docs/delivery.md, "Tracking")
            "tags",  # carried by its messages in the API and on their events
        ]  # fmt: skip
        read_only_fields = [
            "id",
            "status",
            "schedule_type",
            "scheduled_at",
            "local_date",
            "local_time",
            "past_time_policy",
            "window_start",
            "window_hours",
            "holdout_percent",
            "created_at",
            "started_at",
            "completed_at",
        ]

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, campaign: Campaign) -> dict[str, Any]:
        return {
            "total": campaign.total_count,
            "queued": campaign.queued_count,
            "sent": campaign.sent_count,
            "failed": campaign.failed_count,
            "suppressed": campaign.suppressed_count,
            "cancelled": campaign.cancelled_count,
            "excluded": campaign.excluded_count,
            "fanout_done": campaign.fanout_done,
            "percent_done": campaign.percent_done,
        }

    def validate_tags(self, value: list[str] | None) -> list[str] | None:
        return value or None  # none stored as NULL, as a message's

    def to_representation(self, instance: Campaign) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        return {**data, "tags": data.get("tags") or []}

    def validate_from_email(self, value: str) -> str:
        return validate_mailbox(value, allow_blank=True)

    def update(self, instance: Campaign, validated_data: dict[str, Any]) -> Campaign:
        return lifecycle.update_draft(instance.pk, validated_data)


def schedule_validated(
    campaign_id: int, data: dict[str, Any], *, unchanged_since: datetime | None = None
) -> Campaign:
    """lifecycle.schedule with what a valid ScheduleSerializer holds (the API's view and the
    admin's Schedule page)."""
    return lifecycle.schedule(
        campaign_id,
        data["type"],
        data.get("scheduled_at"),
        local_date=data.get("local_date"),
        local_time=data.get("local_time"),
        past_time_policy=data.get("past_time_policy"),
        window_start=data.get("window_start"),
        window_hours=data.get("window_hours"),
        holdout_percent=data.get("holdout_percent"),
        unchanged_since=unchanged_since,
    )


class ScheduleSerializer(api_input.Serializer):
    type = serializers.ChoiceField(choices=Campaign.ScheduleType.choices)
    scheduled_at = serializers.DateTimeField(required=False)
    local_date = serializers.DateField(required=False)
    local_time = api_input.WallTimeField(required=False)
    past_time_policy = serializers.ChoiceField(choices=Campaign.PastTimePolicy.choices, required=False)
    # `optimized` (ranges checked by lifecycle.check_schedule, with the field named).
    window_start = serializers.DateTimeField(required=False)
    window_hours = serializers.IntegerField(required=False)
    holdout_percent = serializers.IntegerField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:  # the rule is lifecycle's, which schedule() applies again
            lifecycle.check_schedule(
                attrs["type"],
                attrs.get("scheduled_at"),
                attrs.get("local_date"),
                attrs.get("local_time"),
                window_start=attrs.get("window_start"),
                window_hours=attrs.get("window_hours"),
                holdout_percent=attrs.get("holdout_percent"),
            )
        except InvalidSchedule as exc:
            raise serializers.ValidationError(
                {f: [ErrorDetail(m, code=exc.codes.get(f, "invalid"))] for f, m in exc.errors.items()}
            ) from None
        return attrs


def _schedule_variant(
    name: str, schedule_type: str, **fields: serializers.Field
) -> type[api_input.Serializer]:
    fields = {"type": serializers.ChoiceField(choices=[schedule_type]), **fields}
    return type(name, (api_input.Serializer,), fields)


# The body of POST …/schedule as the docs show it: one shape per `type` (a discriminated oneOf).
# ScheduleSerializer and lifecycle.check_schedule are what validate it.
SCHEDULE_REQUEST = PolymorphicProxySerializer(
    component_name="Schedule",  # "ScheduleRequest" once split (COMPONENT_SPLIT_REQUEST)
    resource_type_field_name="type",
    serializers={
        "immediate": _schedule_variant("ScheduleImmediate", "immediate"),
        "at": _schedule_variant(
            "ScheduleAt", "at", scheduled_at=serializers.DateTimeField(help_text="a future instant")
        ),
        "local_time": _schedule_variant(
            "ScheduleLocalTime",
            "local_time",
            local_date=serializers.DateField(),
            local_time=api_input.WallTimeField(),
            past_time_policy=serializers.ChoiceField(
                choices=Campaign.PastTimePolicy.choices,
                required=False,
                help_text="for recipients whose local time has passed (default next_day)",
            ),
        ),
        "optimized": _schedule_variant(
            "ScheduleOptimized",
            "optimized",
            window_start=serializers.DateTimeField(required=False, help_text="default: now"),
            window_hours=serializers.IntegerField(
                required=False, min_value=lifecycle.WINDOW_HOURS[0], max_value=lifecycle.WINDOW_HOURS[1]
            ),
            holdout_percent=serializers.IntegerField(
                required=False,
                min_value=lifecycle.HOLDOUT_PERCENT[0],
                max_value=lifecycle.HOLDOUT_PERCENT[1],
            ),
        ),
    },
)

# The 409 of every state change on a campaign.
CAMPAIGN_STATE_CONFLICT = error_response(
    409, "the campaign's status does not allow this (the message says which)"
)


def _conflict(exc: Exception) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


class TemplateList(generics.ListCreateAPIView):
    queryset = Template.objects.all()
    serializer_class = TemplateSerializer


@extend_schema_view(
    delete=extend_schema(
        responses={204: None, 409: error_response(409, "campaigns or messages use this template")}
    )
)
class TemplateDetail(generics.RetrieveUpdateDestroyAPIView):
    queryset = Template.objects.all()
    serializer_class = TemplateSerializer

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return super().destroy(request, *args, **kwargs)
        except ProtectedError:
            return _conflict(Exception("campaigns or messages use this template; it cannot be deleted"))


class PreviewSerializer(api_input.Serializer):
    contact = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="a contact's id"
    )
    context = api_input.JSONObjectField(  # type: ignore[assignment]  # see delivery.api.serializers
        required=False, default=dict, limits=(limits.CONTEXT_KEYS, limits.CONTEXT_BYTES)
    )


class TemplatePreview(APIView):
    """Render a template for one contact (`contact` id) or an ad-hoc `context`."""

    @extend_schema(
        request=PreviewSerializer,
        responses={
            200: inline_serializer(
                "PreviewResult",
                {
                    "subject": serializers.CharField(),
                    "html": serializers.CharField(allow_null=True),
                    "text": serializers.CharField(allow_null=True),
                },
            )
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        template = get_object_or_404(Template, pk=pk)
        params = PreviewSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        contact = None
        if params.validated_data.get("contact") is not None:
            contact = Contact.objects.filter(pk=params.validated_data["contact"]).first()
            if contact is None:
                return Response({"contact": ["no such contact"]}, status=status.HTTP_400_BAD_REQUEST)
        rendered = compile_template(template).render(
            contact_context(contact, params.validated_data["context"])
        )
        return Response({"subject": rendered.subject, "html": rendered.html, "text": rendered.text})


class CampaignList(generics.ListCreateAPIView):
    queryset = Campaign.objects.select_related("template")
    serializer_class = CampaignSerializer


@extend_schema_view(
    put=extend_schema(responses={200: CampaignSerializer, 409: CAMPAIGN_STATE_CONFLICT}),
    patch=extend_schema(responses={200: CampaignSerializer, 409: CAMPAIGN_STATE_CONFLICT}),
)
class CampaignDetail(generics.RetrieveUpdateAPIView):
    queryset = Campaign.objects.select_related("template")
    serializer_class = CampaignSerializer

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return super().update(request, *args, **kwargs)
        except CampaignStateError as exc:
            return _conflict(exc)


class CampaignAction(APIView):
    """`POST …/pause|resume|cancel` (no body): 200 with the campaign, 409 from the wrong state."""

    action = ""

    @extend_schema(request=None, responses={200: CampaignSerializer, 409: CAMPAIGN_STATE_CONFLICT})
    def post(self, request: Request, pk: int) -> Response:
        get_object_or_404(Campaign, pk=pk)
        try:
            if self.action == "schedule":
                params = ScheduleSerializer(data=request.data)
                params.is_valid(raise_exception=True)
                campaign = schedule_validated(pk, params.validated_data)
            else:
                campaign = getattr(lifecycle, self.action)(pk)
        except CampaignStateError as exc:
            return _conflict(exc)
        return Response(CampaignSerializer(campaign).data)


class CampaignSchedule(CampaignAction):
    """`POST …/schedule`: 200 with the campaign, 400 naming the field, 409 unless a draft."""

    action = "schedule"

    @extend_schema(
        request=SCHEDULE_REQUEST, responses={200: CampaignSerializer, 409: CAMPAIGN_STATE_CONFLICT}
    )
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class ReportHitsSerializer(api_input.Serializer):
    """Tracking hits by who made them (`unclassified`: recorded before classification existed)."""

    human = serializers.IntegerField()
    machine = serializers.IntegerField()
    proxy = serializers.IntegerField()
    bot = serializers.IntegerField()
    scanner = serializers.IntegerField()
    unclassified = serializers.IntegerField()


class ReportGroupSerializer(api_input.Serializer):
    sent = serializers.IntegerField()
    opened = serializers.IntegerField()
    open_rate = serializers.FloatField(allow_null=True)
    clicked = serializers.IntegerField()
    click_rate = serializers.FloatField(allow_null=True)


def _interval(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.FloatField(), min_length=2, max_length=2, allow_null=True, help_text=help_text
    )


class ReportRateLiftSerializer(api_input.Serializer):
    difference = serializers.FloatField(allow_null=True, help_text="optimized rate minus holdout rate")
    difference_ci95 = _interval("[low, high], Newcombe hybrid score")
    ratio = serializers.FloatField(allow_null=True)
    ratio_ci95 = _interval("[low, high], Katz log; null when a count is 0")


class ReportLiftSerializer(api_input.Serializer):
    holdout_percent = serializers.IntegerField()
    method = serializers.CharField()
    optimized = ReportGroupSerializer()
    holdout = ReportGroupSerializer()
    open_rate = ReportRateLiftSerializer()
    click_rate = ReportRateLiftSerializer()


class CampaignReportSerializer(api_input.Serializer):
    """campaigns.reporting.campaign_report: rates per message sent, human hits only."""

    campaign = serializers.IntegerField()
    schedule_type = serializers.ChoiceField(choices=Campaign.ScheduleType.choices)
    sent = serializers.IntegerField()
    delivered = serializers.IntegerField()
    opened = serializers.IntegerField()
    open_rate = serializers.FloatField(allow_null=True)
    clicked = serializers.IntegerField()
    click_rate = serializers.FloatField(allow_null=True)
    open_hits = ReportHitsSerializer()
    click_hits = ReportHitsSerializer()
    bounced = serializers.IntegerField()
    complained = serializers.IntegerField()
    unsubscribed = serializers.IntegerField()
    lift = ReportLiftSerializer(
        allow_null=True, help_text="optimized campaigns only: the lift over the holdout"
    )


class CampaignReport(APIView):
    """`GET …/report` (manage scope, the default): human open and click rates, every hit class
    counted apart, bounces, complaints, unsubscribes, and an optimized campaign's lift over its
    holdout with 95% intervals (campaigns.reporting)."""

    @extend_schema(responses={200: CampaignReportSerializer})
    def get(self, request: Request, pk: int) -> Response:
        return Response(campaign_report(get_object_or_404(Campaign, pk=pk)))


urlpatterns = [
    path("templates", TemplateList.as_view(), name="template-list"),
    path("templates/<int:pk>", TemplateDetail.as_view(), name="template-detail"),
    path("templates/<int:pk>/preview", TemplatePreview.as_view(), name="template-preview"),
    path("campaigns", CampaignList.as_view(), name="campaign-list"),
    path("campaigns/<int:pk>", CampaignDetail.as_view(), name="campaign-detail"),
    path("campaigns/<int:pk>/report", CampaignReport.as_view(), name="campaign-report"),
    path("campaigns/<int:pk>/schedule", CampaignSchedule.as_view(), name="campaign-schedule"),
    *[
        path(f"campaigns/<int:pk>/{action}", CampaignAction.as_view(action=action), name=f"campaign-{action}")
        for action in ("pause", "resume", "cancel")
    ],
]
