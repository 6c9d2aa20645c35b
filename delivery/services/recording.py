"""Recording what happened to a batch: message statuses, suppressions and campaign counters.

Everything is written in one transaction: the message rows move through the state machine
(`transitions.record_outcomes`, every UPDATE conditional on the row still being `sending` under
the batch's claim), and
the campaign counters (`campaigns.progress.move_counters`) are moved by exactly the rows that
moved, so they never drift from the messages, whatever was redelivered or requeued meanwhile.
The metrics (core.metrics) count the same moved rows, once per batch and after the commit, so
`emailhub_emails_sent_total` never counts a row the database does not hold.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction

from campaigns.models import Suppression
from campaigns.progress import move_counters
from campaigns.suppressions import suppress
from core import metrics
from core.outages import retry_while_unreachable
from core.schedule_index import index_after_commit, message_unit
from delivery.services.transitions import Outcomes, Recorded, record_outcomes


def record(outcomes: Outcomes, claimed_at: datetime, *, campaign_rows: bool = True) -> None:
    """Record a batch's outcomes for the rows its claim (token `claimed_at`) still holds.

    While PostgreSQL is briefly unreachable the same transaction is tried again in place for up
    to EMAILHUB_RECORD_RETRY_SECONDS: the providers have already answered, and a batch left
    `sending` would be requeued after the lease and sent again. (Should the lease have passed
    meanwhile and another worker hold the rows, the token makes the record write nothing.)

    `campaign_rows`: whether the batch may hold a campaign's messages (their counters move with
    them). A batch of none whose outcomes are one UPDATE (the usual transactional send: all sent
    through one provider) runs it on its own, autocommitted: the same single transaction without
    the BEGIN and COMMIT round trips (two of a critical message's five, issue 20)."""
    retry_while_unreachable(
        lambda: _record(
            outcomes,
            claimed_at,
            alone=not campaign_rows and not outcomes.bounced and outcomes.statements() == 1,
        ),
        seconds=settings.EMAILHUB_RECORD_RETRY_SECONDS,
        what="recording a batch",
    )


def _record(outcomes: Outcomes, claimed_at: datetime, *, alone: bool) -> None:
    if alone:  # one statement: a transaction of its own (on_commit runs right after it)
        _write(outcomes, claimed_at)
        return
    with transaction.atomic():
        _write(outcomes, claimed_at)


def _write(outcomes: Outcomes, claimed_at: datetime) -> None:
    recorded = record_outcomes(outcomes, claimed_at)
    if recorded.retrying:
        index_after_commit([(message_unit(i), due) for i, due in recorded.retrying])
    suppress(outcomes.bounced, Suppression.Reason.BOUNCED)
    move_counters(recorded.moved)
    transaction.on_commit(lambda: _count(recorded))


def _count(recorded: Recorded) -> None:
    metrics.count_emails(recorded.counts)
    metrics.observe_latencies(recorded.latencies)
