"""Celery tasks of the scheduling app: thin adapters over the services."""

from __future__ import annotations

from celery import shared_task

from scheduling import reconciler, recurring


@shared_task(name="scheduling.run_recurring", ignore_result=True)
def run_recurring() -> int:
    return recurring.run_due()


@shared_task(name="scheduling.reconcile", ignore_result=True)
def reconcile() -> dict[str, object]:
    return vars(reconciler.reconcile())
