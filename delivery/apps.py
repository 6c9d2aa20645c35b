from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "delivery"
    verbose_name = "Delivery"

    def ready(self) -> None:
        from core import metrics
        from delivery import (
            checks,  # noqa: F401 - registers the system checks
            selectors,
        )
        from delivery.services import send_tasks

        send_tasks.register()
        metrics.register_scrape_gauge(
            "circuits",
            "emailhub_circuit_state",
            "Provider circuit breaker, per provider endpoint: 0 closed, 1 half-open, 2 open",
            ["provider", "endpoint"],
            selectors.circuit_states,
        )
