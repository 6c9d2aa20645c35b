from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from delivery.authentication import revoke_api_key
from delivery.models import ApiKey, ApiKeyScope, EmailEvent, Message, OutboxEvent
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
class ApiKeyAdmin(admin.ModelAdmin):
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


def provider_health_view(request: HttpRequest) -> HttpResponse:
    """Admin page: the same data as GET /api/v1/providers."""
    context = {
        **admin.site.each_context(request),
        "title": "Provider health",
        "chains": provider_chains(),
        "providers": provider_health(),
    }
    return TemplateResponse(request, "admin/delivery/provider_health.html", context)
