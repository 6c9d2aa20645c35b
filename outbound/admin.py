"""The operator's view of outbound webhooks: endpoints (edited through the API's validation, with
enable/disable, rotation and replay as actions), and the delivery log, read-only."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from core.admin import ReadOnlyAdmin, ZonedTimesMixin
from core.outbound_events import TYPES
from core.validators import ApiValidatedForm
from outbound.api import EndpointSerializer
from outbound.exceptions import NotReplayable, UnsafeUrl
from outbound.models import Attempt, Delivery, Endpoint
from outbound.services import delivering, endpoints


class EndpointForm(ApiValidatedForm):
    # The API's own checks (https, a public address, one line, known types): one rule, two doors.
    api_serializer = EndpointSerializer
    url = forms.URLField(max_length=2000, assume_scheme="https", help_text="https on a public address")
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="none ticked: every type",
    )

    class Meta:
        model = Endpoint
        fields = ["api_key", "url", "description", "event_types", "batch", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A change is measured against what the page showed (posted back as hidden initials),
        # not against the row when Save is pressed: else a page opened before a 410 disabled the
        # endpoint re-enabled it with its ticked box (save_model writes only changed_data).
        for field in self.fields.values():
            field.show_hidden_initial = True


@admin.action(description="Disable the selected endpoints")
def disable_endpoints(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    done = sum(
        endpoints.disable(pk, Endpoint.DISABLED_BY_OPERATOR) for pk in queryset.values_list("pk", flat=True)
    )
    modeladmin.message_user(request, f"disabled {done} endpoint(s)", messages.SUCCESS)


@admin.action(description="Enable the selected endpoints (what waited is sent)")
def enable_endpoints(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for endpoint in queryset.filter(enabled=False):
        endpoints.update(endpoint, enabled=True)
    modeladmin.message_user(request, "enabled", messages.SUCCESS)


@admin.action(description="Replay every delivery that failed in the last 7 days")
def replay_failed(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    since = timezone.now() - timedelta(days=7)
    replayed = sum(endpoints.replay_failed(endpoint, since) for endpoint in queryset)
    modeladmin.message_user(request, f"{replayed} failed delivery(ies) sent again", messages.SUCCESS)


@admin.action(description="Rotate the secret (the old one signs too for the grace period)")
def rotate_secrets(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for endpoint in queryset:
        secret = endpoints.rotate_secret(endpoint)
        modeladmin.message_user(
            request,
            format_html("Endpoint #{}'s new secret, shown this once: <code>{}</code>", endpoint.pk, secret),
            messages.WARNING,
        )


@admin.register(Endpoint)
class EndpointAdmin(ZonedTimesMixin):
    form = EndpointForm
    list_display = ("id", "url", "api_key", "enabled", "circuit", "batch", "failing_since", "disabled_reason")
    list_filter = ("enabled", "batch", "all_messages")
    search_fields = ("url", "description")
    readonly_fields = (
        "all_messages", "disabled_reason", "disabled_at", "failing_since", "previous_secret_until",
        "created_at", "updated_at",
    )  # fmt: skip
    actions = [enable_endpoints, disable_endpoints, replay_failed, rotate_secrets]

    def get_readonly_fields(self, request: HttpRequest, obj: Endpoint | None = None) -> Any:
        # An endpoint's key is chosen when it is added: what it hears of (all_messages) follows
        # from that key, and moving it to another would hand one key's feed to another.
        readonly = tuple(super().get_readonly_fields(request, obj))
        return (*readonly, "api_key") if obj is not None else readonly

    @admin.display(description="circuit")
    def circuit(self, endpoint: Endpoint) -> str:
        return delivering.circuit_state(endpoint.pk)

    def save_model(self, request: HttpRequest, obj: Endpoint, form: forms.ModelForm, change: bool) -> None:
        if change:
            changes = {name: form.cleaned_data[name] for name in form.changed_data}
            if changes.get("enabled") is False:
                changes["disabled_reason"] = Endpoint.DISABLED_BY_OPERATOR
            try:
                endpoints.update(Endpoint.objects.get(pk=obj.pk), **changes)
            except UnsafeUrl as exc:
                self.message_user(request, str(exc), messages.ERROR)
            return
        data = form.cleaned_data
        try:
            created, secret = endpoints.create(
                data["api_key"],
                data["url"],
                event_types=data.get("event_types") or [],
                batch=data.get("batch", False),
                description=data.get("description", ""),
                enabled=data.get("enabled", True),
            )
        except UnsafeUrl as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        obj.pk = created.pk
        self.message_user(
            request,
            format_html("The endpoint's secret, shown this once: <code>{}</code>", secret),
            messages.WARNING,
        )


class AttemptInline(admin.TabularInline):
    model = Attempt
    fields = ("number", "attempted_at", "status_code", "succeeded", "latency", "error", "response")
    readonly_fields = fields
    extra = 0
    can_delete = False

    @admin.display(description="latency")
    def latency(self, attempt: Attempt) -> str:
        return f"{attempt.latency_ms:.0f} ms"

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.action(description="Replay the selected deliveries (same webhook-id)", permissions=["operate"])
def replay_deliveries(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    replayed = 0
    for delivery in queryset.select_related("endpoint"):
        try:
            replayed += endpoints.replay_event(delivery.endpoint, delivery.event_ids[0])
        except NotReplayable as exc:  # said to the operator, the rest go on
            modeladmin.message_user(request, f"delivery {delivery.pk}: {exc}", messages.WARNING)
    modeladmin.message_user(request, f"{replayed} delivery(ies) sent again", messages.SUCCESS)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "webhook_id",
        "endpoint",
        "status",
        "attempts",
        "last_status_code",
        "due_at",
        "created_at",
    )
    list_filter = ("status",)
    search_fields = ("webhook_id",)
    list_select_related = ("endpoint",)
    show_full_result_count = False
    inlines = [AttemptInline]
    actions = [replay_deliveries]
    readonly_fields = ("payload",)

    @admin.display(description="what was sent")
    def payload(self, delivery: Delivery) -> str:
        # JSON as the receiver got it (a list's str() would be Python: quotes, None, True).
        shown = json.dumps(delivering.payload_preview(delivery.event_ids), indent=2, ensure_ascii=False)
        return format_html("<pre>{}</pre>", shown)


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "endpoint",
        "delivery",
        "number",
        "attempted_at",
        "status_code",
        "succeeded",
        "latency_ms",
    )
    list_filter = ("succeeded",)
    list_select_related = ("endpoint", "delivery")
    show_full_result_count = False
