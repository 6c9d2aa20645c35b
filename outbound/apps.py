from __future__ import annotations

from django.apps import AppConfig


class OutboundConfig(AppConfig):
    name = "outbound"
    verbose_name = "Outbound webhooks"

    def ready(self) -> None:
        # The outbox's task kinds (the dispatcher's doorbell, an endpoint's delivery task), the
        # tasks, and the backlog gauge: Django wants such registration here.
        from core import metrics
        from outbound import checks, selectors, tasks  # noqa: F401 - registers the checks and tasks
        from outbound.services import registration

        registration.register()
        metrics.register_scrape_gauge(
            "webhooks",
            "emailhub_webhook_backlog_age_seconds",
            "Age of the oldest outbound webhook delivery waiting, per endpoint (0: none waits)",
            ["endpoint"],
            selectors.backlog_ages,
            max_age_seconds=5.0,
        )
        metrics.register_scrape_gauge(
            "webhook_events",
            "emailhub_webhook_events_waiting_seconds",
            "Age of the oldest outbound event not yet dispatched to its endpoints (0: none waits)",
            [],
            selectors.undispatched_age,
            max_age_seconds=5.0,
        )
