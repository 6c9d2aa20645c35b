"""Errors of the campaigns app."""

from __future__ import annotations


class CampaignStateError(Exception):
    """The campaign is not in a state that allows this change (the message says which state it is in)."""


class InvalidSchedule(CampaignStateError):
    """A schedule that can never run as asked (a time already past); `field` names the input at
    fault. A CampaignStateError, so every caller that shows those (the admin) shows this too;
    the API checks it first and answers 400."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
