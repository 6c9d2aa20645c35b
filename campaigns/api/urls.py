"""API v1 routes owned by the campaigns app (contacts, lists, suppressions, segments, templates, campaigns)."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("", include("campaigns.api.contacts")),
    path("", include("campaigns.api.segments")),
    path("", include("campaigns.api.campaigns")),
    path("", include("campaigns.api.imports")),
]
