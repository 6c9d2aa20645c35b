from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from campaigns import lifecycle
from campaigns.exceptions import CampaignStateError
from campaigns.models import Campaign, Contact, ContactList, ListMembership, Suppression, Template
from campaigns.services import compile_template, contact_context
from campaigns.templating import TemplateSyntaxError


@admin.register(Contact)
class ContactAdmin(admin.ModelAdmin):
    list_display = ("email", "name", "timezone", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("=email", "name")
    readonly_fields = ("created_at", "updated_at")
    show_full_result_count = False


@admin.register(ContactList)
class ContactListAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)
    readonly_fields = ("created_at",)


@admin.register(ListMembership)
class ListMembershipAdmin(admin.ModelAdmin):
    list_display = ("contact_list", "contact", "added_at")
    list_filter = ("contact_list",)
    search_fields = ("=contact__email",)
    raw_id_fields = ("contact",)
    readonly_fields = ("added_at",)
    show_full_result_count = False


@admin.register(Suppression)
class SuppressionAdmin(admin.ModelAdmin):
    list_display = ("email", "reason", "created_at")
    list_filter = ("reason",)
    search_fields = ("=email",)
    readonly_fields = ("created_at",)


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin):
    list_display = ("name", "subject", "updated_at")
    search_fields = ("name", "subject")
    readonly_fields = ("preview", "created_at", "updated_at")

    @admin.display(description="Preview (first contact, or the declared defaults)")
    def preview(self, template: Template) -> str:
        if template.pk is None:
            return "Save the template to see a preview."
        contact = Contact.objects.order_by("id").first()
        try:
            rendered = compile_template(template).render(contact_context(contact))
        except TemplateSyntaxError as exc:
            return f"Template error: {exc}"
        who = contact.email if contact else "no contact yet"
        # The rendered HTML is shown as text inside <pre>, never as live markup in the admin.
        return format_html(
            "<p><b>To:</b> {}<br><b>Subject:</b> {}</p><pre style='white-space:pre-wrap'>{}</pre>"
            "<pre style='white-space:pre-wrap'>{}</pre>",
            who, rendered.subject, rendered.text, rendered.html,
        )  # fmt: skip


def _apply(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, change: str) -> None:
    done = 0
    for campaign in queryset:
        try:
            if change == "schedule":
                lifecycle.schedule(campaign.pk, Campaign.ScheduleType.IMMEDIATE)
            else:
                getattr(lifecycle, change)(campaign.pk)
            done += 1
        except CampaignStateError as exc:
            modeladmin.message_user(request, f"{campaign}: {exc}", messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{change}: {done} campaign(s)", messages.SUCCESS)


@admin.action(description="Start now (draft campaigns)")
def start_now(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "schedule")


@admin.action(description="Pause")
def pause(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "pause")


@admin.action(description="Resume")
def resume(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "resume")


@admin.action(description="Cancel (what is not sent yet is never sent)")
def cancel(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "cancel")


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    """State changes go through the actions (lifecycle services); counters, cursor and status are
    never written from this form, and nothing but name, sender and priority once it has started:
    a full-row save would overwrite what workers and fan-out moved meanwhile."""

    actions = [start_now, pause, resume, cancel]
    list_display = (
        "name",
        "status",
        "priority",
        "schedule_type",
        "total_count",
        "sent_count",
        "progress",
        "created_at",
    )
    list_filter = ("status", "priority", "schedule_type")
    search_fields = ("name",)
    always_readonly = (
        "status", "schedule_type", "scheduled_at", "local_date", "local_time", "past_time_policy",
        "created_at", "updated_at", "started_at", "completed_at", "fanout_cursor", "fanout_done",
        "total_count", "excluded_count", "sent_count", "failed_count", "suppressed_count", "cancelled_count",
        "progress",
    )  # fmt: skip

    def get_readonly_fields(self, request: HttpRequest, obj: Campaign | None = None) -> tuple[str, ...]:
        if obj is not None and obj.status != Campaign.Status.DRAFT:
            return (*self.always_readonly, "template", "contact_list", "window_hours")
        return self.always_readonly

    def save_model(self, request: HttpRequest, obj: Campaign, form: object, change: bool) -> None:
        if change:
            editable = [f for f in form.changed_data if f not in self.get_readonly_fields(request, obj)]  # type: ignore[attr-defined]
            obj.save(update_fields=[*editable, "updated_at"])
        else:
            obj.save()

    @admin.display(description="done")
    def progress(self, campaign: Campaign) -> str:
        return f"{campaign.percent_done}%"
