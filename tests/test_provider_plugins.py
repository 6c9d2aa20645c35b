"""Providers plug in like django-anymail's backends: one module plus one setting adds one; the
chains are checked against the registry; errors are structured; an unsupported feature raises."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from delivery.exceptions import ProviderConfigurationError, ProviderThrottled, ProviderUnavailable
from delivery.models import Message, MessageStatus
from delivery.providers import check_provider_settings, close_all, get_provider, provider_classes
from delivery.providers.base import Outcome, OutgoingEmail
from delivery.providers.sendgrid import SendGridProvider
from delivery.services.sending import send_messages
from delivery.testing.sendgrid_server import SendGridTestServer
from tests.fake_provider import FakeProvider

PROVIDERS = Path(__file__).resolve().parent.parent / "delivery" / "providers"


@pytest.fixture
def fake(settings) -> Iterator[None]:  # noqa: ANN001
    settings.EMAILHUB_PROVIDER_CLASSES = [
        *settings.EMAILHUB_PROVIDER_CLASSES,
        "tests.fake_provider.FakeProvider",
    ]
    settings.FAKE_PROVIDER_PREFIX = "plugged"
    close_all()
    yield
    close_all()


@pytest.fixture
def sendgrid_server() -> Iterator[SendGridTestServer]:
    with SendGridTestServer() as server:
        yield server


def email(n: int, **fields: object) -> OutgoingEmail:
    defaults: dict[str, object] = {
        "message_id": n,
        "to": f"user{n}@example.com",
        "from_email": "Shop <shop@example.com>",
        "subject": f"Receipt {n}",
        "text": "same",
        "html": "<p>same</p>",
    }
    return OutgoingEmail(**{**defaults, **fields})  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_provider_in_one_module_plus_one_setting_sends_a_message(fake: None, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["fake"]
    check_provider_settings()
    message = Message.objects.create(
        to_email="ann@example.com",
        subject="Hi",
        text="hello",
        priority="critical",
        status=MessageStatus.QUEUED,
    )
    assert send_messages([message.pk]).sent == 1
    message.refresh_from_db()
    assert message.status == "sent" and message.provider == "fake"
    assert message.provider_message_id == f"plugged-{message.pk}"
    provider = get_provider("fake")
    assert isinstance(provider, FakeProvider)
    assert [(e.message_id, e.to) for e in provider.sent] == [(message.pk, "ann@example.com")]


def test_the_registry_holds_the_four_built_in_providers() -> None:
    assert set(provider_classes()) == {"smtp", "ses", "sendgrid", "locmem"}


def test_a_chain_naming_an_unregistered_provider_fails_the_check_naming_the_setting(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_BULK = ["smtp", "fake"]
    with pytest.raises(ProviderConfigurationError, match="EMAILHUB_PROVIDERS_BULK has unknown value.*fake"):
        check_provider_settings()
    with pytest.raises(SystemCheckError, match="delivery.E001"):
        call_command("check")


def test_a_bad_class_path_is_a_configuration_error_naming_the_setting(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDER_CLASSES = [*settings.EMAILHUB_PROVIDER_CLASSES, "tests.fake_provider.Nothing"]
    with pytest.raises(ProviderConfigurationError, match="EMAILHUB_PROVIDER_CLASSES"):
        check_provider_settings()


def test_no_provider_module_imports_another_provider_module() -> None:
    """Shared helpers live in base.py, mime.py and dkim.py (signing, any provider that sends raw
    MIME may use it); ses.py once took `bare_address` from smtp.py. A provider's own companion
    module (`smtp_replies.py`, what an SMTP reply means) is that provider's alone."""
    shared = {
        "delivery.providers",
        "delivery.providers.base",
        "delivery.providers.mime",
        "delivery.providers.dkim",
    }
    for path in PROVIDERS.glob("*.py"):
        if path.name in {"__init__.py", "base.py", "mime.py", "dkim.py"}:
            continue
        imported = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("delivery.providers")
        }
        own = {m for m in imported if m.startswith(f"delivery.providers.{path.stem.split('_')[0]}_")}
        assert imported - own <= shared, (path.name, imported - own - shared)


def test_sendgrid_batch_sends_each_recipient_its_own_headers(sendgrid_server: SendGridTestServer) -> None:
    provider = SendGridProvider(api_key=sendgrid_server.api_key, host=sendgrid_server.url, timeout=5)
    batch = [email(n, headers={"List-Unsubscribe": f"<https://example.com/u/{n}>"}) for n in range(3)]
    batch.append(email(3))  # no headers of its own
    results = provider.send_batch(batch)
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 4
    assert len(sendgrid_server.requests) == 1  # still one request for the shared content
    by_to = {d.to: d.headers for d in sendgrid_server.delivered}
    for n in range(3):
        assert by_to[f"user{n}@example.com"]["List-Unsubscribe"] == f"<https://example.com/u/{n}>"
    assert "List-Unsubscribe" not in by_to["user3@example.com"]
    assert all(headers["Message-ID"].startswith("<") for headers in by_to.values())


def test_sendgrid_refuses_a_header_it_cannot_set_instead_of_dropping_it(
    sendgrid_server: SendGridTestServer,
) -> None:
    provider = SendGridProvider(api_key=sendgrid_server.api_key, host=sendgrid_server.url, timeout=5)
    results = provider.send_batch([email(1, headers={"X-SG-ID": "mine"}), email(2)])
    assert results[0].outcome is Outcome.PERMANENT and not results[0].suppress
    assert "X-SG-ID" in results[0].error and "not supported" in results[0].error
    assert results[1].outcome is Outcome.ACCEPTED
    assert [d.to for d in sendgrid_server.delivered] == ["user2@example.com"]


def test_provider_errors_carry_provider_status_body_and_retry_after(
    sendgrid_server: SendGridTestServer,
) -> None:
    provider = SendGridProvider(api_key=sendgrid_server.api_key, host=sendgrid_server.url, timeout=5)
    sendgrid_server.fail_with(503)
    with pytest.raises(ProviderUnavailable) as down:
        provider.send_batch([email(1)])
    assert (down.value.provider, down.value.status) == ("sendgrid", 503)
    assert "injected failure" in down.value.body and down.value.retry_after is None
    sendgrid_server.fail_with(429, retry_after="7")
    with pytest.raises(ProviderThrottled) as throttled:
        provider.send_batch([email(1)])
    assert (throttled.value.provider, throttled.value.status, throttled.value.retry_after) == (
        "sendgrid",
        429,
        7.0,
    )
    assert throttled.value.partial == {}
