"""What an operator may do to messages: retry failed ones, cancel unsent ones, erase an address.

The admin's actions call these (and an API may): each is one conditional UPDATE that moves only
rows still in the state the operator saw, so a row a worker moved meanwhile is skipped and
reported, never overwritten. Campaign counters move in the same transaction, by the rows that
really moved (campaigns.progress.move_counters), as for every other change. The message rows
move through delivery.services.transitions, the state machine.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis as redis_lib
from django.db import connection, transaction

from campaigns.progress import move_counters
from core import outbound_events, schedule_index
from delivery.selectors import ENGAGEMENT_INDEXED, message_states, unsent_message_ids_to
from delivery.services import send_tasks, transitions
from delivery.services.transitions import CANCELLABLE

logger = logging.getLogger(__name__)


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
    with transaction.atomic():
        rows = transitions.requeue_failed(ids)
        report.moved = sorted(row[0] for row in rows)
        # The campaign counted these as failed; they are unfinished again.
        reopened: Counter[tuple[int, str]] = Counter()
        for _, _, campaign_id in rows:
            if campaign_id is not None:
                reopened[(campaign_id, "failed")] -= 1
        move_counters(reopened)
        send_tasks.record_sends_by_priority((message_id, priority) for message_id, priority, _ in rows)
        _explain_skipped([i for i in ids if i not in set(report.moved)], report, "failed")
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
    with transaction.atomic():
        rows = transitions.cancel(ids, reason)
        report.moved = sorted(row[0] for row in rows)
        moved: Counter[tuple[int, str]] = Counter(
            (campaign_id, "cancelled") for _, campaign_id, _ in rows if campaign_id is not None
        )
        move_counters(moved)
        _explain_skipped([i for i in ids if i not in set(report.moved)], report, "cancellable")
        units = [f"m:{message_id}" for message_id, _, status in rows if status != "queued"]
        if units:
            transaction.on_commit(lambda: _unindex(units))
    return report


def _unindex(units: list[str]) -> None:
    """Drop message units from the due set. Only tidiness: a unit left behind is dispatched into
    a conditional UPDATE that no longer matches the cancelled row."""
    try:
        schedule_index.remove(units)
    except redis_lib.RedisError as exc:
        logger.warning("could not drop %d cancelled unit(s) from the schedule index: %s", len(units), exc)


def _explain_skipped(ids: list[int], report: OperatorReport, wanted: str) -> None:
    if not ids:
        return
    found = message_states(ids)
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
    with transaction.atomic():
        pending = unsent_message_ids_to(email, CANCELLABLE)
        if pending:
            cancel_messages(pending, reason="recipient erased")
        erased = transitions.erase_recipient(email, placeholder)
        with connection.cursor() as cursor:
            if erased:
                cursor.execute(
                    "UPDATE delivery_emailevent SET payload = '{}'::jsonb, recipient = %s WHERE message_id = ANY(%s)",
                    [placeholder, erased],
                )
            # The events that matched no message but name the address (a bounce of mail sent
            # elsewhere, say): a segment's engagement condition reads events by address, so a
            # contact created later with this address must not inherit the erased person's.
            # Those rows are the engagement indexes' (kind, recipient), so no table scan.
            cursor.execute(
                f"UPDATE delivery_emailevent AS e SET payload = '{{}}'::jsonb, recipient = %s"
                f" WHERE e.recipient = %s AND ({ENGAGEMENT_INDEXED})",
                [placeholder, email.lower()],
            )
            outbound_events.erase(erased, placeholder)  # what the application is (or was) told
    return len(erased)
