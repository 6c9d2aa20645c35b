"""Circuit breakers and token buckets on the real Redis (the test database 15)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from delivery import breakers
from delivery.exceptions import ProviderSkipped, ProviderUnavailable
from delivery.providers import close_all, get_provider
from delivery.providers.base import OutgoingEmail, Provider, SendResult
from delivery.ratelimit import TokenBucket
from delivery.services.gateway import send_via


@pytest.fixture(autouse=True)
def small_breakers(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_BREAKER_FAIL_MAX = 3
    settings.EMAILHUB_BREAKER_RESET_TIMEOUT = 1.0


def down() -> list[SendResult]:
    raise ProviderUnavailable("connection refused")


@contextmanager
def reset_timeout_passed() -> Iterator[None]:
    """This process's clock moved past the breakers' reset timeout (1 s here), instead of sleeping
    through it: pybreaker compares its own clock with the instant the circuit opened (in Redis)."""
    with time_machine.travel(datetime.now(UTC) + timedelta(seconds=2), tick=True):
        yield


def another_process() -> None:
    """Forget this process's breaker objects: the next calls behave like a new worker process."""
    breakers.reset_process_state()


def test_breaker_opens_after_fail_max_failures_counted_across_processes() -> None:
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call("ses", down)
    another_process()
    with pytest.raises(ProviderUnavailable):  # the third failure, in "another process", trips it
        breakers.guarded_call("ses", down)
    assert breakers.breaker_for("ses").current_state == "open"
    calls = []
    with pytest.raises(breakers.CircuitOpen):
        breakers.guarded_call("ses", lambda: calls.append(1))
    assert calls == []
    snapshot = breakers.snapshot("ses")
    assert snapshot["state"] == "open" and snapshot["times_opened"] == 1
    assert "connection refused" in str(snapshot["last_error"])


def test_permanent_recipient_errors_never_open_the_breaker() -> None:
    for _ in range(10):
        breakers.guarded_call("ses", lambda: [SendResult.permanent("550 no such user")])
    assert breakers.breaker_for("ses").current_state == "closed"


def test_a_bug_is_not_a_provider_failure() -> None:
    for _ in range(5):
        with pytest.raises(KeyError):
            breakers.guarded_call("ses", lambda: {}["x"])
    assert breakers.breaker_for("ses").current_state == "closed"


def test_after_reset_timeout_one_probe_closes_it_again() -> None:
    for _ in range(3):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call("ses", down)
    with pytest.raises(breakers.CircuitOpen):  # before the reset timeout: refused, no call
        breakers.guarded_call("ses", lambda: pytest.fail("called while open"))
    with reset_timeout_passed():
        assert breakers.guarded_call("ses", lambda: "ok") == "ok"
    assert breakers.breaker_for("ses").current_state == "closed"


def test_while_one_process_probes_the_others_skip_the_provider() -> None:
    for _ in range(3):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call("ses", down)
    seen = []

    def probe() -> str:
        another_process()  # a second worker process asks while the probe is in flight
        with pytest.raises(breakers.CircuitOpen, match="probing"):
            breakers.guarded_call("ses", lambda: seen.append("second"))
        return "ok"

    with reset_timeout_passed():
        assert breakers.guarded_call("ses", probe) == "ok"
    assert seen == []


def test_breaker_fails_open_when_redis_is_unreachable(settings) -> None:  # noqa: ANN001
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    another_process()
    assert breakers.guarded_call("ses", lambda: "sent anyway") == "sent anyway"


class CountingProvider(Provider):
    name = "counting"

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_batch(self, emails, guard):  # noqa: ANN001, ANN201
        self.sent.extend(e.message_id for e in emails)
        return [SendResult.accepted(str(e.message_id)) for e in emails]


def test_bulk_cannot_take_the_reserved_share_but_critical_can() -> None:
    bucket = TokenBucket("test", rate=10, reserved_fraction=0.2)
    assert bucket.take(10, reserved=False).granted == 8  # two tokens stay for critical
    assert bucket.take(1, reserved=False).granted == 0
    assert bucket.take(2, reserved=True).granted == 2
    refused = bucket.take(1, reserved=True)
    assert refused.granted == 0 and 0 < refused.wait_seconds <= 0.15


def test_bucket_refills_at_the_quota_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = TokenBucket("refill", rate=100, reserved_fraction=0)
    assert bucket.take(100, reserved=False).granted == 100
    pauses: list[float] = []
    real_sleep = time.sleep

    def recorded_sleep(seconds: float) -> None:
        pauses.append(seconds)
        real_sleep(seconds)  # the bucket's clock is Redis's (TIME): real time must pass

    monkeypatch.setattr("delivery.ratelimit.time.sleep", recorded_sleep)
    assert bucket.acquire(50, reserved=False, max_wait=5) == 50
    # The waits the bucket asked for are what 50 tokens take at 100/s (a refill that came a few
    # milliseconds short adds a 10 ms pause or two; a sleep that overslept adds nothing).
    assert pauses and 0.45 <= sum(pauses) <= 0.55


def test_gateway_skips_a_provider_without_quota_and_sends_what_fits(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDER_CLASSES = [
        *settings.EMAILHUB_PROVIDER_CLASSES,
        "tests.test_breakers_and_rate_limits.CountingProvider",
    ]
    settings.EMAILHUB_RATE_LIMITS = {"counting": 5.0}
    settings.EMAILHUB_RATE_RESERVED_FRACTION = 0.2
    settings.EMAILHUB_RATE_MAX_WAIT_SECONDS = 0
    provider = get_provider("counting")
    assert isinstance(provider, CountingProvider)
    try:
        emails = [OutgoingEmail(n, f"u{n}@example.com", "a@example.com", "s", "t", "") for n in range(6)]
        results = send_via("counting", emails, transactional=False)
        assert [r.outcome.value for r in results] == ["accepted"] * 4 + ["transient"] * 2
        assert provider.sent == [0, 1, 2, 3]
        with pytest.raises(ProviderSkipped, match="quota"):
            send_via("counting", emails, transactional=False)
        assert [r.outcome.value for r in send_via("counting", emails[:1], transactional=True)] == ["accepted"]
    finally:
        close_all()


def test_two_processes_tripping_at_once_count_one_opening() -> None:
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call("ses", down)
    first = breakers.breaker_for("ses")
    another_process()
    second = breakers.breaker_for("ses")

    def in_flight_when_the_other_trips() -> list[SendResult]:
        with pytest.raises(ProviderUnavailable):
            breakers.call_replayed(second, down)  # the third failure: the other process opens it
        raise ProviderUnavailable("timed out")  # then this call, started while closed, fails too

    with pytest.raises(ProviderUnavailable):
        breakers.call_replayed(first, in_flight_when_the_other_trips)
    snapshot = breakers.snapshot("ses")
    assert snapshot["state"] == "open" and snapshot["failures_total"] == 4
    assert snapshot["times_opened"] == 1


def trip(breaker_name: str = "ses") -> None:
    for _ in range(3):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call(breaker_name, down)


def test_a_process_that_saw_the_circuit_closed_never_calls_the_provider_another_just_opened() -> None:
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            breakers.guarded_call("ses", down)
    looked_while_closed = breakers.breaker_for("ses")
    another_process()
    with pytest.raises(ProviderUnavailable):  # the other process's third failure opens it
        breakers.call_replayed(breakers.breaker_for("ses"), down)
    calls = []
    with pytest.raises(breakers.CircuitOpen):
        breakers.call_replayed(looked_while_closed, lambda: calls.append("sent"))
    assert calls == []
    assert breakers.snapshot("ses")["failures_total"] == 3


def test_a_probe_whose_circuit_another_probe_reopened_still_counts_its_failure() -> None:
    trip()
    prober = breakers.breaker_for("ses")

    def refused_while_the_other_probe_fails() -> list[SendResult]:
        another_process()
        with pytest.raises(ProviderUnavailable):  # the other process probes too, and re-opens it
            breakers.call_replayed(breakers.breaker_for("ses"), down)
        raise ProviderUnavailable("SES 500")

    with reset_timeout_passed(), pytest.raises(ProviderUnavailable, match="SES 500"):
        breakers.call_replayed(prober, refused_while_the_other_probe_fails)
    snapshot = breakers.snapshot("ses")
    assert snapshot["state"] == "open" and snapshot["failures_total"] == 5  # 3 + both probes
    assert "SES 500" in str(snapshot["last_error"])
