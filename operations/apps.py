from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """What an operator watches across every app: the admin's dashboard. It sits above the
    apps (it reads their public selectors) and below the configuration; nothing imports it but
    the URLs. It owns no table."""

    name = "operations"
    verbose_name = "Operations"
