"""delivery 0012/0013: the flags that rode in Message.context under reserved keys become columns.

Rows written before the change (at 0011, as the old code wrote them) are migrated forward into
the columns, their contexts keeping only the client's own keys, and back again unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("delivery", "0011_send_path")]
AFTER = [("delivery", "0013_message_flags_data")]

# context as the old code stored it → (list_unsubscribe, track_opens, track_clicks, test_send_by,
# context after the migration)
ROWS: list[tuple[Any, tuple[bool, bool, bool, str | None, Any]]] = [
    ({"a": 1, "emailhub:unsubscribe": True}, (True, False, False, None, {"a": 1})),
    ({"emailhub:track_opens": True, "emailhub:track_clicks": True}, (False, True, True, None, None)),
    ({"emailhub:track_clicks": True, "emailhub:unsubscribe": True}, (True, False, True, None, None)),
    ({"first": "Ann", "emailhub:test_send": "admin"}, (False, False, False, "admin", {"first": "Ann"})),
    ({"emailhub:test_send": True}, (False, False, False, "", None)),  # an operator without a name
    ({"a": 2}, (False, False, False, None, {"a": 2})),
    (None, (False, False, False, None, None)),
    # Not an object: left alone (`?|` would match a string scalar, and `-` would fail on it).
    ("emailhub:test_send", (False, False, False, None, "emailhub:test_send")),
]


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.fixture
def at_0011() -> Iterator[None]:
    migrate(BEFORE)
    try:
        yield
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def contexts() -> dict[int, Any]:
    with connection.cursor() as db:
        db.execute("SELECT id, context FROM delivery_message")
        return {pk: None if value is None else json.loads(value) for pk, value in db.fetchall()}


@pytest.mark.usefixtures("at_0011")
def test_reserved_context_keys_move_into_the_flag_columns_and_back() -> None:
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO delivery_message (to_email, priority, context)
            SELECT 'a@example.com', 'high', c::jsonb FROM unnest(%s::text[]) WITH ORDINALITY AS u(c, n)
             ORDER BY n
            RETURNING id
            """,
            [[None if context is None else json.dumps(context) for context, _ in ROWS]],
        )
        ids = [row[0] for row in db.fetchall()]
    before = contexts()

    migrate(AFTER)
    with connection.cursor() as db:
        db.execute(
            "SELECT id, list_unsubscribe, track_opens, track_clicks, test_send_by, context FROM delivery_message"
        )
        moved = {
            pk: (*flags, None if context is None else json.loads(context))
            for pk, *flags, context in db.fetchall()
        }
    assert moved == {pk: expected for pk, (_, expected) in zip(ids, ROWS, strict=True)}

    migrate(BEFORE)
    assert contexts() == before
