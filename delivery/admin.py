from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from delivery.models import ApiKey, EmailEvent, Message, OutboxEvent
from delivery.selectors import provider_chains, provider_health


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "to_email", "priority", "status", "provider", "attempts", "created_at", "sent_at")
    list_filter = ("status", "priority", "provider")
    search_fields = ("=to_email", "=provider_message_id")
    raw_id_fields = ("campaign", "contact", "template", "api_key")
    readonly_fields = (
        "created_at", "queued_at", "claimed_at", "sent_at", "attempts", "provider",
        "provider_message_id", "last_error", "request_fingerprint", "idempotency_key",
    )  # fmt: skip
    # Counting a table of millions on every page is the slow part of the changelist.
    show_full_result_count = False
    list_select_related = False


@admin.register(OutboxEvent)
class OutboxEventAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "payload", "created_at")
    list_filter = ("kind",)
    readonly_fields = ("kind", "payload", "created_at")


@admin.register(EmailEvent)
class EmailEventAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "provider", "message", "occurred_at")
    list_filter = ("kind", "provider")
    search_fields = ("=message__to_email", "=provider_event_id")
    raw_id_fields = ("message",)
    readonly_fields = ("created_at",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "created_at", "revoked_at")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "key_hash", "created_at")

    def has_add_permission(self, request: object) -> bool:
        return False  # keys are made with `manage.py create_api_key`, which shows the key once


def provider_health_view(request: HttpRequest) -> HttpResponse:
    """Admin page: the same data as GET /api/v1/providers."""
    context = {
        **admin.site.each_context(request),
        "title": "Provider health",
        "chains": provider_chains(),
        "providers": provider_health(),
    }
    return TemplateResponse(request, "admin/delivery/provider_health.html", context)
