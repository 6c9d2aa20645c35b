"""One provider name, two relays (the bulk processes' SMTP_HOST/SMTP_PORT differ from the
transactional ones'): each relay has its own circuit, send-rate bucket and pause.

Two configurations in this process stand for the two kinds of worker process: `as_process`
rebuilds the provider from the settings and forgets this process's breakers, as a new worker
process would; the breaker state they share lives in Redis, as between real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from rest_framework.test import APIClient

from delivery import breakers
from delivery.exceptions import ProviderSkipped, ProviderUnavailable
from delivery.providers import OutgoingEmail, close_all
from delivery.providers.locmem import LocmemProvider
from delivery.providers.sendgrid import SendGridProvider
from delivery.providers.ses import SESProvider
from delivery.providers.smtp import SMTPProvider
from delivery.selectors import provider_health
from delivery.services.gateway import send_via
from delivery.testing.smtp_server import SMTPTestServer
from scripts.stack import Stack
from tests.conftest import wait_for_status
from tests.test_metrics import scrape, total

FAIL_MAX = 3


@pytest.fixture
def dead_relay() -> Iterator[SMTPTestServer]:
    with SMTPTestServer() as server:
        yield server


@pytest.fixture(autouse=True)
def small_breakers(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_BREAKER_FAIL_MAX = FAIL_MAX
    settings.EMAILHUB_BREAKER_RESET_TIMEOUT = 300.0
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    settings.EMAILHUB_PROVIDERS_BULK = ["smtp"]


def email(n: int) -> OutgoingEmail:
    return OutgoingEmail(n, f"user{n}@example.com", "a@example.com", f"s{n}", "t", "")


def as_process(settings, relay: SMTPTestServer) -> None:  # noqa: ANN001
    """From here on, this process is a worker whose SMTP provider points at `relay`."""
    settings.SMTP_PORT = relay.port
    close_all()
    breakers.reset_process_state()


def test_each_provider_names_its_endpoint_without_credentials() -> None:
    assert (
        SMTPProvider(host="relay.example.com", port=587, password="secret").endpoint
        == "relay.example.com:587"
    )
    assert SMTPProvider(host="::1", port=25).endpoint == "[::1]:25"
    assert SESProvider(region="eu-west-1").endpoint == "https://email.eu-west-1.amazonaws.com"
    local = SESProvider(region="us-east-1", endpoint_url="http://127.0.0.1:4566/")
    assert local.endpoint == "http://127.0.0.1:4566"
    sendgrid = SendGridProvider(
        api_key="SG.key", host="https://user:secret@api.example.com:8443/v3/?token=x#f"
    )
    assert sendgrid.endpoint == "https://api.example.com:8443/v3"
    assert LocmemProvider().endpoint == ""


def test_a_dead_relay_opens_its_own_circuit_while_the_healthy_relays_successes_leave_it_alone(
    settings, smtp: SMTPTestServer, dead_relay: SMTPTestServer
) -> None:  # noqa: ANN001
    dead_relay.reply_to_everyone("421 4.3.2 service not available")
    for n in range(FAIL_MAX):
        as_process(settings, dead_relay)  # a bulk worker
        with pytest.raises(ProviderUnavailable):
            send_via("smtp", [email(n)], transactional=False)
        as_process(settings, smtp)  # a transactional worker, between the bulk failures
        [result] = send_via("smtp", [email(100 + n)], transactional=True)
        assert result.outcome.value == "accepted"

    # FAIL_MAX failures in a row on the dead relay: its circuit is open, the next bulk batch is
    # skipped at once instead of waiting out its timeouts.
    as_process(settings, dead_relay)
    with pytest.raises(ProviderSkipped, match="circuit open"):
        send_via("smtp", [email(50)], transactional=False)
    as_process(settings, smtp)
    [result] = send_via("smtp", [email(150)], transactional=True)
    assert result.outcome.value == "accepted"
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == sorted(
        f"user{n}@example.com" for n in (100, 101, 102, 150)
    )

    # Both circuits are shown, each naming its relay.
    circuits = {p["endpoint"]: p for p in provider_health() if p["name"] == "smtp"}
    assert set(circuits) == {f"127.0.0.1:{dead_relay.port}", f"127.0.0.1:{smtp.port}"}
    dead = circuits[f"127.0.0.1:{dead_relay.port}"]
    assert dead["circuit"]["state"] == "open" and dead["pools"] == ["bulk"]
    assert "421" in str(dead["circuit"]["last_error"])
    healthy = circuits[f"127.0.0.1:{smtp.port}"]
    assert healthy["circuit"]["state"] == "closed" and healthy["pools"] == ["transactional"]
    assert healthy["circuit"]["failures_total"] == 0


def test_a_relay_that_says_slow_down_pauses_only_itself(
    settings, smtp: SMTPTestServer, dead_relay: SMTPTestServer
) -> None:  # noqa: ANN001
    dead_relay.reply_to_everyone("421 4.7.0 too many messages, slow down")
    as_process(settings, dead_relay)
    with pytest.raises(ProviderSkipped, match="rate limited"):
        send_via("smtp", [email(1)], transactional=False)
    with pytest.raises(ProviderSkipped, match="paused"):
        send_via("smtp", [email(2)], transactional=False)
    as_process(settings, smtp)
    [result] = send_via("smtp", [email(3)], transactional=True)
    assert result.outcome.value == "accepted"


def test_each_relay_has_its_own_send_rate_bucket(
    settings, smtp: SMTPTestServer, dead_relay: SMTPTestServer
) -> None:  # noqa: ANN001
    settings.EMAILHUB_RATE_LIMITS = {"smtp": 5.0}  # the quota of each relay the name points at
    settings.EMAILHUB_RATE_RESERVED_FRACTION = 0.2
    settings.EMAILHUB_RATE_MAX_WAIT_SECONDS = 0
    other_relay = dead_relay  # healthy here
    as_process(settings, smtp)
    results = send_via("smtp", [email(n) for n in range(6)], transactional=False)
    assert [r.outcome.value for r in results] == ["accepted"] * 4 + ["transient"] * 2
    as_process(settings, other_relay)
    results = send_via("smtp", [email(n) for n in range(10, 16)], transactional=False)
    assert [r.outcome.value for r in results] == ["accepted"] * 4 + ["transient"] * 2
    assert smtp.count == other_relay.count == 4


@pytest.mark.processes
def test_on_real_workers_the_bulk_relays_circuit_opens_while_critical_mail_flows_through_the_other(
    stack: Stack,
    api: APIClient,
    api_key,  # noqa: ANN001
    smtp: SMTPTestServer,
    dead_relay: SMTPTestServer,
    web_port: int,
) -> None:
    dead_relay.reply_to_everyone("421 4.3.2 service not available")
    env = {"EMAILHUB_BREAKER_FAIL_MAX": str(FAIL_MAX), "EMAILHUB_BREAKER_RESET_TIMEOUT": "300"}
    stack.start("worker-transactional", extra_env=env)  # SMTP_PORT: the healthy relay
    stack.start("worker-bulk", extra_env={**env, "SMTP_PORT": str(dead_relay.port)})
    stack.start_web(web_port, extra_env=env)

    def send(priority: str, n: int) -> int:
        body = {"to": f"{priority}{n}@example.com", "subject": "s", "text": "t", "priority": priority}
        return int(api.post("/api/v1/messages", body, format="json").json()["id"])

    # A bulk failure, then critical mail sent through the healthy relay, FAIL_MAX times over.
    for n in range(FAIL_MAX):
        wait_for_status(send("normal", n), "retry_wait", 30)
        wait_for_status(send("critical", n), "sent", 30)
    # The dead relay's circuit is open: the next bulk message is not even tried there.
    message = wait_for_status(send("normal", FAIL_MAX), "retry_wait", 30)
    assert message.attempts == 0 and message.last_error.startswith("smtp: circuit open"), message.last_error
    assert sorted(m.rcpt_tos[0] for m in smtp.messages) == [
        f"critical{n}@example.com" for n in range(FAIL_MAX)
    ]

    # The web process (its own SMTP settings: the healthy relay's) shows both circuits.
    response = requests.get(
        f"http://127.0.0.1:{web_port}/api/v1/providers",
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=10,
    )
    circuits = {p["endpoint"]: p for p in response.json()["providers"] if p["name"] == "smtp"}
    dead, healthy = f"127.0.0.1:{dead_relay.port}", f"127.0.0.1:{smtp.port}"
    assert set(circuits) == {dead, healthy}
    assert (circuits[dead]["circuit"]["state"], circuits[dead]["pools"]) == ("open", ["bulk"])
    assert (circuits[healthy]["circuit"]["state"], circuits[healthy]["pools"]) == (
        "closed",
        ["transactional"],
    )
    samples = scrape(web_port)
    assert total(samples, "emailhub_circuit_state", provider="smtp", endpoint=dead) == 2
    assert total(samples, "emailhub_circuit_state", provider="smtp", endpoint=healthy) == 0
