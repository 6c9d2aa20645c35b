from __future__ import annotations

from django.contrib import admin

from scheduling.models import RecurringSchedule, ScheduleOccurrence


@admin.register(RecurringSchedule)
class RecurringScheduleAdmin(admin.ModelAdmin):
    list_display = ("name", "cron", "timezone", "priority", "active", "last_run", "next_run")
    list_filter = ("active", "priority")
    search_fields = ("name",)
    readonly_fields = ("last_run", "next_run", "created_at", "updated_at")


@admin.register(ScheduleOccurrence)
class ScheduleOccurrenceAdmin(admin.ModelAdmin):
    list_display = ("schedule", "occurrence", "campaign", "created_at")
    list_filter = ("schedule",)
    readonly_fields = ("schedule", "occurrence", "campaign", "created_at")
