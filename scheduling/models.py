"""Recurring schedules: a cron expression in an IANA timezone that creates campaigns."""

from __future__ import annotations

from django.db import models

from campaigns.models import AUDIENCE_REQUIRED, Campaign, ContactList, Priority, Segment, Template
from core.timezones import validate_timezone


class RecurringSchedule(models.Model):
    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=120, help_text="Five fields: minute hour day month weekday")
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    # The blueprint of each campaign an occurrence creates.
    template = models.ForeignKey(Template, on_delete=models.PROTECT, related_name="+")
    # A list, a segment, or both (the list's members that match); see Campaign.
    contact_list = models.ForeignKey(
        ContactList, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    segment = models.ForeignKey(Segment, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.LOW)
    schedule_type = models.CharField(
        max_length=12,
        choices=Campaign.ScheduleType.choices,
        default=Campaign.ScheduleType.IMMEDIATE,
    )
    from_email = models.CharField(max_length=254, blank=True, default="")

    active = models.BooleanField(default=True)
    last_run = models.DateTimeField(null=True, blank=True)
    next_run = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["next_run"], name="recurring_due_idx", condition=models.Q(active=True))
        ]
        constraints = [models.CheckConstraint(condition=AUDIENCE_REQUIRED, name="recurring_has_audience")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class ScheduleOccurrence(models.Model):
    """One fired occurrence. The unique pair is what keeps two beats from creating two campaigns."""

    schedule = models.ForeignKey(RecurringSchedule, on_delete=models.CASCADE, related_name="occurrences")
    occurrence = models.DateTimeField()
    campaign = models.OneToOneField(Campaign, on_delete=models.CASCADE, related_name="occurrence")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schedule", "occurrence"], name="uniq_schedule_occurrence")
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.occurrence:%Y-%m-%d %H:%M %Z}"
