"""Bearer API keys: `Authorization: Bearer eh_…`. Keys are random, so SHA-256 suffices to store them."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable

from django.conf import settings
from django.db.models import Q
from django.db.models.functions import Now
from django.db.models.signals import post_save
from django.dispatch import receiver
from drf_spectacular.extensions import OpenApiAuthenticationExtension
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
        raise ValueError(
            f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(ApiKeyScope.values)}"
        )
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(name=name, prefix=raw[:10], key_hash=hash_key(raw), scopes=chosen)
    return key, raw


def find_api_key(name_or_prefix: str) -> ApiKey:
    """The key named so, or whose prefix (or whole raw key) this is; LookupError if not exactly one."""
    ident = name_or_prefix.strip()
    if not ident:
        raise LookupError("give a key's name or prefix, e.g. `billing-service` or `eh_AbC123x`")
    matches = list(
        ApiKey.objects.filter(
            Q(name=ident) | Q(prefix=ident) | Q(key_hash=hash_key(ident)),
        )[:2]
    )
    if not matches:
        raise LookupError(f"no API key has the name or prefix {ident!r} (see `manage.py list_api_keys`)")
    if len(matches) > 1:
        # A name equal to another key's prefix, or two keys sharing a prefix: refuse to guess.
        raise LookupError(
            f"{ident!r} matches more than one API key: {', '.join(map(str, matches))}; use its name"
        )
    return matches[0]


def revoke_api_key(key: ApiKey) -> bool:
    """Revoke the key; False if it was revoked already (the first revocation time is kept).

    This process forgets its cached keys at once; every other process refuses the key within
    EMAILHUB_API_KEY_CACHE_SECONDS, when its cached lookup expires.
    """
    revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=Now())
    forget_cached_keys()
    key.refresh_from_db(fields=["revoked_at"])
    return revoked == 1


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


@receiver(post_save, sender=ApiKey)
def _forget_on_change(**_: object) -> None:
    # A revocation takes effect at once in this process; others follow within the cache time.
    forget_cached_keys()


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """The Bearer scheme in the OpenAPI schema; each operation's scope is added by
    delivery.permissions.document_scopes."""

    target_class = "delivery.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "eh_…",
            "description": (
                "An API key from `manage.py create_api_key NAME [--scopes send,read,manage]`. "
                "A missing or revoked key is a 401; a key without the operation's scope a 403."
            ),
        }
