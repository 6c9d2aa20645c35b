"""Values written into static SQL (an enum's values as SQL literals, formatted once at import),
and statements prepared once per connection."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.db import DatabaseError, models
from django.db.backends.utils import CursorWrapper


def literal(value: str) -> str:
    """`value` as an SQL string literal (a quote in it doubled, so no value can end it early)."""
    return "'" + str(value).replace("'", "''") + "'"


def literals(choices: type[models.TextChoices]) -> SimpleNamespace:
    """Each member of `choices` as an SQL literal, by its name: `literals(MessageStatus).QUEUED`
    is `'queued'`. A module's statements name statuses through this, taken from the model's
    enum, so a status renamed there cannot leave a statement testing the old value."""
    return SimpleNamespace(**{member.name: literal(member.value) for member in choices})


# --- server-side prepared statements --------------------------------------------------------------

# Every statement prepared, by its name: what `EXECUTE <name>(…)` runs (tests describe it by this).
PREPARED: dict[str, str] = {}
# The statements each connection has prepared, by (the driver connection's id, its backend pid).
_prepared_on: dict[tuple[int, int], set[str]] = {}


def execute_prepared(cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
    """Run `sql` (with `%s` placeholders) as a prepared statement of this connection: PostgreSQL
    plans it once per connection instead of at every call. The first call on a connection sends
    `PREPARE …; EXECUTE …` in one round trip, later ones `EXECUTE name(…)`.

    Used where a statement is sent once per request and its planning outweighs its execution (the
    accept INSERT with its outbox row and outbound event: 164 µs planning, 98 µs execution, in
    EXPLAIN on this machine). EMAILHUB_PREPARED_STATEMENTS=false sends `sql` as it is (a
    connection pooler in transaction mode, such as PgBouncer without max_prepared_statements,
    cannot keep a connection's prepared statements)."""
    if not settings.EMAILHUB_PREPARED_STATEMENTS:
        cursor.execute(sql, params)
        return
    name = "emailhub_" + hashlib.sha1(sql.encode()).hexdigest()[:20]
    PREPARED.setdefault(name, sql)
    raw = cursor.db.connection
    key = (id(raw), raw.get_backend_pid())
    done = _prepared_on.setdefault(key, set())
    arguments = f"({', '.join(['%s'] * len(params))})" if params else ""
    if name in done:
        try:
            cursor.execute(f"EXECUTE {name}{arguments}", params)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "pgcode", None) == INVALID_SQL_STATEMENT_NAME:
                done.discard(name)  # the session lost it (DISCARD ALL, a pooler): prepared again next time
            raise
        return
    if len(_prepared_on) > 1000:  # connections come and go: forget the oldest
        _prepared_on.pop(next(iter(_prepared_on)))
    if name in _uncertain.pop(key, set()) and _exists(cursor, name):
        # An earlier first call failed after its PREPARE took: it stands (PREPARE is not undone
        # by a rollback), and preparing it again would fail.
        done.add(name)
        cursor.execute(f"EXECUTE {name}{arguments}", params)
        return
    numbered = iter(range(1, len(params) + 1))
    body = re.sub(r"%s", lambda _: f"${next(numbered)}", sql.replace("%%", "%"))
    try:
        # A literal % in the body is doubled again: psycopg2 reads the whole string for placeholders.
        cursor.execute(f"PREPARE {name} AS {body.replace('%', '%%')}; EXECUTE {name}{arguments}", params)
    except DatabaseError:
        _uncertain.setdefault(key, set()).add(name)  # did the PREPARE take? asked next time
        raise
    done.add(name)


# SQLSTATE 26000: EXECUTE of a name this session has not prepared.
INVALID_SQL_STATEMENT_NAME = "26000"
# Statements whose first call failed, by connection: their PREPARE may have taken.
_uncertain: dict[tuple[int, int], set[str]] = {}


def _exists(cursor: CursorWrapper, name: str) -> bool:
    cursor.execute("SELECT EXISTS (SELECT FROM pg_prepared_statements WHERE name = %s)", [name])
    row = cursor.fetchone()
    return bool(row and row[0])
