"""Errors of the scheduling app."""

from __future__ import annotations


class InvalidCron(ValueError):
    """The expression is not a valid 5-field cron expression."""


class NoAudience(ValueError):
    """A change would leave a recurring schedule with neither a list nor a segment (a concurrent
    edit took the other half since the request was checked)."""
