"""API key scopes: which requests a key may make.

Every API view gets `ApiKeyScopes` (settings.REST_FRAMEWORK's DEFAULT_PERMISSION_CLASSES). A view
names the scopes each HTTP method accepts in `required_scopes`; a method it does not name needs
`manage`. So a new endpoint is closed to application keys until someone decides otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rest_framework import exceptions
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from delivery.models import ApiKey, ApiKeyScope

# HEAD and OPTIONS read what GET reads.
_READ_ALIASES = {"HEAD": "GET", "OPTIONS": "GET"}


def scopes_for(view: object, method: str) -> Sequence[str]:
    """The scopes of which a request needs at least one: the view's choice, else `manage`."""
    declared: Mapping[str, Sequence[str]] = getattr(view, "required_scopes", {})
    method = _READ_ALIASES.get(method, method)
    return declared.get(method, (ApiKeyScope.MANAGE,))


def request_key(request: Request) -> ApiKey:
    """The request's API key (ApiKeyScopes has admitted it, so there is one)."""
    if not isinstance(request.auth, ApiKey):
        raise exceptions.NotAuthenticated()
    return request.auth


def can_manage(key: ApiKey) -> bool:
    return ApiKeyScope.MANAGE in key.scopes


class MissingScope(exceptions.PermissionDenied):
    default_code = "missing_scope"

    def __init__(self, needed: Sequence[str], held: Sequence[str]) -> None:
        super().__init__(
            f"this API key lacks the scope {' or '.join(f'`{s}`' for s in needed)} "
            f"(it has: {', '.join(held) or 'none'}); create a key with "
            f"`manage.py create_api_key NAME --scopes {needed[0]}`",
        )
        self.missing_scope = list(needed)


class ApiKeyScopes(BasePermission):
    """A valid key (else 401), holding one of the scopes the view asks for this method (else 403)."""

    def has_permission(self, request: Request, view: object) -> bool:
        key = request.auth
        if not isinstance(key, ApiKey):
            return False  # DRF answers 401 with the Bearer challenge
        needed = scopes_for(view, request.method or "GET")
        if not set(needed) & set(key.scopes):
            raise MissingScope(needed, key.scopes)
        return True


def document_scopes(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular hook: every operation names the scopes it needs (`x-required-scopes` and
    a sentence in its description), from the same `scopes_for` the permission enforces."""
    paths = result.get("paths", {})
    for path, _, method, view in generator._get_paths_and_endpoints():
        operation = paths.get(path, {}).get(method.lower())
        if operation is None:
            continue
        scopes = [str(scope) for scope in scopes_for(view, method)]
        operation["x-required-scopes"] = scopes
        note = "API key scope: " + " or ".join(f"`{scope}`" for scope in scopes) + "."
        if not scopes:  # a view that takes no key (webhooks: the provider's signature is the auth)
            note = "No API key: the request is authenticated by the provider's signature."
        operation["description"] = f"{operation.get('description', '')}\n\n{note}".strip()
    return result
