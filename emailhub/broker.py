"""The Redis broker transport of every emailhub process: kombu's own, with one failure mended.

kombu 5.7.0 (the newest release, pinned in requirements.txt) can kill a Celery worker when Redis
restarts under it. The consumer's recovery (`Consumer.on_connection_error_after_connected`) first
calls `Connection.collect()`, which detaches the transport from its connection
(`transport.client = None`), then `Connection.close()`. If the task channel's first close did
not finish (it was reading a BRPOP reply when the socket died), the second one runs after the
detachment: the channel drops its Redis pools, restores its unacknowledged tasks, needs a new pool
for that, and reads the connection parameters from `transport.client`, which is None:
`AttributeError: 'NoneType' object has no attribute 'hostname'`. `ignore_errors` lets only
connection errors through, so Celery logs "Unrecoverable error" and the worker's main process
exits with its children (seen in 2 of 9 Redis restarts under a campaign in issue 18, and on the
first restart of `tests/test_broker_outage.py`'s stack; the same class is reported upstream as
celery #10205 and kombu #582/#970).

The mend: a channel remembers the kombu `Connection` it was opened for, and a close that finds
its transport detached lends it that connection back for the duration of the close, so the
unacknowledged tasks are restored (or, with Redis still down, the close fails with a connection
error, which every caller ignores) instead of raising AttributeError. Nothing else changes.
`emailhub/celery.py` installs it for `redis://` and `rediss://` broker URLs through kombu's
public alias table; RabbitMQ is untouched. tests/test_broker_outage.py pins both the state that
crashed (a channel closed after its transport was detached) and a real Redis restarted under a
running stack. Delete this module when a kombu release closes the channel before detaching.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        # The kombu.Connection behind the transport (`Transport.client`), kept past detachment.
        self._emailhub_opened_for = connection.client
        super().__init__(connection, *args, **kwargs)

    def close(self) -> None:
        transport = self.connection
        if transport is None or transport.client is not None or self._emailhub_opened_for is None:
            super().close()
            return
        transport.client = self._emailhub_opened_for
        try:
            super().close()
        finally:
            transport.client = None


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    """Make `redis://` and `rediss://` broker URLs use this transport in this process."""
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
