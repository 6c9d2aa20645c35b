from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = "Campaigns and audiences"

    def ready(self) -> None:
        # Imported here, not at the top: the module reaches core.outbox and its model, which
        # exist only once the app registry is ready.
        from campaigns import checks, fanout_tasks  # noqa: F401 - checks registers the system checks

        fanout_tasks.register()
