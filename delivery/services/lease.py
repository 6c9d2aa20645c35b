"""A worker's claim on the batch it sends, confirmed before anything reaches a provider.

The claim (`transitions.claim`) stamps the batch's rows with `claimed_at`, the claiming
statement's time on PostgreSQL's clock. The stale-send sweep gives back rows claimed longer ago
than EMAILHUB_SENDING_LEASE_SECONDS, and another worker may claim and send them. A worker that
stalls past the lease (SIGSTOP, a long GC pause, a frozen VM, a stalled disk) must not then go on
sending what it no longer holds: before issue 18 a child frozen for 90 s with a 60 s lease sent
its 100 messages after another worker had sent them, each delivered twice.

So the provider asks this lease before every message or request it puts on the wire
(`base.Guard.allows`). The lease knows when, on this process's own clock, the claim was asked
for; while less than half the lease has passed since, the answer is a clock reading and a
comparison. After that it re-confirms the claim in the database before answering: one
`renew_claim` UPDATE for the whole batch, matching rows by their token (`claimed_at`), not by
time, which restarts their lease when it finds them. The rows it no longer finds were given back
(another worker may have them now): they are abandoned, nothing more is sent for them and no
outcome is recorded (`record_outcomes` is fenced by the same token).

The other half of the lease is the margin: the longest a request allowed just before the
half-way mark has, on a normally running worker, to reach the provider and the batch to be
recorded before the sweep could give its rows away (keep the lease well above the providers'
timeouts). A worker frozen after its last check and before its bytes reach the provider can still
send one message (or one SendGrid request) twice: no check can see a pause that starts after it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial

from django.db import DatabaseError, InterfaceError

from delivery.providers import Guard
from delivery.services.transitions import ClaimedMessage, renew_claim

logger = logging.getLogger(__name__)

# The local clock the lease is measured on. CLOCK_BOOTTIME, where there is one (Linux), also
# counts time the machine spent suspended (a VM or laptop suspended to RAM), which
# CLOCK_MONOTONIC does not; neither ever steps back. Either costs tens of nanoseconds.
CLOCK: Callable[[], float] = (
    partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)
# The claim is re-confirmed once this share of the lease has gone by on the local clock; the
# rest is the margin (see the module docstring).
RENEW_AFTER = 0.5


class ClaimLease(Guard):
    """The guard of one claimed batch (`allows`), and the token its outcomes are recorded under."""

    def __init__(
        self,
        claimed: Sequence[ClaimedMessage],
        *,
        asked_at: float,
        lease_seconds: float,
        clock: Callable[[], float] = CLOCK,
    ) -> None:
        """`asked_at`: the clock's reading taken before the claim statement was sent (the
        database's `claimed_at` is later still, so the lease is never overestimated)."""
        self.ids = [message.id for message in claimed]
        self.token: datetime | None = claimed[0].claimed_at if claimed else None
        self.lost: set[int] = set()
        self._renew_every = lease_seconds * RENEW_AFTER
        self._renew_at = asked_at + self._renew_every
        self._clock = clock

    def allows(self, message_id: int) -> bool:
        if self._clock() >= self._renew_at:
            self._renew()
        return message_id not in self.lost

    def _renew(self) -> None:
        held = [message_id for message_id in self.ids if message_id not in self.lost]
        asked_at = self._clock()
        token: datetime | None = None
        renewed: list[int] = []
        if held and self.token is not None:
            try:
                token, renewed = renew_claim(held, self.token)
            except (DatabaseError, InterfaceError) as exc:  # InterfaceError: a closed connection
                # The claim cannot be confirmed: send nothing more. What is not recorded stays
                # `sending` until the sweep gives it back, so it is late, never lost.
                logger.warning("could not re-confirm the claim on %d message(s): %s", len(held), exc)
        lost = set(held).difference(renewed)
        if lost:
            logger.warning(
                "lost the claim on %d message(s) (stalled past EMAILHUB_SENDING_LEASE_SECONDS, or the "
                "database was unreachable): they are not sent here; their new owner sends them",
                len(lost),
            )
            self.lost |= lost
        if token is None:
            self._renew_at = math.inf  # nothing left to confirm
        else:
            self.token = token
            self._renew_at = asked_at + self._renew_every
