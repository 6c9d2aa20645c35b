"""Validation of the message API. Nothing is written unless every field is valid."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import MaxLengthValidator, validate_email
from rest_framework import serializers

from campaigns.models import Priority, Template
from core import api_input, limits
from core.api_json import RequestTooLarge
from core.api_schema import EmailAddressField
from core.limits import MaxItems
from core.validators import ONE_LINE, TAG_PATTERN, no_crlf, validate_mailbox
from delivery import attachments
from delivery.headers import MAX_HEADERS, header_problems
from delivery.models import EmailEvent, Message
from delivery.services.attachments import NewAttachment
from delivery.services.messages import NewMessage

# Keys of Message.context that carried these flags before they became columns (delivery
# migration 0013 moved them out of stored contexts). A request's context still may not hold
# them, with the same answer as before: a client relying on one learns the field to use, and
# nothing stored can be read as a flag again (by older code during a deploy, or after the
# migration is reversed).
RESERVED_CONTEXT_KEYS = {
    "emailhub:unsubscribe": "is reserved; use the unsubscribe field",
    "emailhub:track_opens": "is reserved; use the track_opens field",
    "emailhub:track_clicks": "is reserved; use the track_clicks field",
    "emailhub:test_send": "is reserved for the admin's test sends",
}


def within_horizon(send_at: datetime) -> datetime:
    """`send_at`, or a 400 naming EMAILHUB_SCHEDULE_HORIZON_DAYS when it is further ahead."""
    refusal = limits.beyond_horizon(send_at)
    if refusal:
        raise serializers.ValidationError(refusal, code=limits.SCHEDULE_HORIZON.setting)
    return send_at


def _recipient(value: str) -> str:
    """An address of `to`, `cc` or `bcc`: one bare address (a path, RFC 5321 §4.1.2)."""
    no_crlf(value)
    try:
        validate_email(value)
    except DjangoValidationError:
        raise serializers.ValidationError(f"{value!r} is not a valid email address") from None
    return value.strip()


def _copies(addresses: list[str]) -> list[str]:
    errors: dict[str, Any] = {}
    for index, address in enumerate(addresses):
        try:
            _recipient(address)
        except serializers.ValidationError as exc:
            errors[str(index)] = exc.detail
    if errors:
        raise serializers.ValidationError(errors)
    return [address.strip() for address in addresses]


def _check_recipients(attrs: dict[str, Any]) -> None:
    """`to`, `cc` and `bcc` together: within EMAILHUB_MESSAGE_MAX_RECIPIENTS, and no address
    twice (any case): SendGrid refuses a personalization that repeats one, and a copy to the
    recipient, or a cc that is also a bcc, says nothing either way."""
    copies = {name: attrs.get(name) or [] for name in ("cc", "bcc")}
    total = 1 + len(copies["cc"]) + len(copies["bcc"])
    limit = limits.MESSAGE_RECIPIENTS
    if total > limit.value():
        raise serializers.ValidationError(
            {"cc" if copies["cc"] else "bcc": [serializers.ErrorDetail(
                f"to, cc and bcc are {total} recipients; at most {limit.value()} ({limit.setting})",
                code=limit.setting,
            )]}
        )  # fmt: skip
    seen = {attrs["to"].lower()} if "to" in attrs else set()
    for name, addresses in copies.items():
        for index, address in enumerate(addresses):
            if address.lower() in seen:
                raise serializers.ValidationError(
                    {name: {str(index): [f"{address!r} is already a recipient"]}}
                )
            seen.add(address.lower())


class AttachmentSerializer(api_input.ClosedSerializer):
    """A file sent with the message; with `content_id`, an inline image the HTML shows as
    `<img src="cid:…">`. Its content is stored once however many messages attach it."""

    filename = serializers.RegexField(
        attachments.FILENAME_PATTERN,
        max_length=attachments.MAX_FILENAME_LENGTH,
        trim_whitespace=False,
        error_messages={"invalid": "must not contain a path separator (/ or \\) or a control character"},
        help_text="the name the recipient sees (non-ASCII is fine); executable types mailbox "
        "providers reject (.exe, .js, .bat…) are refused",
    )
    content_type = serializers.RegexField(
        attachments.CONTENT_TYPE_PATTERN,
        max_length=255,
        error_messages={"invalid": "is not a media type type/subtype (application/pdf, image/png…)"},
        help_text="the file's media type, e.g. application/pdf",
    )
    content = api_input.Base64Field(help_text="the file's bytes, base64 on one line")
    content_id = serializers.RegexField(
        attachments.CONTENT_ID_PATTERN,
        max_length=128,
        required=False,
        error_messages={"invalid": "1 to 128 of A-Z a-z 0-9 . _ @ + -"},
        help_text="makes it an inline image, referenced in the HTML as cid:<content_id>",
    )

    def validate_filename(self, value: str) -> str:
        problem = attachments.filename_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_content_type(self, value: str) -> str:
        problem = attachments.content_type_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value.lower()

    def validate(self, attrs: dict[str, Any]) -> NewAttachment:  # type: ignore[override]
        return NewAttachment(
            filename=attrs["filename"],
            content_type=attrs["content_type"],
            content=attrs["content"],
            content_id=attrs.get("content_id"),
        )


class MessageCreateSerializer(api_input.Serializer):
    to = EmailAddressField(max_length=254)
    # Copies, each validated like `to`; with `to` at most EMAILHUB_MESSAGE_MAX_RECIPIENTS.
    cc = serializers.ListField(child=EmailAddressField(max_length=254), required=False)
    bcc = serializers.ListField(child=EmailAddressField(max_length=254), required=False)
    # `from` is a keyword in Python, so the field is added under its JSON name in __init__.
    reply_to = serializers.CharField(max_length=254, required=False)
    subject = serializers.CharField(
        max_length=998, required=False, trim_whitespace=False, validators=[ONE_LINE]
    )
    html = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    text = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    template = serializers.SlugField(max_length=100, required=False)
    # A field named like DRF's Field.context attribute: the serializer metaclass moves declared
    # fields out of the class, so there is no clash at run time.
    context = api_input.JSONObjectField(  # type: ignore[assignment]
        required=False, default=dict, limits=(limits.CONTEXT_KEYS, limits.CONTEXT_BYTES)
    )
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.HIGH)
    send_at = serializers.DateTimeField(required=False)
    # RFC 8058 one-click unsubscribe headers and {{ unsubscribe_url }} on a transactional message
    # (a newsletter sent through the API); an unsubscribed address then no longer gets it.
    unsubscribe = serializers.BooleanField(required=False, default=False)
    # Open pixel / tracked links (docs/delivery.md, "Tracking"); off unless asked for.
    track_opens = serializers.BooleanField(required=False, default=False)
    track_clicks = serializers.BooleanField(required=False, default=False)
    # Stored with the message, returned with it and with its events, filtered and cancelled by;
    # never sent to the recipient.
    tags = api_input.TagsField(required=False)
    metadata = api_input.MetadataField(required=False)
    # Extra headers sent unchanged (In-Reply-To, References, X-Entity-Ref-ID…); those emailhub
    # writes or that change routing or authentication are refused (delivery.headers).
    headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        validators=[MaxLengthValidator(MAX_HEADERS, message=f"at most {MAX_HEADERS} headers")],
    )

    # Files, each decoded once here (the validated value holds their bytes); at most
    # EMAILHUB_ATTACHMENTS_MAX_COUNT, of at most EMAILHUB_ATTACHMENTS_MAX_BYTES decoded in all.
    attachments = serializers.ListField(
        child=AttachmentSerializer(),
        required=False,
        validators=[MaxItems(limits.ATTACHMENTS_COUNT, "attachments")],
        help_text="files sent with the message: at most EMAILHUB_ATTACHMENTS_MAX_COUNT (10), "
        "EMAILHUB_ATTACHMENTS_MAX_BYTES (10 MiB) decoded in all (a 413 beyond)",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = serializers.CharField(max_length=254, required=False)

    def validate_to(self, value: str) -> str:
        return _recipient(value)

    def validate_cc(self, value: list[str]) -> list[str]:
        return _copies(value)

    def validate_bcc(self, value: list[str]) -> list[str]:
        return _copies(value)

    def validate_send_at(self, value: datetime) -> datetime:
        return within_horizon(value)

    def validate_reply_to(self, value: str) -> str:
        return validate_mailbox(value)

    def validate_headers(self, value: dict[str, str]) -> dict[str, str]:
        problems = header_problems(value)
        if problems:
            raise serializers.ValidationError([f"{name!r} {why}" for name, why in problems.items()])
        return value

    def validate_attachments(self, value: list[NewAttachment]) -> list[NewAttachment]:
        total, limit = sum(len(a.content) for a in value), limits.ATTACHMENTS_BYTES.value()
        if total > limit:
            # A size, so a 413 as for a body too large, naming this limit (core.limits).
            raise RequestTooLarge(
                limit,
                limits.ATTACHMENTS_BYTES.setting,
                message=f"the attachments are {total} bytes decoded; at most {limit} "
                f"({limits.ATTACHMENTS_BYTES.setting})",
            )
        seen: dict[str, int] = {}
        errors: dict[str, Any] = {}
        for index, attachment in enumerate(value):
            if attachment.content_id is None:
                continue
            first = seen.setdefault(attachment.content_id, index)
            if first != index:
                # RFC 2392: a Content-ID names one body part of the message.
                errors[str(index)] = {
                    "content_id": [f"repeats attachment {first}'s; each inline image has its own"]
                }
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_context(self, value: dict[str, Any]) -> dict[str, Any]:
        for key, refusal in RESERVED_CONTEXT_KEYS.items():
            if key in value:
                raise serializers.ValidationError(f"{key!r} {refusal}")
        return value

    def validate_template(self, value: str) -> Template:
        # A batch passes a `templates` dict in the context: each name is looked up once.
        # `self.root.context`: this serializer's own `context` name is the message field.
        found: dict[str, Template | None] = self.root.context.get("templates", {})
        if value in found:
            template = found[value]
        else:
            template = found[value] = Template.objects.filter(name=value).first()
        if template is None:
            raise serializers.ValidationError(f"no template named {value!r}")
        return template

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        _check_recipients(attrs)
        raw_from = self.initial_data.get("from") if isinstance(self.initial_data, dict) else None
        if raw_from is not None:
            try:
                attrs["from_email"] = validate_mailbox(str(raw_from))
            except serializers.ValidationError as exc:
                raise serializers.ValidationError({"from": exc.detail}) from None
        if attrs.get("template") is not None:
            if "subject" in attrs or "html" in attrs or "text" in attrs:
                raise serializers.ValidationError(
                    {"template": "give either a template or subject with html/text, not both"}
                )
        else:
            errors = {}
            if not attrs.get("subject"):
                errors["subject"] = "required when no template is given"
            if not attrs.get("html") and not attrs.get("text"):
                errors["text"] = "give html, text or both when no template is given"
            if errors:
                raise serializers.ValidationError(errors)
        return attrs


def new_message(data: dict[str, Any]) -> NewMessage:
    """The message a valid MessageCreateSerializer describes (`POST /messages` and each item of
    `POST /messages/batch`)."""
    return NewMessage(
        to=data["to"],
        priority=data["priority"],
        from_email=data.get("from_email"),
        reply_to=data.get("reply_to"),
        subject=data.get("subject"),
        html=data.get("html"),
        text=data.get("text"),
        template=data.get("template"),
        context=data.get("context") or None,
        send_at=data.get("send_at"),
        unsubscribe=data["unsubscribe"],
        track_opens=data["track_opens"],
        track_clicks=data["track_clicks"],
        tags=tuple(data.get("tags") or ()),
        metadata=data.get("metadata") or None,
        headers=data.get("headers") or None,
        cc=tuple(data.get("cc") or ()),
        bcc=tuple(data.get("bcc") or ()),
        attachments=tuple(data.get("attachments") or ()),
    )


class AttachmentInfoSerializer(serializers.Serializer):
    """What is kept of an attachment to show: never its content."""

    filename = serializers.CharField()
    content_type = serializers.CharField()
    size = serializers.IntegerField(help_text="bytes, decoded")
    sha256 = serializers.CharField(help_text="hex SHA-256 of the content")
    content_id = serializers.CharField(allow_null=True, help_text="set for an inline image")


class MessageSerializer(api_input.ModelSerializer):
    to = EmailAddressField(source="to_email")
    template: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    tags = serializers.ListField(child=serializers.CharField(), read_only=True)
    metadata = serializers.DictField(child=serializers.CharField(), read_only=True)
    cc = serializers.ListField(child=EmailAddressField(), read_only=True)
    bcc = serializers.ListField(child=EmailAddressField(), read_only=True)
    attachments = AttachmentInfoSerializer(many=True, read_only=True, help_text="[] when none")

    class Meta:
        model = Message
        fields = [
            "id",
            "status",
            "priority",
            "to",
            "from_email",
            "subject",
            "template",
            "campaign",
            "provider",
            "provider_message_id",
            "attempts",
            "last_error",
            "created_at",
            "queued_at",
            "due_at",
            "sent_at",
            "tags",
            "metadata",
            "cc",
            "bcc",
            "attachments",
        ]
        read_only_fields = fields

    def to_representation(self, instance: Message) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        return {
            **data,
            **_attached(data.get("tags") or _campaign_tags(instance), data.get("metadata")),
            "cc": data.get("cc") or [],
            "bcc": data.get("bcc") or [],
            "attachments": data.get("attachments") or [],
        }


def _campaign_tags(message: Message) -> list[str] | None:
    """A campaign message's tags: its campaign's (annotated by delivery.selectors, else read)."""
    if message.campaign_id is None:
        return None
    if hasattr(message, "campaign_tags"):
        return message.campaign_tags  # type: ignore[no-any-return]
    return message.campaign.tags if message.campaign is not None else None


def _attached(tags: list[str] | None, metadata: dict[str, str] | None) -> dict[str, Any]:
    """A message's tags and metadata as the API shows them: [] and {} when it has none."""
    return {"tags": tags or [], "metadata": metadata or {}}


class EmailEventSerializer(api_input.ModelSerializer):
    # The message's own, on every event of it (delivery.selectors.with_message_tags).
    tags = serializers.ListField(child=serializers.CharField(), source="message_tags", read_only=True)
    metadata = serializers.DictField(child=serializers.CharField(), source="message_metadata", read_only=True)

    class Meta:
        model = EmailEvent
        fields = [
            "id",
            "message",
            "kind",
            "provider",
            "provider_event_id",
            "recipient",
            "bounce",
            "detail",
            "occurred_at",
            "created_at",
            "payload",
            "tags",
            "metadata",
        ]
        read_only_fields = fields

    def to_representation(self, instance: EmailEvent) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        return {**data, **_attached(data.get("tags"), data.get("metadata"))}


class MessageRescheduleSerializer(api_input.ClosedSerializer):
    """`PATCH /api/v1/messages/{id}`: a new send time; now or past sends it at once."""

    required_on_patch = True  # the view validates the whole body (core.api_schema)

    send_at = serializers.DateTimeField()

    def validate_send_at(self, value: datetime) -> datetime:
        return within_horizon(value)


class CancelCarryingSerializer(api_input.ClosedSerializer):
    """`POST /api/v1/messages/cancel`: cancel the calling key's messages by what it knows."""

    exactly_one_field = True  # tag or idempotency_key (core.api_schema)

    tag = serializers.RegexField(
        TAG_PATTERN, max_length=128, required=False, help_text="every message carrying this tag"
    )
    idempotency_key = serializers.CharField(
        min_length=1, max_length=255, required=False, trim_whitespace=False,
        help_text="the message accepted under this Idempotency-Key",
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) != 1:
            raise serializers.ValidationError(
                {
                    "tag": ["give either tag or idempotency_key"],
                    "idempotency_key": ["give either tag or idempotency_key"],
                }
            )
        return attrs


class CancelReportSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField(help_text="moved to cancelled by this request")
    already_cancelled = serializers.IntegerField()
    past_cancelling = serializers.IntegerField(
        help_text="sending, sent, failed or suppressed: too late to cancel"
    )


class MessageFilterSerializer(api_input.QueryParameters):
    """The query parameters of GET /api/v1/messages (besides the cursor and page size)."""

    tag = serializers.RegexField(
        TAG_PATTERN, max_length=128, required=False, help_text="messages carrying this tag"
    )


class EventFilterSerializer(api_input.QueryParameters):
    """The query parameters of GET /api/v1/events; anything else in the query is a 400."""

    kind = serializers.ChoiceField(choices=EmailEvent.Kind.choices, required=False)
    provider = serializers.CharField(max_length=20, required=False)
    message = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    campaign = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    recipient = serializers.CharField(max_length=254, required=False, help_text="an exact address, any case")
    bounce = serializers.ChoiceField(choices=EmailEvent.Bounce.choices, required=False)
    tag = serializers.RegexField(
        TAG_PATTERN,
        max_length=128,
        required=False,
        help_text="events of messages carrying this tag",
    )
    since = serializers.DateTimeField(required=False)  # occurred_at >= since
    until = serializers.DateTimeField(required=False)  # occurred_at < until

    # Pagination's own parameters, validated by the paginator.
    PAGINATION = {"cursor", "page_size"}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields) - self.PAGINATION
        if unknown:
            raise serializers.ValidationError(
                f"unknown filter {', '.join(sorted(unknown))}; use {', '.join(self.fields)}"
            )
        if "since" in attrs and "until" in attrs and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": "must be after since"})
        if "recipient" in attrs:
            attrs["recipient"] = attrs["recipient"].lower()
        return attrs
