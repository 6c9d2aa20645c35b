"""Bearer API keys: `Authorization: Bearer eh_…`. Keys are random, so SHA-256 suffices to store them."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable

from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from delivery.models import ApiKey, ApiKeyScope, default_api_key_scopes

KEY_PREFIX = "eh_"


# hash -> (key, monotonic expiry). Per process; see EMAILHUB_API_KEY_CACHE_SECONDS.
_cache: dict[str, tuple[ApiKey, float]] = {}


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def forget_cached_keys() -> None:
    _cache.clear()


def _lookup(key_hash: str) -> ApiKey | None:
    cached = _cache.get(key_hash)
    if cached is not None and cached[1] > time.monotonic():
        return cached[0]
    key = ApiKey.objects.filter(key_hash=key_hash, revoked_at__isnull=True).first()
    if key is None:
        _cache.pop(key_hash, None)
    elif settings.EMAILHUB_API_KEY_CACHE_SECONDS > 0:
        _cache[key_hash] = (key, time.monotonic() + settings.EMAILHUB_API_KEY_CACHE_SECONDS)
    return key


def create_api_key(name: str, scopes: Iterable[str] | None = None) -> tuple[ApiKey, str]:
    """Create a key; the raw key is returned once and never stored.

    `scopes` defaults to send and read (an application's key); unknown scopes raise ValueError.
    """
    chosen = default_api_key_scopes() if scopes is None else list(dict.fromkeys(scopes))
    unknown = sorted(set(chosen) - set(ApiKeyScope.values))
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(ApiKeyScope.values)}")
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(name=name, prefix=raw[:10], key_hash=hash_key(raw), scopes=chosen)
    return key, raw


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[None, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not raw.strip():
            raise exceptions.AuthenticationFailed("use the header `Authorization: Bearer <api key>`")
        key = _lookup(hash_key(raw.strip()))
        if key is None:
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        return (None, key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class HasApiKey:
    """Permission: the request carried a valid API key (DRF's IsAuthenticated needs a user)."""

    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.auth, ApiKey)

    def has_object_permission(self, request: Request, view: object, obj: object) -> bool:
        return True


@receiver(post_save, sender=ApiKey)
def _forget_on_change(**_: object) -> None:
    # A revocation takes effect at once in this process; others follow within the cache time.
    forget_cached_keys()
