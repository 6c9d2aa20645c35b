"""Configured limits on what a client may give, and how a refusal names the one it hit.

Each limit is a setting (emailhub/settings.py, README "Settings"), read when it is checked, never
at import. A refusal is an ordinary validation error whose *code* is the setting's name, so it
keeps its identity through DRF's nesting of field errors (a batch item's `messages.3.context`)
and through a Django form (the admin): `core.api_errors` finds the code in a 400 and adds the
error shape's `limit` member (`{"name": setting, "value": n}`), with `code: limit_exceeded`.

- `SCHEDULE_HORIZON`: no instant a client schedules (a message's `send_at`, a campaign's `at`,
  `local_date`, optimized `window_start`) lies further ahead than this many days
  (`beyond_horizon`, called by the message serializer and `campaigns.lifecycle.check_schedule`).
- `CONTEXT_KEYS`/`CONTEXT_BYTES`, `ATTRIBUTES_KEYS`/`ATTRIBUTES_BYTES`: a message's `context`
  and a contact's `attributes` hold at most so many top-level keys and so many bytes of compact
  UTF-8 JSON (`MaxKeys`, `MaxJSONBytes`: Django validators, so the API's field and the admin's
  form field run the same ones). The key limit is also the schema's `maxProperties`
  (drf-spectacular reads a MaxLengthValidator's limit); no JSON Schema keyword bounds bytes.
- `MESSAGE_TAGS`/`TAG_LENGTH`, `METADATA_KEYS`/`METADATA_BYTES`: a message's `tags` (how many,
  how long each) and its flat string `metadata` (keys, compact UTF-8 JSON bytes).
- `MESSAGE_RECIPIENTS`: a message's `to`, `cc` and `bcc` together.
- `ATTACHMENTS_COUNT`, `ATTACHMENTS_BYTES`: how many files a message attaches (a 400) and their
  decoded total (a 413, core.api_json.RequestTooLarge naming the setting: it is a size).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.validators import BaseValidator, MaxLengthValidator
from django.utils import timezone


@dataclass(frozen=True)
class Limit:
    setting: str  # the setting's (and environment variable's) name

    def value(self) -> int:
        return int(getattr(settings, self.setting))

    def error_member(self) -> dict[str, Any]:
        """The error shape's `limit` member."""
        return {"name": self.setting, "value": self.value()}


SCHEDULE_HORIZON = Limit("EMAILHUB_SCHEDULE_HORIZON_DAYS")
CONTEXT_KEYS = Limit("EMAILHUB_CONTEXT_MAX_KEYS")
CONTEXT_BYTES = Limit("EMAILHUB_CONTEXT_MAX_BYTES")
ATTRIBUTES_KEYS = Limit("EMAILHUB_ATTRIBUTES_MAX_KEYS")
ATTRIBUTES_BYTES = Limit("EMAILHUB_ATTRIBUTES_MAX_BYTES")
MESSAGE_TAGS = Limit("EMAILHUB_MESSAGE_MAX_TAGS")
TAG_LENGTH = Limit("EMAILHUB_TAG_MAX_LENGTH")
METADATA_KEYS = Limit("EMAILHUB_METADATA_MAX_KEYS")
METADATA_BYTES = Limit("EMAILHUB_METADATA_MAX_BYTES")
MESSAGE_RECIPIENTS = Limit("EMAILHUB_MESSAGE_MAX_RECIPIENTS")
ATTACHMENTS_COUNT = Limit("EMAILHUB_ATTACHMENTS_MAX_COUNT")
ATTACHMENTS_BYTES = Limit("EMAILHUB_ATTACHMENTS_MAX_BYTES")

LIMITS = {limit.setting: limit for limit in (SCHEDULE_HORIZON, CONTEXT_KEYS, CONTEXT_BYTES, ATTRIBUTES_KEYS,
                                             ATTRIBUTES_BYTES, MESSAGE_TAGS, TAG_LENGTH, METADATA_KEYS,
                                             METADATA_BYTES, MESSAGE_RECIPIENTS, ATTACHMENTS_COUNT,
                                             ATTACHMENTS_BYTES)}  # fmt: skip


def beyond_horizon(instant: datetime, *, now: datetime | None = None) -> str | None:
    """Why `instant` is too far ahead to schedule, or None. The horizon's last instant is
    accepted. A refusal's code is SCHEDULE_HORIZON.setting (see the module's docstring)."""
    days = SCHEDULE_HORIZON.value()
    if instant <= (now or timezone.now()) + timedelta(days=days):
        return None
    return (
        f"{instant.isoformat()} is more than {days} days ahead ({SCHEDULE_HORIZON.setting}); "
        "give an earlier one"
    )


def json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON: about what jsonb stores and a task carries."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


class MaxKeys(MaxLengthValidator):
    """At most `limit` top-level keys in a JSON object."""

    def __init__(self, limit: Limit) -> None:
        super().__init__(
            limit.value,  # a callable: read when checked (and by drf-spectacular for maxProperties)
            message=f"has %(show_value)d keys; at most %(limit_value)d ({limit.setting})",
        )
        self.code = limit.setting


class MaxItems(MaxLengthValidator):
    """At most `limit` items in a list, or characters in a string (`noun` says which)."""

    def __init__(self, limit: Limit, noun: str) -> None:
        super().__init__(
            limit.value,
            message=f"has %(show_value)d {noun}; at most %(limit_value)d ({limit.setting})",
        )
        self.code = limit.setting


class MaxJSONBytes(BaseValidator):
    """At most `limit` bytes of compact UTF-8 JSON."""

    def __init__(self, limit: Limit) -> None:
        super().__init__(
            limit.value,
            message=f"is %(show_value)d bytes as JSON; at most %(limit_value)d ({limit.setting})",
        )
        self.code = limit.setting

    def compare(self, a: int, b: int) -> bool:
        return a > b

    def clean(self, x: Any) -> int:
        return json_size(x)


def object_limits(keys: Limit, size: Limit) -> list[BaseValidator]:
    return [MaxKeys(keys), MaxJSONBytes(size)]


def limit_hit(detail: Any) -> Limit | None:
    """The first configured limit named by an error code in DRF error `detail` (nested dicts
    and lists of ErrorDetail), or in a Django form's error `code`s."""
    pending = [detail]
    while pending:
        item = pending.pop(0)
        if isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        else:
            code = getattr(item, "code", None)
            if isinstance(code, str) and code in LIMITS:
                return LIMITS[code]
    return None
