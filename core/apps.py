from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The layer below campaigns, scheduling and delivery: the outbox and its registry of event
    kinds, the schedule index, shared validators and the template language. It imports no app."""

    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        from core import checks  # noqa: F401 - registers the system checks
