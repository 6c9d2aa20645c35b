"""What an operator may do to messages: retry failed ones, cancel unsent ones, erase an address.

The admin's actions call these (and an API may): each is one conditional UPDATE that moves only
rows still in the state the operator saw, so a row a worker moved meanwhile is skipped and
reported, never overwritten. Campaign counters move in the same transaction, by the rows that
really moved (delivery.services.recording.move_campaign_counters), as for every other change.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis as redis_lib
from django.db import connection, transaction

from delivery.services import outbox
from delivery.services.recording import move_campaign_counters

logger = logging.getLogger(__name__)

# States an operator may cancel: nothing has been handed to a provider yet. A `sending` message
# is at a provider right now; cancelling it could not stop the email.
CANCELLABLE = ("queued", "scheduled", "retry_wait")


@dataclass
class OperatorReport:
    """Which of the requested ids moved, and why each other one did not."""

    moved: list[int] = field(default_factory=list)
    # id → reason, for ids that were not moved
    skipped: dict[int, str] = field(default_factory=dict)


def retry_failed(message_ids: Sequence[int]) -> OperatorReport:
    """`failed` → `queued` with attempts reset to 0, published again through the outbox.

    Attempts restart at 0: the operator decided the cause is fixed, so the message gets the full
    `EMAILHUB_MAX_ATTEMPTS` again (its `last_error` keeps the old cause until the next attempt).
    Skipped: rows no longer `failed`, addresses on the suppression list (sending would only
    suppress them again), and campaign messages whose campaign is not sending or paused (the
    claim takes a campaign's messages only while it sends, so they would wait forever).
    """
    ids = sorted(set(message_ids))
    report = OperatorReport()
    if not ids:
        return report
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE delivery_message AS m
               SET status = 'queued', attempts = 0, queued_at = clock_timestamp(),
                   due_at = NULL, claimed_at = NULL
             WHERE m.id = ANY(%s) AND m.status = 'failed'
               AND NOT EXISTS (SELECT 1 FROM campaigns_suppression AS s WHERE s.email = lower(m.to_email))
               AND (m.campaign_id IS NULL
                    OR EXISTS (SELECT 1 FROM campaigns_campaign AS c
                                WHERE c.id = m.campaign_id AND c.status IN ('sending', 'paused')))
            RETURNING m.id, m.priority, m.campaign_id
            """,
            [ids],
        )
        rows = cursor.fetchall()
        report.moved = sorted(row[0] for row in rows)
        # The campaign counted these as failed; they are unfinished again.
        for campaign_id, count in sorted(Counter(r[2] for r in rows if r[2] is not None).items()):
            cursor.execute(
                "UPDATE campaigns_campaign SET failed_count = failed_count - %s, updated_at = now() WHERE id = %s",
                [count, campaign_id],
            )
        outbox.record_sends_by_priority((message_id, priority) for message_id, priority, _ in rows)
        _explain_skipped(cursor, [i for i in ids if i not in set(report.moved)], report, "failed")
    return report


def cancel_messages(message_ids: Sequence[int], reason: str = "cancelled by an operator") -> OperatorReport:
    """`queued`/`scheduled`/`retry_wait` → `cancelled`; campaign counters moved in the same
    transaction, and a scheduled or retrying message's unit dropped from the schedule index.

    The row lock in the CTE re-reads each row's status after any concurrent writer commits, so the
    status returned is the one that was really cancelled.
    """
    ids = sorted(set(message_ids))
    report = OperatorReport()
    if not ids:
        return report
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            WITH target AS (
                SELECT id, status FROM delivery_message
                 WHERE id = ANY(%s) AND status = ANY(%s)
                 ORDER BY id
                   FOR UPDATE
            )
            UPDATE delivery_message AS m
               SET status = 'cancelled', last_error = %s
              FROM target
             WHERE m.id = target.id
            RETURNING m.id, m.campaign_id, target.status
            """,
            [ids, list(CANCELLABLE), reason],
        )
        rows = cursor.fetchall()
        report.moved = sorted(row[0] for row in rows)
        moved: Counter[tuple[int, str]] = Counter(
            (campaign_id, "cancelled") for _, campaign_id, _ in rows if campaign_id is not None
        )
        move_campaign_counters(cursor, moved)
        _explain_skipped(cursor, [i for i in ids if i not in set(report.moved)], report, "cancellable")
        units = [f"m:{message_id}" for message_id, _, status in rows if status != "queued"]
        if units:
            transaction.on_commit(lambda: _unindex(units))
    return report


def _unindex(units: list[str]) -> None:
    """Drop message units from the due set. Only tidiness: a unit left behind is dispatched into
    a conditional UPDATE that no longer matches the cancelled row."""
    from scheduling import schedule

    try:
        schedule.client().zrem(schedule.DUE, *units)
    except redis_lib.RedisError as exc:
        logger.warning("could not drop %d cancelled unit(s) from the schedule index: %s", len(units), exc)


def _explain_skipped(cursor: object, ids: list[int], report: OperatorReport, wanted: str) -> None:
    if not ids:
        return
    cursor.execute(  # type: ignore[attr-defined]
        """
        SELECT m.id, m.status,
               EXISTS (SELECT 1 FROM campaigns_suppression AS s WHERE s.email = lower(m.to_email)),
               c.status
          FROM delivery_message AS m
          LEFT JOIN campaigns_campaign AS c ON c.id = m.campaign_id
         WHERE m.id = ANY(%s)
        """,
        [ids],
    )
    found = {row[0]: row[1:] for row in cursor.fetchall()}  # type: ignore[attr-defined]
    for message_id in ids:
        if message_id not in found:
            report.skipped[message_id] = "no such message"
            continue
        status, suppressed, campaign_status = found[message_id]
        if wanted == "failed" and status == "failed" and suppressed:
            report.skipped[message_id] = "the address is on the suppression list; remove it there first"
        elif wanted == "failed" and status == "failed":
            report.skipped[message_id] = (
                f"its campaign is {campaign_status}; only a sending or paused campaign's messages are retried"
            )
        else:
            report.skipped[message_id] = f"it is {status} now, not {wanted}"


def erase_address(email: str, placeholder: str) -> int:
    """Replace `email` in every message sent to it with `placeholder` (GDPR erasure), keep each
    message's status, timestamps and provider ids (the delivery record), clear what may quote the
    person (inline subject and bodies, context, last error, event payloads: webhook bodies quote
    the address), and cancel what was not sent yet.

    Messages are found by address through the UPPER(to_email) index, which covers campaign and
    transactional mail alike; a table scan by contact id would read every message ever sent.
    Returns how many messages were rewritten. Runs in the caller's transaction.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM delivery_message WHERE UPPER(to_email) = UPPER(%s) AND status = ANY(%s)",
            [email, list(CANCELLABLE)],
        )
        pending = [row[0] for row in cursor.fetchall()]
        if pending:
            cancel_messages(pending, reason="recipient erased")
        cursor.execute(
            """
            UPDATE delivery_message
               SET to_email = %s, context = NULL, subject = NULL, html = NULL, text = NULL,
                   last_error = CASE WHEN last_error IS NULL THEN NULL ELSE 'recipient erased' END
             WHERE UPPER(to_email) = UPPER(%s)
            RETURNING id
            """,
            [placeholder, email],
        )
        erased = [row[0] for row in cursor.fetchall()]
        if erased:
            cursor.execute(
                "UPDATE delivery_emailevent SET payload = '{}'::jsonb WHERE message_id = ANY(%s)", [erased]
            )
    return len(erased)
