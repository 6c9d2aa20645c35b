"""A table held by another session, for tests of what waits on it (a statement timeout)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from django.db import connection


@contextmanager
def table_locked(table: str) -> Iterator[None]:
    """`table` locked ACCESS EXCLUSIVE by a session of its own until the block ends: a statement
    that reads it waits, until its statement timeout stops it (no dependence on machine speed)."""
    params = connection.get_connection_params()
    locker = psycopg2.connect(**{k: v for k, v in params.items() if k != "cursor_factory"})
    try:
        with locker.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        locker.rollback()
        locker.close()
