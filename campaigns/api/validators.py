"""Field validators shared by every API that takes an address or a header value."""

from __future__ import annotations

from email.utils import parseaddr

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from rest_framework import serializers


def no_crlf(value: str) -> str:
    """A header value must not be able to start a new header line."""
    if "\r" in value or "\n" in value:
        raise serializers.ValidationError("must not contain line breaks (CR or LF)")
    return value


def validate_mailbox(value: str, *, allow_blank: bool = False) -> str:
    """`a@example.com` or `Ann <a@example.com>`; with `allow_blank`, "" (use the default sender)."""
    if allow_blank and not value:
        return value
    no_crlf(value)
    _, address = parseaddr(value)
    try:
        validate_email(address)
    except DjangoValidationError:
        raise serializers.ValidationError(f"{value!r} is not a valid email address") from None
    return value.strip()
