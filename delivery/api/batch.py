"""POST /api/v1/messages/batch: up to EMAILHUB_API_BATCH_MAX_MESSAGES messages, one transaction.

Items are validated one by one (delivery/api/serializing.py; with the `serializers` fast path,
one serializer per thread, where DRF would build a serializer's fields per item) and stored by
one INSERT, their send tasks by one outbox INSERT (delivery.services.messages.accept_batch).
What a client sees is DESCRIPTION.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxLengthValidator
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import api_input
from core.api_json import RequestTooLarge
from core.limits import limit_hit
from delivery.api.serializers import MessageCreateSerializer, new_message
from delivery.api.serializing import validated
from delivery.exceptions import BATCH_LIMIT_SETTING, BatchConflict, BatchConflictError, BatchTooLarge
from delivery.models import ApiKey, ApiKeyScope
from delivery.services.messages import BatchItem, accept_batch, request_fingerprint

ENVELOPE = {"messages", "partial"}
DESCRIPTION = """Up to 1,000 messages (EMAILHUB_API_BATCH_MAX_MESSAGES) in one request and one transaction.

Each item is what POST /api/v1/messages takes, plus its own optional `idempotency_key` (the same
key space as that endpoint's Idempotency-Key header, per API key: the same key and item answer the
first message again, `replayed: true`). The results come in the items' order, one per item.

A bad item is reported by its index. By default the batch is all-or-nothing: any bad item is a
400 naming every bad index (`fields.messages.<index>.<field>`) and nothing is stored; an item
reusing a key with another body is a 422 the same way. With `"partial": true` the good items are
accepted and each bad one gets its own `error` in its result (a 202 even when none was good).
Send tasks go out per priority: `normal` and `low` in chunks (one task per 100 or 500 messages),
`critical` and `high` on their own queues as single messages do."""


class BatchItemSerializer(MessageCreateSerializer):
    idempotency_key = serializers.CharField(
        min_length=1,
        max_length=255,
        required=False,
        help_text="retry safely: the same key and item answer the first message again (shared with "
        "the Idempotency-Key header of POST /messages, per API key)",
    )


class BatchSerializer(api_input.Serializer):
    """The request's documented shape (the view checks the envelope itself, then each item)."""

    refuses_unknown_fields = True  # the envelope takes messages and partial only (core.api_schema)

    messages = serializers.ListField(
        child=BatchItemSerializer(),
        min_length=1,
        # The schema's maxItems, read when it is generated (the view answers 413 beyond it).
        validators=[MaxLengthValidator(lambda: settings.EMAILHUB_API_BATCH_MAX_MESSAGES)],
        help_text="1 to EMAILHUB_API_BATCH_MAX_MESSAGES (1,000) items",
    )
    # Declared fields leave the class (DRF's metaclass), so these names do not shadow
    # BaseSerializer.partial / Serializer.fields at run time; mypy cannot know that.
    partial = serializers.BooleanField(  # type: ignore[assignment]
        required=False,
        default=False,
        help_text="false (default): any bad item rejects the whole batch; true: bad items are left "
        "out and reported, the others accepted",
    )


class LimitSerializer(api_input.Serializer):
    name = serializers.CharField(help_text="the setting")
    value = serializers.IntegerField()


class BatchItemErrorSerializer(api_input.Serializer):
    status = serializers.IntegerField(help_text="400 (bad field) or 422 (key reused with another body)")
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))  # type: ignore[assignment]
    limit = LimitSerializer(required=False, help_text="the limit the item hit, as in the error shape")


class BatchResultSerializer(api_input.Serializer):
    index = serializers.IntegerField(help_text="the item's position in `messages`, from 0")
    id = serializers.IntegerField(required=False, help_text="the message (absent for a rejected item)")
    status = serializers.ChoiceField(choices=["queued", "scheduled", "sending", "sent", "failed",
                                              "suppressed", "cancelled", "retry_wait"], required=False)  # fmt: skip
    replayed = serializers.BooleanField(
        required=False, help_text="an earlier message returned again for its idempotency_key"
    )
    error = BatchItemErrorSerializer(required=False, help_text="why the item was rejected (partial only)")


class BatchResponseSerializer(api_input.Serializer):
    accepted = serializers.IntegerField()
    rejected = serializers.IntegerField()
    results = BatchResultSerializer(many=True, help_text="one per item, in the request's order")


def _indexes(indexes: list[int]) -> str:
    shown = ", ".join(map(str, indexes[:20]))
    return shown + (f" and {len(indexes) - 20} more" if len(indexes) > 20 else "")


def _flat(name: str, detail: Any, into: dict[str, list[str]]) -> dict[str, list[str]]:
    """DRF's nested error detail as {"field" or "field.key": [messages]}."""
    if isinstance(detail, dict):
        for key, inner in detail.items():
            _flat(f"{name}.{key}" if name else str(key), inner, into)
    elif isinstance(detail, list):
        for inner in detail:
            _flat(name, inner, into)
    else:
        into.setdefault(name or "non_field_errors", []).append(str(detail))
    return into


def _item_error(status_code: int, code: str, detail: Any) -> dict[str, Any]:
    fields = _flat("", detail, {})
    general = fields.pop("non_field_errors", None)
    message = "; ".join(general) if general else "invalid input: " + ", ".join(fields)
    error = {"status": status_code, "code": code, "message": message, "fields": fields}
    hit = limit_hit(detail)  # as the error shape does for a whole request (core.api_errors)
    if hit is not None:
        error.update(code="limit_exceeded", limit=hit.error_member())
    return error


CONFLICT = "this idempotency_key was already used with a different message"


class MessageBatchView(APIView):
    required_scopes = {"POST": (ApiKeyScope.SEND,)}

    @extend_schema(
        request=BatchSerializer,
        responses={
            202: BatchResponseSerializer,
            400: OpenApiResponse(description="a bad envelope, or (all-or-nothing) bad items by index"),
            413: OpenApiResponse(
                description=f"more messages than {BATCH_LIMIT_SETTING} (1,000), too large a body, or "
                "a message's attachments beyond EMAILHUB_ATTACHMENTS_MAX_BYTES"
            ),
            422: OpenApiResponse(
                description="(all-or-nothing) items reusing an idempotency_key with another body"
            ),
        },
        description=DESCRIPTION,
    )
    def post(self, request: Request) -> Response:
        body = request.data
        if not isinstance(body, dict):
            raise exceptions.ValidationError({"non_field_errors": ["send a JSON object with `messages`"]})
        unknown = sorted(set(body) - ENVELOPE)
        if unknown:
            raise exceptions.ValidationError(
                {name: ["unknown field; a batch has messages and partial"] for name in unknown}
            )
        messages, partial = body.get("messages"), body.get("partial", False)
        if not isinstance(partial, bool):
            raise exceptions.ValidationError({"partial": ["must be true or false"]})
        limit = settings.EMAILHUB_API_BATCH_MAX_MESSAGES
        if not isinstance(messages, list) or not messages:
            raise exceptions.ValidationError({"messages": [f"give a list of 1 to {limit} messages"]})
        if len(messages) > limit:
            raise BatchTooLarge(len(messages), limit)

        context: dict[str, Any] = {"templates": {}}  # each template name looked up once
        items: list[BatchItem | None] = []
        invalid: dict[int, Any] = {}
        for index, raw in enumerate(messages):
            try:
                data = validated(BatchItemSerializer, raw, context)
            except exceptions.ValidationError as exc:
                invalid[index] = exc.detail
                items.append(None)
                continue
            except RequestTooLarge as exc:  # a size, not a bad field: the whole request, by index
                exc.detail = exceptions.ErrorDetail(f"messages.{index}: {exc.detail}", code=exc.default_code)
                raise
            key = data.get("idempotency_key")
            fingerprint = None
            if key is not None:
                fingerprint = request_fingerprint({k: v for k, v in raw.items() if k != "idempotency_key"})
            items.append(BatchItem(new_message(data), key, fingerprint))
        if invalid and not partial:
            raise exceptions.ValidationError(
                {
                    "non_field_errors": [
                        f"{len(invalid)} of {len(messages)} messages are invalid (index {_indexes(sorted(invalid))});"
                        " nothing was accepted (send `partial: true` to accept the valid ones)"
                    ],
                    "messages": {str(index): detail for index, detail in invalid.items()},
                }
            )

        good = [index for index, item in enumerate(items) if item is not None]
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        try:
            accepted = accept_batch([items[i] for i in good], api_key=api_key, partial=partial)  # type: ignore[misc]
        except BatchConflict as exc:
            indexes = [good[j] for j in exc.indexes]
            raise BatchConflictError(
                {
                    "non_field_errors": [
                        f"{len(indexes)} message(s) reuse an idempotency_key with another body (index "
                        f"{_indexes(indexes)}); nothing was accepted"
                    ],
                    "messages": {str(index): {"idempotency_key": [CONFLICT]} for index in indexes},
                }
            ) from None

        results: list[dict[str, Any]] = [{"index": index} for index in range(len(messages))]
        for index, detail in invalid.items():
            results[index]["error"] = _item_error(400, "invalid", detail)
        conflicts = {good[j] for j in accepted.conflicts}
        for j, index in enumerate(good):
            if index in conflicts:
                results[index]["error"] = _item_error(
                    422, "idempotency_conflict", {"idempotency_key": [CONFLICT]}
                )
            else:
                results[index].update(
                    id=accepted.ids[j], status=accepted.statuses[j], replayed=accepted.replayed[j]
                )
        rejected = len(invalid) + len(conflicts)
        return Response(
            {"accepted": len(messages) - rejected, "rejected": rejected, "results": results},
            status=status.HTTP_202_ACCEPTED,
        )
