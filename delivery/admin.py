from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from campaigns.models import Campaign
from core.admin import ReadOnlyAdmin, ZonedTimesMixin, zoned
from delivery.authentication import revoke_api_key
from delivery.models import ApiKey, ApiKeyScope, AttachmentContent, EmailEvent, Message
from delivery.selectors import feedback_rates_by_provider, provider_chains, provider_health
from delivery.services import operator
from delivery.services.operator import OperatorReport
from delivery.services.test_sends import is_test_send


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, verb: str, report: OperatorReport) -> None:
    if report.moved:
        modeladmin.message_user(request, f"{verb} {len(report.moved)} message(s)", messages.SUCCESS)
    for message_id, reason in sorted(report.skipped.items())[:50]:
        modeladmin.message_user(request, f"message {message_id} skipped: {reason}", messages.WARNING)
    if len(report.skipped) > 50:
        modeladmin.message_user(request, f"… and {len(report.skipped) - 50} more skipped", messages.WARNING)
    if not report.moved and not report.skipped:
        modeladmin.message_user(request, f"{verb} 0 message(s)", messages.WARNING)


@admin.action(description="Retry failed message(s): attempts restart at 0", permissions=["operate"])
def retry_failed_messages(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _report(
        modeladmin, request, "requeued", operator.retry_failed(list(queryset.values_list("pk", flat=True)))
    )


@admin.action(description="Cancel queued, scheduled or retry_wait message(s)", permissions=["operate"])
def cancel_messages(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _report(
        modeladmin,
        request,
        "cancelled",
        operator.cancel_messages(list(queryset.values_list("pk", flat=True))),
    )


class EmailEventInline(admin.TabularInline):
    """What providers and recipients reported about the message (read-only, newest first)."""

    model = EmailEvent
    fields = ("kind", "bounce", "provider", "recipient", "detail", "occurred_at", "provider_event_id")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class CampaignFilter(admin.SimpleListFilter):
    """`?campaign=<id>`, the link on a campaign's page. Its choices are the latest campaigns (a
    list of every campaign would be thousands of links), plus the one filtered on."""

    title = "campaign"
    parameter_name = "campaign"
    field = "campaign_id"
    shown = 15

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        chosen = self.value()
        rows = list(Campaign.objects.order_by("-id").values_list("id", "name")[: self.shown])
        if chosen and chosen.isdigit() and all(str(pk) != chosen for pk, _ in rows):
            rows += list(Campaign.objects.filter(pk=int(chosen)).values_list("id", "name"))
        return [(str(pk), f"{name} ({pk})") for pk, name in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        chosen = self.value()
        if not chosen:
            return queryset
        if not chosen.isdigit():
            return queryset.none()
        return queryset.filter(**{self.field: int(chosen)})


class EventCampaignFilter(CampaignFilter):
    field = "message__campaign_id"


class TestSendFilter(admin.SimpleListFilter):
    """Operators' test sends from the template page (delivery.services.test_sends)."""

    title = "test send"
    parameter_name = "test_send"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Test sends"), ("no", "Not test sends")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(test_send_by__isnull=False)
        if self.value() == "no":
            return queryset.filter(test_send_by__isnull=True)
        return queryset


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    actions = [retry_failed_messages, cancel_messages]
    inlines = [EmailEventInline]
    list_display = (
        "id", "to_email", "priority", "status", "provider", "attempts", "short_error", "campaign_link",
        "created_at", "sent_at",
    )  # fmt: skip
    list_filter = ("status", "priority", "provider", CampaignFilter, TestSendFilter)
    search_fields = ("=to_email", "=provider_message_id")
    raw_id_fields = ("campaign", "contact", "template", "api_key")
    # Counting a table of millions on every page is the slow part of the changelist.
    show_full_result_count = False
    list_select_related = False

    @admin.display(description="last error")
    def short_error(self, message: Message) -> str:
        error = message.last_error or ""
        return error if len(error) <= 80 else f"{error[:79]}…"

    @admin.display(description="campaign")
    def campaign_link(self, message: Message) -> str:
        if message.campaign_id is None:
            return "test send" if is_test_send(message) else "—"
        url = reverse("admin:campaigns_campaign_change", args=[message.campaign_id])
        return format_html('<a href="{}">{}</a>', url, message.campaign_id)


@admin.register(EmailEvent)
class EmailEventAdmin(ReadOnlyAdmin):
    """History written by delivery.services.events (webhooks, DSNs, unsubscribe links)."""

    list_display = ("id", "kind", "bounce", "provider", "recipient", "message", "detail", "occurred_at")
    list_filter = ("kind", "provider", "bounce", EventCampaignFilter)
    # `=recipient` is what the contact page links to (?recipient=…); lower-case, as stored.
    search_fields = ("=recipient", "=provider_event_id")
    raw_id_fields = ("message",)
    show_full_result_count = False


@admin.register(AttachmentContent)
class AttachmentContentAdmin(ReadOnlyAdmin):
    """Each distinct attachment content once (delivery.services.attachments); the bytes are not
    shown, only what identifies them. Messages name a content by its SHA-256."""

    list_display = ("sha256", "size", "created_at")
    fields = ("sha256", "size", "created_at")
    search_fields = ("=sha256",)
    show_full_result_count = False


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="send: POST messages; read: its own messages; manage: everything else and every key's messages",
    )

    class Meta:
        model = ApiKey
        fields = ("name", "scopes")


@admin.action(description="Revoke selected API keys (every process refuses them within the key cache time)")
def revoke_api_keys(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    revoked = [key for key in queryset if revoke_api_key(key)]
    modeladmin.message_user(
        request,
        f"revoked {len(revoked)} key(s); other processes refuse them within "
        f"{settings.EMAILHUB_API_KEY_CACHE_SECONDS:g} s",
        messages.SUCCESS if revoked else messages.WARNING,
    )


@admin.register(ApiKey)
class ApiKeyAdmin(ZonedTimesMixin):
    form = ApiKeyForm
    list_display = ("name", "prefix", "scope_list", "created_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix")
    # revoked_at is read-only: a Save must never un-revoke a key, and revoking is the action's
    # conditional UPDATE (the same service as `manage.py revoke_api_key`).
    readonly_fields = ("prefix", "created_at", "revoked_at")
    actions = (revoke_api_keys,)

    @admin.display(description="scopes")
    def scope_list(self, key: ApiKey) -> str:
        return ", ".join(key.scopes)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are made with `manage.py create_api_key`, which shows the key once

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # a key's messages name it; revoke it instead

    def save_model(self, request: HttpRequest, obj: ApiKey, form: forms.ModelForm, change: bool) -> None:
        # Write only what the operator changed, never the rest of a row read when the page opened.
        obj.save(update_fields=[f for f in form.changed_data if f in ("name", "scopes")])


def _with_times(provider: dict[str, Any]) -> dict[str, Any]:
    """The breaker's instants (epoch seconds, ISO text) shown in UTC and the operator's zone: a
    last error beside a closed circuit says nothing without when it happened."""
    circuit = provider["circuit"]
    error_at, opened_at = circuit.get("last_error_at"), circuit.get("opened_at")
    return {
        **provider,
        "last_error_at": zoned(datetime.fromtimestamp(error_at, UTC)) if error_at is not None else None,
        "opened_at": zoned(datetime.fromisoformat(opened_at)) if opened_at else None,
    }


def provider_health_view(request: HttpRequest) -> HttpResponse:
    """Admin page: the same data as GET /api/v1/providers."""
    context = {
        **admin.site.each_context(request),
        "title": "Provider health",
        "chains": provider_chains(),
        "providers": [_with_times(p) for p in provider_health()],
        "feedback": feedback_rates_by_provider(),
    }
    return TemplateResponse(request, "admin/delivery/provider_health.html", context)
