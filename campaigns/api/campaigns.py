"""Templates and campaigns (routes in `urlpatterns`)."""

from __future__ import annotations

urlpatterns: list = []
