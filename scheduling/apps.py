from django.apps import AppConfig

# The queue snapshot is a sequential scan of delivery_message (~1 s per 10M rows, see
# docs/scheduling.md): a gunicorn worker reuses its last one this long, so several scrapers (or
# a scraper retrying) cost one scan per worker per interval, not one each.
QUEUE_DEPTH_MAX_AGE_SECONDS = 10.0


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self) -> None:
        from core import metrics
        from scheduling import selectors

        metrics.register_scrape_gauge(
            "queue",
            "emailhub_queue_depth",
            "Messages pending (queued or due) and processing (sending), per priority",
            ["priority", "state"],
            selectors.queue_depths,
            max_age_seconds=QUEUE_DEPTH_MAX_AGE_SECONDS,
        )
