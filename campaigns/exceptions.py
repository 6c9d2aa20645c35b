"""Errors of the campaigns app."""

from __future__ import annotations


class CampaignStateError(Exception):
    """The campaign is not in a state that allows this change (the message says which state it is in)."""
