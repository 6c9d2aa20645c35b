"""Reads for the API and the admin."""

from __future__ import annotations

from typing import Any

import redis as redis_lib
from django.conf import settings
from django.db.models import QuerySet

from delivery.breakers import snapshot
from delivery.models import ApiKey, Message
from delivery.permissions import can_manage
from delivery.ratelimit import bucket_for
from delivery.services.sending import BULK, TRANSACTIONAL, provider_chain


def provider_health() -> list[dict[str, Any]]:
    """Every configured provider: the pools using it, its breaker, its send-rate bucket."""
    pools: dict[str, list[str]] = {}
    for pool in (TRANSACTIONAL, BULK):
        for name in provider_chain(pool):
            pools.setdefault(name, []).append(pool)
    health = []
    for name, used_by in pools.items():
        bucket = bucket_for(name)
        rate: dict[str, Any] | None = None
        if bucket is not None:
            try:
                tokens: float | None = round(bucket.level(), 2)
            except redis_lib.RedisError:
                tokens = None
            rate = {
                "per_second": bucket.rate,
                "tokens": tokens,
                "reserved_for_transactional": bucket.reserved,
            }
        health.append(
            {
                "name": name,
                "pools": used_by,
                "position": {pool: provider_chain(pool).index(name) + 1 for pool in used_by},
                "circuit": snapshot(name),
                "rate_limit": rate,
            }
        )
    return health


def provider_chains() -> dict[str, list[str]]:
    return {
        TRANSACTIONAL: list(settings.EMAILHUB_PROVIDERS_TRANSACTIONAL),
        BULK: list(settings.EMAILHUB_PROVIDERS_BULK),
    }


def messages_visible_to(key: ApiKey) -> QuerySet[Message]:
    """The messages a key may read: its own, or every message if it may manage.

    Another key's message is simply absent (a 404, not a 403), so ids are not an oracle. A
    key's own list is served by message_api_key_idx.
    """
    messages = Message.objects.select_related("template")
    return messages if can_manage(key) else messages.filter(api_key=key)
