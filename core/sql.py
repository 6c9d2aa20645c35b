"""Values written into static SQL: an enum's values as SQL literals, formatted once at import."""

from __future__ import annotations

from types import SimpleNamespace

from django.db import models


def literal(value: str) -> str:
    """`value` as an SQL string literal (a quote in it doubled, so no value can end it early)."""
    return "'" + str(value).replace("'", "''") + "'"


def literals(choices: type[models.TextChoices]) -> SimpleNamespace:
    """Each member of `choices` as an SQL literal, by its name: `literals(MessageStatus).QUEUED`
    is `'queued'`. A module's statements name statuses through this, taken from the model's
    enum, so a status renamed there cannot leave a statement testing the old value."""
    return SimpleNamespace(**{member.name: literal(member.value) for member in choices})
