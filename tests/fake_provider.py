"""A provider plug-in that lives outside the app: this one module plus its dotted path in
`EMAILHUB_PROVIDER_CLASSES` make it usable in the provider chains (tests/test_provider_plugins.py)."""

from __future__ import annotations

from django.conf import settings

from delivery.providers.base import OutgoingEmail, Provider, SendResult


class FakeProvider(Provider):
    name = "fake"

    def __init__(self, *, prefix: str) -> None:
        self.prefix = prefix
        self.sent: list[OutgoingEmail] = []

    @classmethod
    def from_settings(cls) -> FakeProvider:
        # Its own setting, read the way the real providers read theirs.
        return cls(prefix=getattr(settings, "FAKE_PROVIDER_PREFIX", "fake"))

    def send_one(self, email: OutgoingEmail) -> SendResult:
        self.sent.append(email)
        return SendResult.accepted(f"{self.prefix}-{email.message_id}")
