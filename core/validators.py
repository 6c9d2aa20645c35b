"""Field validators shared by every API (and admin form) that takes an address, a header value
or JSON that PostgreSQL must store, and the admin's form base that validates with the API."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from email import policy
from email.errors import InvalidHeaderDefect
from email.utils import parseaddr
from typing import Any

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator, validate_email
from django.db import models
from django.forms.fields import InvalidJSONInput
from rest_framework import serializers
from rest_framework.relations import RelatedField

# U+0000 and lone surrogates: the characters a Python str can hold and PostgreSQL cannot (NUL is
# refused in text and jsonb; a surrogate cannot be encoded to UTF-8 by psycopg).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_reason(value: str) -> str | None:
    """Why PostgreSQL cannot store `value` (text or a jsonb string), or None when it can."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return f"contains U+0000 (NUL) at character {found.start()}, which cannot be stored"
    return f"contains an unpaired surrogate U+{ord(char):04X} at character {found.start()}, which is not text"


def json_storage_problem(value: Any, *, max_depth: int) -> str | None:
    """Why PostgreSQL cannot store `value` (decoded JSON) as jsonb, or None: a key or string
    `unstorable_reason` refuses, NaN or ±Infinity (`json.loads` makes them of `NaN`, `Infinity`
    and `1e999`; jsonb has no such numbers), or arrays/objects nested deeper than `max_depth`
    (json.dumps recurses once per level, and runs out of stack near 1,000). One walk without
    recursion; the answer names the place as a path (`bounce.bouncedRecipients[2].status`),
    never the text, so it can be logged."""
    # Containers only are queued, with their depth and trail ((parent trail, key) pairs, made a
    # path only for the answer); scalars are checked where they are met.
    pending: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while pending:
        item, depth, trail = pending.pop()
        if isinstance(item, dict):
            pairs: Any = item.items()
        elif isinstance(item, list):
            pairs = enumerate(item)
        else:
            problem = _scalar_problem(item)
            if problem:
                return f"{_path(trail)} {problem}"
            continue
        if depth > max_depth:
            return f"{_path(trail)} is nested deeper than {max_depth} levels"
        for key, child in pairs:
            if isinstance(key, str) and _unstorable(key):
                return f"{_path(trail)} has a key that {unstorable_reason(key)}"
            if isinstance(child, dict | list):
                pending.append((child, depth + 1, (trail, key)))
            elif isinstance(child, str | float):
                problem = _scalar_problem(child)
                if problem:
                    return f"{_path((trail, key))} {problem}"
    return None


def _unstorable(text: str) -> bool:
    # An ASCII string holds no surrogate, and `in` is ten times faster than the regex.
    return "\x00" in text if text.isascii() else _UNSTORABLE.search(text) is not None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return unstorable_reason(value) if _unstorable(value) else None
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value!r}, a number JSON does not have"
    return None


def _path(trail: tuple[Any, ...]) -> str:
    parts: list[str] = []
    while trail:
        trail, key = trail
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "(the whole value)"


def validate_storable_json(value: Any) -> None:
    """Django validator for JSON form fields (admin): every key and string must be storable."""
    pending = [value]
    while pending:  # no recursion: the admin's JSON is not depth-capped like the API's
        item = pending.pop()
        if isinstance(item, str):
            strings = [item]
        elif isinstance(item, dict):
            strings = [key for key in item if isinstance(key, str)]
            pending.extend(item.values())
        elif isinstance(item, list):
            strings = []
            pending.extend(item)
        else:
            strings = []
        for text in strings:
            reason = unstorable_reason(text)
            if reason:
                raise DjangoValidationError(f"{text[:40]!r} {reason}", code="unstorable")


class StorableJSONFormField(forms.JSONField):
    """The admin's JSON field, refusing what PostgreSQL cannot store with a form error."""

    default_validators = [validate_storable_json]

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Re-shown as typed: decoded, a lone surrogate could not even be written into the page.
        value = super().bound_data(data, initial)
        try:
            validate_storable_json(value)
        except DjangoValidationError:
            return InvalidJSONInput(data)
        return value


# `formfield_overrides` for a ModelAdmin whose model has a JSONField: its form refuses what
# PostgreSQL cannot store with a form error instead of a 500 at save. (Django's text form fields
# already refuse NUL.)
STORABLE_JSON_FORMFIELDS: dict[type[models.Field], dict[str, Any]] = {
    models.JSONField: {"form_class": StorableJSONFormField},
}


def _form_errors(detail: Any, prefix: str = "") -> list[DjangoValidationError]:
    """DRF error detail (a list, or a dict by key for an object's or a list's items) as Django
    form errors, each keeping its code (a limit's setting, core.limits)."""
    if isinstance(detail, dict):
        return [error for key, inner in detail.items() for error in _form_errors(inner, f"{prefix}{key}: ")]
    if isinstance(detail, list):
        return [error for inner in detail for error in _form_errors(inner, prefix)]
    return [DjangoValidationError(f"{prefix}{detail}", code=getattr(detail, "code", "invalid"))]


class ApiValidatedForm(forms.ModelForm):
    """Admin form base: each field the API also takes is validated by the API's own serializer
    (`api_serializer`): its DRF field (type, length, choices, validators, limits) and its
    `validate_<field>` method, so what the API answers with a 400 is a form error here, and the
    value saved is the one the API would save (an address lower-cased). Before, the admin's
    model forms knew only the model's rules and stored addresses (`x@y`, two of them) and
    choices the API refuses, which then broke the API's own responses.

    Relations (a template, a list) are left to the form's choice fields, which offer existing
    rows only; read-only API fields (a campaign's window, set by scheduling) to the form."""

    api_serializer: type[serializers.Serializer]

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        serializer = self.api_serializer(instance=self.instance if self.instance.pk else None)
        for name, field in serializer.fields.items():
            if field.read_only or isinstance(field, RelatedField) or name not in cleaned:
                continue  # not the API's to take, or already refused by the form itself
            try:
                value = field.run_validation(cleaned[name])
                check = getattr(serializer, f"validate_{name}", None)
                if check is not None:
                    value = check(value)
            except serializers.ValidationError as exc:
                self.add_error(name, _form_errors(exc.detail))
            except DjangoValidationError as exc:
                self.add_error(name, exc)
            else:
                cleaned[name] = value
        # The serializer's "at least one of" rule (core.api_input.OneOfRequiredMixin: a
        # campaign's audience), on the form's own choices: relations are the form's fields.
        names = [name for name in getattr(serializer, "one_of_required", ()) if name in self.fields]
        if names and not any(name in self.errors for name in names):
            missing = missing_one_of(names, {name: cleaned.get(name) for name in names})
            if missing:
                self.add_error(names[0], missing)
        return cleaned


def missing_one_of(names: Sequence[str], values: dict[str, Any]) -> str | None:
    """Why `values` lacks every one of `names` (each None), or None when one is given."""
    if all(values.get(name) is None for name in names):
        return f"give at least one of {', '.join(names)}"
    return None


_LINE_BREAK = "must not contain line breaks (CR or LF)"
# The same rule as a validator of a field: the OpenAPI schema shows its pattern (drf-spectacular).
ONE_LINE = RegexValidator(r"^[^\r\n]*\Z", _LINE_BREAK, code="line_break")


def no_crlf(value: str) -> str:
    """A header value must not be able to start a new header line."""
    if "\r" in value or "\n" in value:
        raise serializers.ValidationError(_LINE_BREAK)
    return value


def parse_mailbox(value: str) -> tuple[str, str]:
    """(display name, address) of exactly one RFC 5322 mailbox, or ValueError saying why not.

    `email.utils.parseaddr`, which the MIME writer uses, is lenient: it reads
    "evil@example.com Bcc: x@y.z" as the address "evil@example.comBcc", the first of two
    addresses, or a group's member, and drops comments. So a value is accepted only when the
    strict parser (`email.policy.default`, RFC 5322) finds one mailbox, not in a group, with no
    syntax defect, and parseaddr reads the same display name and address: what is sent is then
    exactly what was given.
    """
    if "\r" in value or "\n" in value:
        raise ValueError("must not contain line breaks (CR or LF)")
    try:
        header = policy.default.header_factory("From", value)
    except Exception:  # noqa: BLE001 — CPython's parser is not total (see below)
        # It fails on some values instead of recording a defect: "ann@" raises IndexError in
        # get_domain, ":;:" AttributeError on a group taken for a mailbox. Each was a 500.
        raise ValueError(f"{value!r} is not one RFC 5322 mailbox (address or Name <address>)") from None
    if any(isinstance(defect, InvalidHeaderDefect) for defect in header.defects):
        raise ValueError(f"{value!r} is not one RFC 5322 mailbox (address or Name <address>)")
    if len(header.groups) != 1 or header.groups[0].display_name is not None:
        raise ValueError(f"{value!r} must be exactly one mailbox, not a list or a group")
    (mailbox,) = header.groups[0].addresses or (None,)
    if mailbox is None:
        raise ValueError(f"{value!r} has no address")
    parsed = (mailbox.display_name, mailbox.addr_spec)
    if parseaddr(value) != parsed:
        raise ValueError(
            f"{value!r} is ambiguous (comments or encoded words); give the name as plain text, "
            'e.g. "Ann B" <ann@example.com>'
        )
    return parsed


def validate_mailbox(value: str, *, allow_blank: bool = False) -> str:
    """`a@example.com`, `Ann <a@example.com>` or `"Ann, B" <a@example.com>`, stored as given
    (surrounding blanks aside); with `allow_blank`, "" (use the default sender)."""
    if allow_blank and not value:
        return value
    try:
        _, address = parse_mailbox(value)
    except ValueError as exc:
        raise serializers.ValidationError(str(exc)) from None
    try:
        validate_email(address)
    except DjangoValidationError:
        raise serializers.ValidationError(f"{value!r} is not a valid email address") from None
    return value.strip()


# A tag: a short identifier an application filters and cancels by (`order-1234`, `otp:login`).
TAG_PATTERN = r"^[A-Za-z0-9_.:-]+\Z"
TAG_RULE = "letters, digits and _ . : - only"
