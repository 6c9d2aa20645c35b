"""Messages, their events, and the API keys that submit them (the outbox is core's)."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now, Upper

from campaigns.models import Campaign, Contact, Priority, Template


class ApiKeyScope(models.TextChoices):
    SEND = "send"  # POST /api/v1/messages and /messages/batch
    READ = "read"  # GET the key's own messages and their events
    MANAGE = "manage"  # everything else, and every key's messages


def default_api_key_scopes() -> list[str]:
    # A new key is an application's: it sends and reads its own mail, nothing more.
    return [ApiKeyScope.SEND.value, ApiKeyScope.READ.value]


class ApiKey(models.Model):
    """A bearer key. Only its SHA-256 is stored; the key itself is shown once at creation."""

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16, help_text="The key's first characters, to recognise it")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = ArrayField(
        models.CharField(max_length=10, choices=ApiKeyScope.choices),
        default=default_api_key_scopes,
        help_text="send, read, manage",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class MessageStatus(models.TextChoices):
    SCHEDULED = "scheduled"  # waits for due_at
    QUEUED = "queued"  # published (or about to be) to its priority queue
    SENDING = "sending"  # claimed by one worker
    RETRY_WAIT = "retry_wait"  # a transient failure; retried at due_at
    SENT = "sent"
    FAILED = "failed"
    SUPPRESSED = "suppressed"
    CANCELLED = "cancelled"


FINAL_STATUSES = (
    MessageStatus.SENT,
    MessageStatus.FAILED,
    MessageStatus.SUPPRESSED,
    MessageStatus.CANCELLED,
)


class Message(models.Model):
    """One email to one recipient.

    Campaign rows are written by set-based SQL during fan-out and carry no content of their own:
    they are rendered from the campaign's template at send time. Columns a campaign row leaves
    empty are nullable, and every column fan-out omits has a database default.

    The foreign keys have no database constraint (db_constraint=False). PostgreSQL checked four
    of them per row at commit, ~9 µs a row: a third of fan-out's time (bench/fanout.py, EXPLAIN
    ANALYZE). Fan-out takes every key from the rows it joins, and Django still applies on_delete
    (CASCADE, SET_NULL, PROTECT) to ORM deletes; only a raw SQL DELETE of a contact, campaign or
    template could leave a dangling id, which readers treat as missing.
    """

    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    # No index and DO_NOTHING: nothing looks messages up by contact (a message keeps its own
    # to_email), and the index cost every fan-out insert. A deleted contact's messages keep the
    # dangling id; rendering treats the contact as missing.
    contact = models.ForeignKey(
        Contact, null=True, blank=True, on_delete=models.DO_NOTHING, db_index=False, db_constraint=False
    )
    template = models.ForeignKey(
        Template, null=True, blank=True, on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.PROTECT, db_index=False, db_constraint=False
    )

    to_email = models.CharField(max_length=254)
    # Copies (JSON arrays of addresses, NULL when none): cc in the Cc header, bcc in no header.
    # `to_email` is the message's recipient: its status, suppression and campaign row follow it.
    cc = models.JSONField(null=True, blank=True)
    bcc = models.JSONField(null=True, blank=True)
    from_email = models.CharField(max_length=254, null=True, blank=True)
    reply_to = models.CharField(max_length=254, null=True, blank=True)
    subject = models.TextField(null=True, blank=True)
    html = models.TextField(null=True, blank=True)
    text = models.TextField(null=True, blank=True)
    context = models.JSONField(null=True, blank=True)
    # What a transactional message asked for (the API's flags; a campaign's messages carry an
    # unsubscribe link always and take tracking from their campaign). Columns, not keys of the
    # user's `context`; database defaults, so fan-out's INSERT … SELECT names none of them.
    # One-click unsubscribe link and List-Unsubscribe headers: marketing mail, which an
    # `unsubscribed` suppression then stops too.
    list_unsubscribe = models.BooleanField(default=False, db_default=False)
    track_opens = models.BooleanField(default=False, db_default=False)
    track_clicks = models.BooleanField(default=False, db_default=False)
    # An operator's test send from the admin's template page: their user name ("" when unknown);
    # NULL for every other message.
    test_send_by = models.CharField(max_length=150, null=True, blank=True)
    # What the application attaches to recognise the message in its events and lists: a JSON
    # array of tags and a flat object of string metadata (limits in core.limits). Stored, never
    # put in a header the recipient can see. NULL when none; a campaign's rows leave them NULL
    # and carry their campaign's tags (Campaign.tags), so fan-out writes no copy per row.
    tags = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    # Headers the application adds (delivery.headers says which it may), sent unchanged.
    headers = models.JSONField(null=True, blank=True)
    # The files sent with the message, without their bytes (AttachmentContent holds those, once
    # per distinct content): [{"filename", "content_type", "size", "sha256", "content_id"}], in
    # the order given. NULL when none, as on every campaign row (fan-out writes nothing new).
    attachments = models.JSONField(null=True, blank=True)

    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    status = models.CharField(
        max_length=12,
        choices=MessageStatus.choices,
        default=MessageStatus.QUEUED,
        db_default=MessageStatus.QUEUED,
    )
    due_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0, db_default=0)
    provider = models.CharField(max_length=20, null=True, blank=True)
    provider_message_id = models.CharField(max_length=255, null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)

    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, null=True, blank=True, editable=False)

    created_at = models.DateTimeField(db_default=Now(), editable=False)
    queued_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # The first human open and click (tracking pixel, click redirect or provider events), set once.
    first_opened_at = models.DateTimeField(null=True, blank=True)
    first_clicked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "contact"], name="uniq_campaign_contact"),
            models.UniqueConstraint(
                fields=["api_key", "idempotency_key"],
                name="uniq_idempotency_key",
                condition=models.Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            # The due sweep: scheduled sends and retries whose time has come.
            models.Index(
                fields=["due_at"],
                name="message_due_idx",
                condition=models.Q(status__in=["scheduled", "retry_wait"]),
            ),
            # The transactional pool's adaptive claim (transitions.claim_pool): the oldest queued
            # API messages of each pooled priority. Partial: campaign rows and the bulk priorities
            # never enter it, and a row leaves it when it is claimed.
            models.Index(
                fields=["priority", "id"],
                name="message_pool_queued_idx",
                condition=models.Q(status="queued", campaign__isnull=True, priority__in=["critical", "high"]),
            ),
            # `?tag=` and cancel by tag: `tags @> '["x"]'`. Partial: rows without tags (every
            # campaign row) never enter it, so fan-out does not pay for it.
            GinIndex(
                fields=["tags"],
                name="message_tags_idx",
                opclasses=["jsonb_path_ops"],
                condition=models.Q(tags__isnull=False),
            ),
            # The reaper: rows whose worker died while sending.
            models.Index(
                fields=["claimed_at"],
                name="message_sending_idx",
                condition=models.Q(status="sending"),
            ),
            # Search by recipient: the admin's `=to_email` is UPPER(to_email) = UPPER(%s). One functional
            # index instead of Django's plain + varchar_pattern_ops pair, neither of which served
            # that query while both cost every fan-out insert.
            models.Index(Upper("to_email"), name="message_to_email_upper_idx"),
            # A key lists its own messages newest first. Partial: campaign rows have no key, so
            # fan-out inserts never pay for this index.
            models.Index(
                fields=["api_key", "-id"],
                name="message_api_key_idx",
                condition=models.Q(api_key__isnull=False),
            ),
            # Provider events name the message by the provider's id (SES `mail.messageId`, a DSN's
            # returned Message-ID): without this, each such event scanned the table (71 events/s
            # at 100k messages). Partial: rows not sent yet have none, so fan-out never pays; each
            # send pays one entry.
            models.Index(
                fields=["provider_message_id"],
                name="message_provider_id_idx",
                condition=models.Q(provider_message_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} to {self.to_email} ({self.status})"


class AttachmentContent(models.Model):
    """The bytes of an attached file, stored once per distinct content: a batch of 1,000
    messages with the same PDF stores it once, and each message's `attachments` names it by
    hash. Rows are written by delivery.services.attachments only (INSERT … ON CONFLICT DO
    NOTHING in the accepting transaction), and never change: a hash names its bytes for ever."""

    sha256 = models.CharField(max_length=64, primary_key=True)  # hex SHA-256 of `content`
    content = models.BinaryField()
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.sha256[:12]}… ({self.size} bytes)"


class EmailEvent(models.Model):
    """Something that happened to a sent message: delivery, bounce, complaint, open, click."""

    class Kind(models.TextChoices):
        DELIVERED = "delivered"  # the receiving server accepted it
        DEFERRED = "deferred"  # the provider is retrying delivery (SendGrid deferred)
        DELAYED = "delayed"  # delivery delayed (SES DeliveryDelay)
        BOUNCED = "bounced"  # permanent or transient, see `bounce`
        DROPPED = "dropped"  # the provider refused to try (SendGrid dropped)
        REJECTED = "rejected"  # the provider rejected it before sending (SES Reject)
        COMPLAINED = "complained"  # marked as spam (feedback loop)
        OPENED = "opened"
        CLICKED = "clicked"
        UNSUBSCRIBED = "unsubscribed"

    class Classification(models.TextChoices):
        NONE = ""
        HUMAN = "human"
        MACHINE = "machine"  # Apple Mail Privacy Protection, SendGrid sg_machine_open
        PROXY = "proxy"  # Gmail's image proxy and similar: fetched on the reader's behalf
        BOT = "bot"  # a known crawler / link checker user agent
        SCANNER = "scanner"  # a security scanner: clicks right after delivery, several links at once

    class Bounce(models.TextChoices):
        NONE = ""
        PERMANENT = "permanent"  # hard: the address does not exist / is blocked; suppressed
        TRANSIENT = "transient"  # soft: mailbox full, greylisted; never suppresses

    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    provider = models.CharField(max_length=20, blank=True, default="")
    # The provider's own event id; with the provider it makes a replayed webhook a no-op. For a
    # notification that covers several recipients (SNS) it is per recipient.
    provider_event_id = models.CharField(max_length=255, null=True, blank=True)
    # The address the event is about (lower-cased), kept even when no message matched.
    recipient = models.CharField(max_length=254, blank=True, default="")
    bounce = models.CharField(max_length=10, choices=Bounce.choices, blank=True, default="")
    # Opens and clicks: who made the hit. Only `human` feeds rates and send-time optimization.
    classification = models.CharField(max_length=8, choices=Classification.choices, blank=True, default="")
    detail = models.TextField(blank=True, default="")  # bounce subtype, diagnostic, complaint type
    occurred_at = models.DateTimeField()
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "provider_event_id"],
                name="uniq_provider_event",
                condition=models.Q(provider_event_id__isnull=False),
            )
        ]
        indexes = [
            # Segments' engagement conditions (delivery.selectors.engagement_sql): a contact's
            # human opens and clicks, and its bounces, complaints and unsubscribes, by address and
            # time. Two partial indexes, not one whose predicate is an OR: each predicate is then
            # implied by the query's own, so a probe or a count is an index-only scan (with the
            # OR, every entry's row was read to check `classification`). Deliveries, deferrals
            # and machine opens, most of the table, are in neither. The address leads: a predicate
            # that implies a query's `kind IN (…)` takes that condition out of the index's
            # search, so with `kind` first a probe for "opened" (opens and clicks) searched
            # the whole index for one address (a fan-out step of 20,000 ran for minutes).
            models.Index(
                fields=["recipient", "kind", "occurred_at"],
                name="emailevent_human_idx",
                condition=models.Q(kind__in=["opened", "clicked"], classification="human"),
            ),
            models.Index(
                fields=["recipient", "kind", "occurred_at"],
                name="emailevent_feedback_idx",
                condition=models.Q(kind__in=["bounced", "complained", "unsubscribed"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of message {self.message_id}"
