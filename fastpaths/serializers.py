"""DRF serializers built once per thread and reused, instead of once per request (or batch item).

Replaces: `Serializer(data=…, context=…)` then `is_valid(raise_exception=True)`, and
`Serializer(instance).data` (delivery/api/serializing.py, the plain path). DRF builds a
serializer's fields on every instantiation (a deepcopy of the declared fields, ModelSerializer's
field mapping). A kept instance validates and represents the same way: `run_validation` is what
`is_valid` calls, and its ValidationError carries the detail `is_valid(raise_exception=True)`
raises; the per-call state (`initial_data`, DRF's private `_context`) is set only while one call
runs, on one thread.

Gain: 11% of POST /api/v1/messages for the response and 5.6% for the input (issue 13's profile,
docs/performance.md "The accept path"), and the field build 1,000 times per batch. Also (issue 21):
a JSON body's absent optional fields are not run at all (`_skipping`), ~50 µs of a message without
the new fields.

Pinned by: the API tests, run with this switch on and off (tests/conftest.py `fast_paths`).

Off switch: leave `serializers` out of EMAILHUB_FAST_PATHS.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from rest_framework import serializers
from rest_framework.fields import empty

S = TypeVar("S", bound=serializers.BaseSerializer)

_local = threading.local()


def _instance(serializer_class: type[S]) -> S:
    cache: dict[type, Any] = _local.__dict__.setdefault("serializers", {})
    serializer = cache.get(serializer_class)
    if serializer is None:
        serializer = cache[serializer_class] = _skipping(serializer_class)()
    return serializer


def _skipping(serializer_class: type[S]) -> type[S]:
    """`serializer_class` whose validation of a JSON object passes over the optional fields
    without a default that the object does not name. DRF runs every writable field for every
    body, and each absent one ends in a SkipField raised and caught (get_value, run_validation,
    validate_empty_values): a message without tags, metadata, headers, copies or attachments
    paid ~50 µs for the fields issue 21 added (bench/accept_inproc.py). Such a field adds
    nothing to validated_data either way, so the result is the same; any other input (a
    QueryDict, with its HTML-form rules) goes DRF's way."""
    if not issubclass(serializer_class, serializers.Serializer):
        return serializer_class

    class Skipping(serializer_class):  # type: ignore[valid-type, misc]
        @property
        def _writable_fields(self) -> Any:
            data = getattr(self, "initial_data", None)
            fields = super()._writable_fields
            if type(data) is not dict:
                return fields
            return (f for f in fields if f.field_name in data or f.required or f.default is not empty)

    Skipping.__name__ = Skipping.__qualname__ = serializer_class.__name__
    return Skipping


def validated(serializer_class: type[S], data: Any, context: dict[str, Any] | None = None) -> Any:
    """`serializer_class(data=data, context=context)`'s validated_data, or its ValidationError."""
    serializer = _instance(serializer_class)
    serializer.initial_data = data
    serializer._context = context or {}
    try:
        return serializer.run_validation(data)
    finally:
        del serializer.initial_data
        serializer._context = {}


def represented(serializer_class: type[S], instance: Any) -> Any:
    """`serializer_class(instance).data` (as a plain dict)."""
    return _instance(serializer_class).to_representation(instance)
