"""Audiences (contacts, lists, suppressions), templates and campaigns."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Now

from core.templating import TemplateSyntaxError, check_syntax
from core.timezones import validate_timezone


class Priority(models.TextChoices):
    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class Contact(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        UNSUBSCRIBED = "unsubscribed"
        BOUNCED = "bounced"
        COMPLAINED = "complained"

    # Stored lower-cased: one contact per mailbox, whatever case an import used.
    email = models.CharField(max_length=254, unique=True)
    name = models.CharField(max_length=200, blank=True, default="", db_default="")
    timezone = models.CharField(
        max_length=64, default="UTC", db_default="UTC", validators=[validate_timezone]
    )
    attributes = models.JSONField(default=dict, db_default={}, blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.ACTIVE, db_default=Status.ACTIVE
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    # Set when an operator erases the contact: its personal data is removed and the row kept, so
    # the messages sent to it keep a valid contact (see campaigns.services, docs/campaigns).
    anonymised_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.email


class ContactList(models.Model):
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    contacts: models.ManyToManyField[Contact, ListMembership] = models.ManyToManyField(
        Contact, through="ListMembership", related_name="lists"
    )

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


class ListMembership(models.Model):
    contact_list = models.ForeignKey(ContactList, on_delete=models.CASCADE, db_index=False)
    contact = models.ForeignKey(Contact, on_delete=models.CASCADE)
    added_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            # Also the index the fan-out walks: (list, contact id) in key order.
            models.UniqueConstraint(fields=["contact_list", "contact"], name="uniq_list_contact"),
        ]

    def __str__(self) -> str:
        return f"{self.contact_id} in {self.contact_list_id}"


class Suppression(models.Model):
    """An address that must not be mailed. Checked at fan-out (anti-join) and before every send."""

    class Reason(models.TextChoices):
        UNSUBSCRIBED = "unsubscribed"
        BOUNCED = "bounced"
        COMPLAINED = "complained"
        MANUAL = "manual"

    email = models.CharField(max_length=254, unique=True)
    reason = models.CharField(max_length=16, choices=Reason.choices)
    detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.email} ({self.reason})"


class Template(models.Model):
    """Subject, HTML and text with ``{{ variable }}`` placeholders (see core.templating)."""

    name = models.SlugField(max_length=100, unique=True)
    subject = models.CharField(max_length=998)
    html = models.TextField(blank=True, default="")
    text = models.TextField(blank=True, default="")
    # Values used when a recipient has no value for a variable.
    defaults = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Every placeholder must parse and the subject is one line: the one template rule
        (the admin's form runs it, and the API's TemplateSerializer on the template as edited)."""
        errors = {}
        for field in ("subject", "html", "text"):
            try:
                check_syntax(getattr(self, field) or "")
            except TemplateSyntaxError as exc:
                errors[field] = str(exc)
        if "\n" in self.subject or "\r" in self.subject:
            errors["subject"] = "must not contain line breaks (CR or LF)"
        if errors:
            raise ValidationError(errors)


class Segment(models.Model):
    """A named filter over contacts (campaigns.segment_filter has the language), evaluated live:
    a count, a sample, a campaign's fan-out read the contacts as they are then."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    filter = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


# A campaign's (and a recurring blueprint's) audience: a list, a segment, or a list narrowed by
# a segment; never neither.
AUDIENCE_REQUIRED = models.Q(contact_list__isnull=False) | models.Q(segment__isnull=False)


def audience_text(contact_list: ContactList | None, segment: Segment | None) -> str:
    """A campaign's (or a recurring blueprint's) audience as the operator reads it: a list, a
    segment, or a list narrowed by a segment."""
    if contact_list is not None and segment is not None:
        return f"list {contact_list} ∩ segment {segment}"
    if segment is not None:
        return f"segment {segment}"
    return f"list {contact_list}" if contact_list is not None else "—"


class Campaign(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        SCHEDULED = "scheduled"
        SENDING = "sending"
        PAUSED = "paused"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    class ScheduleType(models.TextChoices):
        IMMEDIATE = "immediate"
        AT = "at"
        LOCAL_TIME = "local_time"
        OPTIMIZED = "optimized"

    class PastTimePolicy(models.TextChoices):
        NEXT_DAY = "next_day"
        SEND_NOW = "send_now"
        SKIP = "skip"

    name = models.CharField(max_length=200)
    template = models.ForeignKey(Template, on_delete=models.PROTECT, related_name="campaigns")
    # The audience: the list's members, the segment's matches, or the list's members that match.
    contact_list = models.ForeignKey(
        ContactList, null=True, blank=True, on_delete=models.PROTECT, related_name="campaigns"
    )
    segment = models.ForeignKey(
        Segment, null=True, blank=True, on_delete=models.PROTECT, related_name="campaigns"
    )
    # The segment's filter as it was when the campaign was scheduled: an edit of the segment
    # afterwards changes no campaign already on its way (fan-out reads this, not the segment).
    audience_filter = models.JSONField(null=True, blank=True, editable=False)
    from_email = models.CharField(max_length=254, blank=True, default="")
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.DRAFT)

    schedule_type = models.CharField(
        max_length=12, choices=ScheduleType.choices, default=ScheduleType.IMMEDIATE
    )
    scheduled_at = models.DateTimeField(null=True, blank=True)  # `at`: a UTC instant
    local_date = models.DateField(null=True, blank=True)  # `local_time`: wall date and time
    local_time = models.TimeField(null=True, blank=True)
    past_time_policy = models.CharField(
        max_length=10, choices=PastTimePolicy.choices, default=PastTimePolicy.NEXT_DAY
    )
    # `optimized`: send at each contact's best hour within this many hours of the start.
    window_hours = models.PositiveSmallIntegerField(default=24)
    # `optimized`: the window starts here (UTC); a random `holdout_percent` of the audience,
    # chosen by a hash of (campaign, contact), is sent at the window's start instead, so the
    # lift of the optimized send can be measured.
    window_start = models.DateTimeField(null=True, blank=True)
    holdout_percent = models.PositiveSmallIntegerField(default=0)
    # Open and click tracking (opt-in): an open pixel, links rewritten to the click redirect.
    track_opens = models.BooleanField(default=False)
    track_clicks = models.BooleanField(default=False)
    # What the operator or application recognises the campaign's mail by: its messages carry
    # these in the API and on every event (one copy here, none per message row).
    tags = models.JSONField(null=True, blank=True, help_text='e.g. ["spring-sale"]')

    # Fan-out progress: the last contact id written, so a killed fan-out resumes where it was.
    fanout_cursor = models.BigIntegerField(default=0)
    fanout_done = models.BooleanField(default=False)
    # Progress counters, each moved by the statement that moves the messages it counts.
    total_count = models.PositiveIntegerField(default=0)  # messages created by fan-out
    excluded_count = models.PositiveIntegerField(default=0)  # list members suppressed or inactive
    sent_count = models.PositiveIntegerField(default=0)
    failed_count = models.PositiveIntegerField(default=0)
    suppressed_count = models.PositiveIntegerField(default=0)
    cancelled_count = models.PositiveIntegerField(default=0)
    # What recipients and providers reported after sending (webhooks, DSNs, unsubscribe links),
    # each moved once per message by delivery.services.events through campaigns.progress.
    bounced_count = models.PositiveIntegerField(default=0)
    complained_count = models.PositiveIntegerField(default=0)
    unsubscribed_count = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # A campaign with messages is never deleted (its delivery history stays); it is archived:
    # hidden from the default admin list and from the dashboard.
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status"], name="campaign_status_idx")]
        constraints = [models.CheckConstraint(condition=AUDIENCE_REQUIRED, name="campaign_has_audience")]

    def __str__(self) -> str:
        return self.name

    @property
    def finished_count(self) -> int:
        return self.sent_count + self.failed_count + self.suppressed_count + self.cancelled_count

    @property
    def queued_count(self) -> int:
        """Created and not finished yet: queued, sending or waiting for a retry."""
        return max(0, self.total_count - self.finished_count)

    @property
    def percent_done(self) -> float:
        """Finished messages over created ones; never 100 while fan-out is still creating them."""
        if self.total_count == 0:
            return 100.0 if self.fanout_done else 0.0
        percent = 100 * self.finished_count / self.total_count
        return round(percent if self.fanout_done else min(percent, 99.9), 1)


class ImportJob(models.Model):
    """A CSV import, run by a worker (campaigns.import_jobs); the file waits in ImportChunk rows.

    The file is stored in PostgreSQL, not on a disk, because the web process that received it and
    the worker that reads it may run on different hosts.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"

    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    filename = models.CharField(max_length=255, blank=True, default="")
    size = models.BigIntegerField(default=0)  # bytes of the stored file
    list_name = models.CharField(max_length=200, blank=True, default="")
    contact_list = models.ForeignKey(
        ContactList, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Progress, written in the transaction that writes each batch of contacts, so a run that died
    # resumes at the first record not written: the physical line it starts on and its byte offset.
    next_line = models.BigIntegerField(default=0)  # 0: no record read yet
    next_offset = models.BigIntegerField(default=0)
    rows_read = models.BigIntegerField(default=0)
    rows_created = models.BigIntegerField(default=0)
    rows_updated = models.BigIntegerField(default=0)
    rows_duplicate = models.BigIntegerField(default=0)
    rows_rejected = models.BigIntegerField(default=0)
    added_to_list = models.BigIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # The claim: a run owns the job while its token is stored, and checks it at every batch.
    run_token = models.UUIDField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # The database clock when the first run started: contacts created since are this import's own.
    since = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["heartbeat_at"],
                name="importjob_unfinished_idx",
                condition=models.Q(status__in=["pending", "running"]),
            )
        ]

    def __str__(self) -> str:
        return f"import {self.pk} ({self.status})"

    @property
    def rows_imported(self) -> int:
        return self.rows_created + self.rows_updated + self.rows_duplicate


class ImportChunk(models.Model):
    """One slice of an import's file (bytea), deleted when the import finishes."""

    job = models.ForeignKey(ImportJob, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="uniq_importchunk_seq")]

    def __str__(self) -> str:
        return f"import {self.job_id} chunk {self.seq}"


class ImportIssue(models.Model):
    """A rejected row (or a duplicate merged into an earlier one), every one of them, by line."""

    class Kind(models.TextChoices):
        REJECTED = "rejected"
        DUPLICATE = "duplicate"

    job = models.ForeignKey(ImportJob, on_delete=models.CASCADE, related_name="issues", db_index=False)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    line = models.BigIntegerField()  # the file's physical line the row starts on
    reason = models.TextField()
    excerpt = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["line"]
        constraints = [
            # Also the index the paginated listing walks; a resumed run cannot record a line twice.
            models.UniqueConstraint(fields=["job", "kind", "line"], name="uniq_importissue_line")
        ]

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


class EngagementProfile(models.Model):
    """A contact's human opens and clicks by hour of the contact's local day (24 bins),
    exponentially decayed, updated incrementally by a beat task from new engagement events."""

    # No database foreign key (db_constraint=False): the profile is derived data written only by
    # the engagement refresh, which takes its contact ids from campaigns_contact in the same
    # transaction; the constraint's per-row check locked every contact row (a WAL record and a
    # dirtied page each) and cost ~25 s of a 1M-contact backlog refresh. Deleting a contact
    # through the ORM still deletes its profile (on_delete=CASCADE is Django's).
    contact = models.OneToOneField(Contact, on_delete=models.CASCADE, primary_key=True, db_constraint=False)
    # Decayed weights per local hour 0..23, as of `decayed_at`.
    histogram = ArrayField(models.FloatField(), size=24)
    decayed_at = models.DateTimeField()
    # The hour (0..23, local) the estimator chose at the last refresh, with the population then.
    best_hour = models.PositiveSmallIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"engagement of contact {self.contact_id}"


class EngagementPopulation(models.Model):
    """One row: the population's decayed histogram (the prior) and the refresh watermark."""

    histogram = ArrayField(models.FloatField(), size=24)
    decayed_at = models.DateTimeField()
    # The last EmailEvent id folded into the profiles: the next refresh starts after it.
    last_event_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return "engagement population"
