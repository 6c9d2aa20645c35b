"""Errors of the campaigns app."""

from __future__ import annotations


class CampaignStateError(Exception):
    """The campaign is not in a state that allows this change (the message says which state it is in)."""


class InvalidSchedule(CampaignStateError):
    """A schedule that can never run as asked (a type not built yet, an input its type needs, a
    time already past); `errors` maps each input at fault to what is wrong with it. A
    CampaignStateError, so every caller that shows those (the admin) shows this too; the API
    checks it first and answers 400 with `errors` as its field errors; `codes` gives a field's
    error code where it is not `invalid` (a configured limit's setting, core.limits)."""

    def __init__(self, errors: dict[str, str], codes: dict[str, str] | None = None) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors
        self.codes = codes or {}
