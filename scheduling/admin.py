from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from scheduling import recurring
from scheduling.models import RecurringSchedule, ScheduleOccurrence


class RecurringScheduleForm(forms.ModelForm):
    class Meta:
        model = RecurringSchedule
        fields = [
            "name", "cron", "timezone", "template", "contact_list", "priority", "schedule_type", "from_email", "active",
        ]  # fmt: skip

    def clean_cron(self) -> str:
        try:
            return recurring.validate_cron(self.cleaned_data["cron"])
        except recurring.InvalidCron as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(RecurringSchedule)
class RecurringScheduleAdmin(admin.ModelAdmin):
    form = RecurringScheduleForm
    list_display = ("name", "cron", "timezone", "priority", "active", "last_run", "next_run")
    list_filter = ("active", "priority")
    search_fields = ("name",)
    readonly_fields = ("last_run", "next_run", "created_at", "updated_at")

    def save_model(
        self, request: HttpRequest, obj: RecurringSchedule, form: forms.ModelForm, change: bool
    ) -> None:
        recurring.refresh_next_run(obj)
        super().save_model(request, obj, form, change)


@admin.register(ScheduleOccurrence)
class ScheduleOccurrenceAdmin(admin.ModelAdmin):
    list_display = ("schedule", "occurrence", "campaign", "created_at")
    list_filter = ("schedule",)
    readonly_fields = ("schedule", "occurrence", "campaign", "created_at")
