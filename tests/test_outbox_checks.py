"""The fast publisher's own task messages (fastpaths/publish.py) cover this project's Celery
settings; one it would not apply is refused at start-up (`manage.py check`, core.E001) instead of
being ignored. Celery's own send_task (the plain publisher) applies them all."""

from __future__ import annotations

import pytest
from django.core import checks

from core import outbox
from emailhub.celery import app


@pytest.fixture(autouse=True)
def fast_publisher(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_OUTBOX_PUBLISHER = settings.OUTBOX_PUBLISHERS["fast"]


def test_the_project_settings_pass() -> None:
    assert outbox.publisher().configuration_problems() == []
    assert [m for m in checks.run_checks() if m.id == "core.E001"] == []


@pytest.mark.parametrize(
    ("setting", "value"),
    [("task_routes", {"delivery.*": {"queue": "low"}}), ("task_compression", "gzip"), ("task_protocol", 1)],
)
def test_a_setting_the_outbox_would_ignore_stops_the_process(
    monkeypatch: pytest.MonkeyPatch, setting: str, value: object
) -> None:
    monkeypatch.setitem(app.conf, setting, value)
    errors = [m for m in checks.run_checks() if m.id == "core.E001"]
    assert len(errors) == 1 and f"CELERY_{setting.upper()}" in errors[0].msg


def test_the_plain_publisher_applies_every_setting(monkeypatch: pytest.MonkeyPatch, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_OUTBOX_PUBLISHER = settings.OUTBOX_PUBLISHERS["plain"]
    monkeypatch.setitem(app.conf, "task_compression", "gzip")
    assert [m for m in checks.run_checks() if m.id == "core.E001"] == []
