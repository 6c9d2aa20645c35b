"""DRF serializers built once per thread and reused, instead of once per request (or batch item).

Replaces: `Serializer(data=…, context=…)` then `is_valid(raise_exception=True)`, and
`Serializer(instance).data` (delivery/api/serializing.py, the plain path). DRF builds a
serializer's fields on every instantiation (a deepcopy of the declared fields, ModelSerializer's
field mapping). A kept instance validates and represents the same way: `run_validation` is what
`is_valid` calls, and its ValidationError carries the detail `is_valid(raise_exception=True)`
raises; the per-call state (`initial_data`, DRF's private `_context`) is set only while one call
runs, on one thread.

Gain: 11% of POST /api/v1/messages for the response and 5.6% for the input (issue 13's profile,
docs/performance.md "The accept path"), and the field build 1,000 times per batch.

Pinned by: the API tests, run with this switch on and off (tests/conftest.py `fast_paths`).

Off switch: leave `serializers` out of EMAILHUB_FAST_PATHS.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from rest_framework import serializers

S = TypeVar("S", bound=serializers.BaseSerializer)

_local = threading.local()


def _instance(serializer_class: type[S]) -> S:
    cache: dict[type, Any] = _local.__dict__.setdefault("serializers", {})
    serializer = cache.get(serializer_class)
    if serializer is None:
        serializer = cache[serializer_class] = serializer_class()
    return serializer


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
