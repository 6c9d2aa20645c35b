"""Input validated and output represented with DRF serializers, the way DRF's docs show, or with
the serializers kept per thread of fastpaths/serializers.py when that switch is on."""

from __future__ import annotations

from typing import Any, TypeVar

from rest_framework import serializers

import fastpaths
from fastpaths import serializers as kept

S = TypeVar("S", bound=serializers.BaseSerializer)


def validated(serializer_class: type[S], data: Any, context: dict[str, Any] | None = None) -> Any:
    """`serializer_class(data=data, context=context)`'s validated_data, or its ValidationError."""
    if fastpaths.enabled("serializers"):
        return kept.validated(serializer_class, data, context)
    serializer = serializer_class(data=data, context=context or {})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def represented(serializer_class: type[S], instance: Any) -> Any:
    """`serializer_class(instance).data`."""
    if fastpaths.enabled("serializers"):
        return kept.represented(serializer_class, instance)
    return serializer_class(instance).data
