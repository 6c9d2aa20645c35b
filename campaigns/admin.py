from __future__ import annotations

from django.contrib import admin

from campaigns.models import Campaign, Contact, ContactList, ListMembership, Suppression, Template


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
    readonly_fields = ("created_at", "updated_at")


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "status",
        "priority",
        "schedule_type",
        "scheduled_at",
        "total_count",
        "created_at",
    )
    list_filter = ("status", "priority", "schedule_type")
    search_fields = ("name",)
    readonly_fields = (
        "created_at",
        "updated_at",
        "started_at",
        "completed_at",
        "fanout_cursor",
        "fanout_done",
        "total_count",
    )
