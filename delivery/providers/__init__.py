"""Provider instances, one per name per process (each worker process keeps its own connections)."""

from __future__ import annotations

from django.conf import settings

from delivery.exceptions import ProviderConfigurationError
from delivery.providers.base import Outcome, OutgoingEmail, Provider, SendResult

__all__ = ["Outcome", "OutgoingEmail", "Provider", "SendResult", "get_provider", "close_all"]

_instances: dict[str, Provider] = {}


def _build(name: str) -> Provider:
    if name == "smtp":
        from delivery.providers.smtp import SMTPProvider

        return SMTPProvider(
            host=settings.SMTP_HOST,
            port=settings.SMTP_PORT,
            username=settings.SMTP_USERNAME,
            password=settings.SMTP_PASSWORD,
            starttls=settings.SMTP_STARTTLS,
            timeout=settings.SMTP_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
        )
    if name == "ses":
        from delivery.providers.ses import SESProvider

        return SESProvider(
            region=settings.SES_REGION,
            endpoint_url=settings.SES_ENDPOINT_URL,
            access_key_id=settings.SES_ACCESS_KEY_ID,
            secret_access_key=settings.SES_SECRET_ACCESS_KEY,
            configuration_set=settings.SES_CONFIGURATION_SET,
            timeout=settings.SES_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
        )
    if name == "sendgrid":
        from delivery.providers.sendgrid import SendGridProvider

        return SendGridProvider(
            api_key=settings.SENDGRID_API_KEY,
            host=settings.SENDGRID_HOST,
            timeout=settings.SENDGRID_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
        )
    if name == "locmem":
        from delivery.providers.locmem import LocmemProvider

        return LocmemProvider()
    raise ProviderConfigurationError(
        f"unknown provider {name!r}; fix EMAILHUB_PROVIDERS_TRANSACTIONAL / EMAILHUB_PROVIDERS_BULK"
    )


def get_provider(name: str) -> Provider:
    provider = _instances.get(name)
    if provider is None:
        provider = _instances[name] = _build(name)
    return provider


def close_all() -> None:
    while _instances:
        _, provider = _instances.popitem()
        provider.close()
