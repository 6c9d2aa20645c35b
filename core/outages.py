"""What a dependency that is briefly out of reach raises, and how code that meets one waits.

PostgreSQL restarting or failing over, Redis restarting, the broker away for a few seconds: the
work is still there and will still be possible in a moment. Dropping it to the slow safety nets
(the stranded-task probe, the stale-send lease, the stall sweeps: minutes) turns a 10-second
outage into minutes of delay (issue 18: 16,600 campaign messages +124 s, one critical 214 s).
So:

- a Celery task that meets one is retried with a short backoff (`TASK_RETRY`, Celery's own
  `autoretry_for`/`retry_backoff`/`retry_jitter`): 1, 2, 4, 8 s, then every 10 s, jittered,
  12 times (about a minute and a half); after that the safety nets take over as before;
- recording a batch that a provider has already accepted is retried in place
  (`retry_while_unreachable`), not by a new task: the rows are `sending`, a new task would claim
  nothing, and the lease would send them a second time;
- the API answers 503 `unavailable` with `Retry-After` (core/api_errors.py), so clients retry
  instead of treating it as a bug; nothing half-stored, because every accept is one transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connection
from kombu.exceptions import OperationalError as BrokerUnreachable
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# psycopg2's "could not connect", "server closed the connection unexpectedly", "terminating
# connection due to administrator command" (a restart), and Django's "connection already
# closed" for a connection that died between two uses. Django raises these for every driver.
DATABASE_UNREACHABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
DEPENDENCY_UNREACHABLE: tuple[type[Exception], ...] = (
    *DATABASE_UNREACHABLE,
    RedisConnectionError,
    RedisTimeoutError,
    BrokerUnreachable,
)

# Options for the tasks that do a message's or a campaign's work (delivery.send_messages,
# campaigns.fan_out). Every one of them starts with a conditional claim, so running one again is
# harmless. The countdowns are seconds, far below the Redis visibility timeout that makes long
# countdowns unsafe (docs/architecture.md, "Celery configuration").
TASK_RETRY: dict[str, Any] = {
    "autoretry_for": DEPENDENCY_UNREACHABLE,
    "retry_backoff": 1,
    "retry_backoff_max": 10,
    "retry_jitter": True,
    "max_retries": 12,
}

# In-place retries wait this long at first, doubling up to the cap.
_FIRST_WAIT = 0.25
_MAX_WAIT = 2.0


def retry_while_unreachable(
    call: Callable[[], T],
    *,
    seconds: float,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call()`, again and again while PostgreSQL is unreachable, for up to `seconds`; then the
    last error propagates. `call` must be safe to repeat (a conditional UPDATE is: a commit whose
    acknowledgement was lost moved the rows, and the repeat moves none)."""
    deadline = clock() + seconds
    wait = _FIRST_WAIT
    while True:
        try:
            return call()
        except DATABASE_UNREACHABLE as exc:
            if clock() + wait > deadline:
                raise
            logger.warning("%s: PostgreSQL unreachable (%s); trying again in %.2f s", what, exc, wait)
            # A connection that broke mid-transaction cannot be reused; the next call opens one.
            connection.close()
            sleep(wait)
            wait = min(wait * 2, _MAX_WAIT)
