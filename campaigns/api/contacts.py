"""Contacts, lists, suppressions and CSV import (routes in `urlpatterns`)."""

from __future__ import annotations

urlpatterns: list = []
