"""Errors of the campaigns app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import status
from rest_framework.exceptions import APIException

from core.api_json import RequestTooLarge

if TYPE_CHECKING:
    from campaigns.models import ContactList, Segment


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


class InUse(Exception):
    """An audience that campaigns or recurring schedules point at cannot be deleted (FK PROTECT)."""

    what = "audience"

    def __init__(self, audience: ContactList | Segment, users: list[str]) -> None:
        super().__init__(
            f"{self.what} {audience.name!r} is used by {', '.join(users)}: "
            f"delete those or point them at another {self.what} first"
        )
        self.users = users


class ListInUse(InUse):
    what = "list"


class SegmentInUse(InUse):
    what = "segment"


class InvalidFilter(ValueError):
    """The filter is refused; `errors` maps each bad node's path to what is wrong with it."""

    def __init__(self, errors: dict[str, str], *, limit: str | None = None) -> None:
        super().__init__("; ".join(f"{path}: {message}" for path, message in errors.items()))
        self.errors = errors
        self.limit = limit  # the setting a refusal for size or depth names


class SegmentQueryTimeout(Exception):
    """A segment's count or sample ran longer than EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS and was stopped."""


class ImportFileError(Exception):
    """The file as a whole cannot be imported (empty, no header, no email column, …).

    Raised before anything is written: only the header can fail a file.
    """


class ImportTooLarge(RequestTooLarge):
    def __init__(self, max_bytes: int) -> None:
        name = "EMAILHUB_IMPORT_MAX_BYTES"
        super().__init__(max_bytes, name, message=f"the CSV file is larger than {max_bytes} bytes ({name})")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class InvalidToken(ValueError):
    """Not a token we issued (malformed, forged, or made under a secret no longer kept)."""


class ExpiredToken(ValueError):
    """A genuine token older than EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS."""


class ImportClaimLost(Exception):
    """Another run took the job over (this one looked dead); this run stops, its batch undone."""
