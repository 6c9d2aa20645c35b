"""What this app's services raise for callers to turn into answers."""

from __future__ import annotations


class UnsafeUrl(ValueError):
    """An endpoint URL that may not be called (not https, or not a public address)."""


class NotReplayable(ValueError):
    """A replay that names nothing this endpoint was ever sent."""


class BeingDelivered(NotReplayable):
    """A replay of what is being delivered to the endpoint right now (it goes anyway)."""
