"""Errors of the scheduling app."""

from __future__ import annotations


class InvalidCron(ValueError):
    """The expression is not a valid 5-field cron expression."""
