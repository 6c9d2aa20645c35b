"""The Celery app. Queues, routing and worker defaults live here and in settings (CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import beat_init, task_prerun, worker_process_shutdown
from kombu import Exchange, Queue

from core.liveness import Heartbeat
from core.metrics_dir import mark_dead
from emailhub import broker
from emailhub.periodic import ensure_periodic_tasks  # models imported inside it, at call time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")

# kombu's Redis transport with the close that a Redis restart could turn into a dead worker mended
# (emailhub/broker.py); before any broker connection exists.
broker.install()

app = Celery("emailhub")
app.config_from_object("django.conf:settings", namespace="CELERY")

# One queue per priority plus `campaigns` for fan-out work and `system` for the periodic
# housekeeping (outbox relay, reconciler, stale-send and stall sweeps). The transactional pool
# consumes critical,high,system; the bulk pool normal,low,campaigns,system. A critical message
# never waits behind a bulk one because no process that takes bulk work ever takes critical work;
# the housekeeping is taken by both, so one dead or stuck pool never stops every pool's recovery.
# `webhooks` is the outbound webhooks' own (a worker of its own: no receiver delays mail).
PRIORITY_QUEUES = ("critical", "high", "normal", "low")
app.conf.task_queues = [
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in (*PRIORITY_QUEUES, "campaigns", "system", "webhooks")
]
app.autodiscover_tasks()
# The worker's liveness file, touched while its consumer is connected (core/liveness.py).
app.steps["consumer"].add(Heartbeat)


@task_prerun.connect
def _fresh_database_connection(**_: object) -> None:
    # What Django does at the start of every request: drop a connection that broke or outlived
    # CONN_MAX_AGE, keep a healthy one (see CELERY_DB_REUSE_MAX in settings).
    from django.db import close_old_connections

    close_old_connections()


@worker_process_shutdown.connect
def _mark_metrics_process_dead(pid: int | None = None, **_: object) -> None:
    # A prefork child leaving: its live gauges go, its counters stay summed (core/metrics_dir.py).
    # A child killed outright never gets here; its counters are kept all the same.
    mark_dead(pid or os.getpid())


@beat_init.connect
def _ensure_periodic_tasks(**_: object) -> None:
    ensure_periodic_tasks()
