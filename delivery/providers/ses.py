"""Amazon SES through boto3's `sesv2` client.

Each email is sent as raw MIME (`Content.Raw`), built exactly as the SMTP provider builds it, so
both providers deliver the same bytes: multipart/alternative, our headers, our Message-ID.
boto3's own retries are off (one attempt per call): a slow or failing SES must fail fast so the
failover chain and the circuit breaker, not botocore, decide what happens next.
"""

from __future__ import annotations

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from delivery.exceptions import ProviderThrottled, ProviderUnavailable
from delivery.providers.base import OutgoingEmail, Provider, SendResult, url_endpoint
from delivery.providers.mime import ascii_address, bare_address, render

# SES error codes (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html).
THROTTLING = {"TooManyRequestsException", "Throttling", "ThrottlingException", "LimitExceededException"}
ACCOUNT_BLOCKED = {
    "SendingPausedException",
    "MailFromDomainNotVerifiedException",
    "AccountSuspendedException",
}
BAD_RECIPIENT = {"MessageRejected", "InvalidParameterValue", "BadRequestException"}


class SESProvider(Provider):
    name = "ses"

    def __init__(
        self,
        *,
        region: str,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        configuration_set: str | None = None,
        timeout: float = 10.0,
        message_id_domain: str = "emailhub.local",
    ) -> None:
        self.configuration_set = configuration_set
        self.message_id_domain = message_id_domain
        self.client = boto3.client(
            "sesv2",
            region_name=region,
            endpoint_url=endpoint_url or None,
            aws_access_key_id=access_key_id or None,
            aws_secret_access_key=secret_access_key or None,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=timeout,
                read_timeout=timeout,
                max_pool_connections=4,
            ),
        )
        # The region's endpoint (its name is in the URL) or SES_ENDPOINT_URL, as boto3 resolved it.
        self.endpoint = url_endpoint(self.client.meta.endpoint_url)

    @classmethod
    def from_settings(cls) -> SESProvider:
        return cls(
            region=settings.SES_REGION,
            endpoint_url=settings.SES_ENDPOINT_URL,
            access_key_id=settings.SES_ACCESS_KEY_ID,
            secret_access_key=settings.SES_SECRET_ACCESS_KEY,
            configuration_set=settings.SES_CONFIGURATION_SET,
            timeout=settings.SES_TIMEOUT,
            message_id_domain=settings.EMAILHUB_MESSAGE_ID_DOMAIN,
        )

    def send_one(self, email: OutgoingEmail) -> SendResult:
        _, data = render(email, message_id_domain=self.message_id_domain)
        request: dict = {
            "FromEmailAddress": bare_address(email.from_email),
            "Destination": {
                "ToAddresses": [ascii_address(email.to)],
                "CcAddresses": [ascii_address(address) for address in email.cc],
                "BccAddresses": [ascii_address(address) for address in email.bcc],
            },
            "Content": {"Raw": {"Data": data}},
        }
        if self.configuration_set:
            request["ConfigurationSetName"] = self.configuration_set
        try:
            response = self.client.send_email(**request)
        except ClientError as exc:
            return self._classify(exc, email)
        except BotoCoreError as exc:  # connection refused, timeouts, bad endpoint
            raise ProviderUnavailable(f"SES unreachable: {exc}", provider=self.name) from exc
        return SendResult.accepted(response["MessageId"])

    def _classify(self, exc: ClientError, email: OutgoingEmail) -> SendResult:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        detail = f"SES {status} {code}: {message}"
        if code in THROTTLING or status == 429:
            # Over the account's send rate: SES is up and says "slow down". It sends no
            # Retry-After, so the pause is EMAILHUB_THROTTLE_DEFAULT_SECONDS.
            raise ProviderThrottled(
                detail, provider=self.name, status=status, body=f"{code}: {message}"
            ) from exc
        if status >= 500 or code in ACCOUNT_BLOCKED:
            raise ProviderUnavailable(
                detail, provider=self.name, status=status, body=f"{code}: {message}"
            ) from exc
        if code in BAD_RECIPIENT:
            # SES also answers MessageRejected when *our sender* is not verified. That is a
            # configuration fault, not a bad recipient: fail over, never suppress the recipient.
            if bare_address(email.from_email).lower() in message.lower():
                raise ProviderUnavailable(
                    f"{detail} (verify this sender identity in SES or change EMAILHUB_DEFAULT_FROM)",
                    provider=self.name,
                    status=status,
                    body=f"{code}: {message}",
                ) from exc
            return SendResult.permanent(detail)
        return SendResult.transient(detail)
