from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
    SolarSchedule,
)

from campaigns.models import audience_text
from core.admin import ZonedTimesMixin
from core.validators import ApiValidatedForm
from scheduling import recurring
from scheduling.api import RecurringScheduleSerializer
from scheduling.models import RecurringSchedule, ScheduleOccurrence


class RecurringScheduleForm(ApiValidatedForm):
    """cron, timezone, schedule_type and from_email as the API takes them, and its audience: a
    list, a segment or both, never neither (ApiValidatedForm applies the serializer's rule)."""

    api_serializer = RecurringScheduleSerializer

    class Meta:
        model = RecurringSchedule
        fields = [
            "name", "cron", "timezone", "template", "contact_list", "segment", "priority", "schedule_type",
            "from_email", "active",
        ]  # fmt: skip


@admin.register(RecurringSchedule)
class RecurringScheduleAdmin(ZonedTimesMixin, admin.ModelAdmin):
    form = RecurringScheduleForm
    list_display = ("name", "cron", "timezone", "audience", "priority", "active", "last_run", "next_run")
    list_filter = ("active", "priority")
    list_select_related = ("contact_list", "segment")  # the audience column
    search_fields = ("name",)
    readonly_fields = ("last_run", "next_run", "created_at", "updated_at")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name", "cron", "timezone", "template", ("contact_list", "segment"), "priority",
                    "schedule_type", "from_email", "active",
                ),
                "description": "The audience: a list, a segment, or both (the list's members that match "
                "the segment, as it is when each campaign starts).",
            },
        ),
        ("Runs", {"fields": ("last_run", "next_run", "created_at", "updated_at")}),
    )  # fmt: skip

    @admin.display(description="audience")
    def audience(self, schedule: RecurringSchedule) -> str:
        return audience_text(schedule.contact_list, schedule.segment)

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
class ScheduleOccurrenceAdmin(ZonedTimesMixin, admin.ModelAdmin):
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


# django-celery-beat's tables hold emailhub's internal ticks (emailhub/periodic.py creates them:
# the outbox relay, the reconciler, the recurring-schedule tick…), not operators' schedules:
# recurring campaigns are RecurringSchedule rows, above. Beat's own admin would let anyone edit
# a tick's task, arguments or interval, or add one; here its schedules are hidden and a periodic
# task is read-only but for `enabled`. Its admin also saved a whole row, including
# total_run_count, which the beat writes on every run: the save writes only `enabled`.
for _beat_model in (IntervalSchedule, CrontabSchedule, SolarSchedule, ClockedSchedule):
    admin.site.unregister(_beat_model)
admin.site.unregister(PeriodicTask)


class PeriodicTaskForm(forms.ModelForm):
    class Meta:
        model = PeriodicTask
        fields = ["enabled"]


def _set_enabled(queryset: QuerySet, enabled: bool) -> int:
    changed = queryset.update(enabled=enabled, **({} if enabled else {"last_run_at": None}))
    PeriodicTasks.update_changed()  # a queryset update sends no signal; the beat re-reads on this
    return changed


@admin.action(description="Enable selected ticks", permissions=["change"])
def enable_ticks(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    modeladmin.message_user(request, f"enabled {_set_enabled(queryset, True)} tick(s)", messages.SUCCESS)


@admin.action(description="Disable selected ticks", permissions=["change"])
def disable_ticks(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    modeladmin.message_user(request, f"disabled {_set_enabled(queryset, False)} tick(s)", messages.SUCCESS)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(ZonedTimesMixin, admin.ModelAdmin):
    """emailhub's internal ticks, read-only but for `enabled` (see the note on the list page)."""

    form = PeriodicTaskForm
    change_list_template = "admin/scheduling/periodictask/change_list.html"
    list_display = (
        "name",
        "enabled",
        "task",
        "interval",
        "crontab",
        "queue",
        "last_run_at",
        "total_run_count",
    )
    list_filter = ("enabled", "queue")
    search_fields = ("name", "task")
    actions = [enable_ticks, disable_ticks]
    fields = (
        "name", "enabled", "task", "interval", "crontab", "queue", "args", "kwargs",
        "description", "last_run_at", "total_run_count", "date_changed",
    )  # fmt: skip
    readonly_fields = tuple(f for f in fields if f != "enabled")

    def get_queryset(self, request: HttpRequest) -> QuerySet[PeriodicTask]:
        return super().get_queryset(request).select_related("interval", "crontab")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # ticks are created by emailhub.periodic.ensure_periodic_tasks

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a deleted tick is re-created at the next start; disable it instead

    def save_model(
        self, request: HttpRequest, obj: PeriodicTask, form: forms.ModelForm, change: bool
    ) -> None:
        if "enabled" in form.changed_data:
            # PeriodicTask.save() clears last_run_at on disable; save that too, nothing else.
            obj.save(update_fields=["enabled", "last_run_at"])
