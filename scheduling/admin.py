from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django_celery_beat.admin import PeriodicTaskAdmin as BeatPeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask

from core.validators import SenderForm
from scheduling import recurring
from scheduling.models import RecurringSchedule, ScheduleOccurrence


class RecurringScheduleForm(SenderForm):  # from_email: exactly one mailbox, as the API requires
    class Meta:
        model = RecurringSchedule
        fields = [
            "name", "cron", "timezone", "template", "contact_list", "priority", "schedule_type", "from_email", "active",
        ]  # fmt: skip

    def clean_cron(self) -> str:
        return recurring.clean_cron(self.cleaned_data["cron"])


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
        # last_run and next_run belong to the beat: the service writes only what the operator
        # changed, locked, and computes next_run again only when the rule changed.
        if not change:
            recurring.create_schedule(obj)
            return
        changes = {f: form.cleaned_data[f] for f in form.changed_data if f not in self.readonly_fields}
        if changes:
            recurring.update_schedule(obj.pk, changes)


@admin.register(ScheduleOccurrence)
class ScheduleOccurrenceAdmin(admin.ModelAdmin):
    """The beat's record of what fired: UNIQUE(schedule, occurrence) is what stops two beats
    creating two campaigns, so the rows are shown, never added, edited or deleted here."""

    list_display = ("schedule", "occurrence", "campaign", "created_at")
    list_filter = ("schedule",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


# django-celery-beat's own admin saves a whole PeriodicTask row, including total_run_count, which
# the beat writes on every run. Operators may still enable, disable or reschedule a task; the
# save writes only the fields they changed.
admin.site.unregister(PeriodicTask)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(BeatPeriodicTaskAdmin):
    def save_model(
        self, request: HttpRequest, obj: PeriodicTask, form: forms.ModelForm, change: bool
    ) -> None:
        fields = [f for f in form.changed_data if f not in self.get_readonly_fields(request, obj)]
        if "enabled" in fields:
            fields.append("last_run_at")  # PeriodicTask.save() clears it on disable
        if not change:
            obj.save()
        elif fields:
            obj.save(update_fields=fields)
