from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from emailhub.env import env_bool, env_database_url, env_int, env_list


def test_database_url_becomes_a_django_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_DB", "postgres://app:s%40cret@db.internal:6432/mail")
    db = env_database_url("X_DB", "postgres://postgres@127.0.0.1/emailhub")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "app", "s@cret", "db.internal", "6432", "mail",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("mysql://root@localhost/x", "postgres://"), ("postgres://localhost", "name a database")],
)
def test_bad_database_url_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, fragment: str
) -> None:
    monkeypatch.setenv("X_DB", value)
    with pytest.raises(ImproperlyConfigured, match="X_DB") as error:
        env_database_url("X_DB", "postgres://postgres@127.0.0.1/emailhub")
    assert fragment in str(error.value)


def test_typed_helpers_reject_garbage_with_the_variable_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_INT", "ten")
    monkeypatch.setenv("X_BOOL", "maybe")
    monkeypatch.setenv("X_LIST", "smtp,carrier-pigeon")
    with pytest.raises(ImproperlyConfigured, match="X_INT must be a whole number"):
        env_int("X_INT", 1)
    with pytest.raises(ImproperlyConfigured, match="X_BOOL"):
        env_bool("X_BOOL", False)
    with pytest.raises(ImproperlyConfigured, match="X_LIST has unknown value.*carrier-pigeon"):
        env_list("X_LIST", [], allowed={"smtp", "ses"})


def test_a_process_with_a_wrong_setting_fails_at_start_up_naming_it() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "emailhub.settings", "SMTP_PORT": "twenty-five"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "SMTP_PORT must be a whole number" in result.stderr


def test_a_provider_chain_that_cannot_work_fails_the_start_up_check() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "EMAILHUB_PROVIDERS_BULK": "sendgrid,smtp",
        "SENDGRID_API_KEY": "",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "delivery.E001" in result.stderr and "SENDGRID_API_KEY" in result.stderr


def test_an_unknown_provider_name_is_refused_naming_the_setting() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "EMAILHUB_PROVIDERS_BULK": "smtp,mailchimp",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (
        result.returncode != 0 and "EMAILHUB_PROVIDERS_BULK has unknown value(s) mailchimp" in result.stderr
    )


@pytest.mark.parametrize("https", [False, True])
def test_https_setting_turns_on_the_deploy_checks_security_settings(https: bool) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "EMAILHUB_DEBUG": "false",
        "EMAILHUB_SECRET_KEY": "x" * 64 + "-not-a-development-key-" + "y" * 16,
        "EMAILHUB_PUBLIC_URL": "https://mail.example.com",
        "EMAILHUB_HTTPS": "true" if https else "false",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    warnings = {"security.W004", "security.W008", "security.W012", "security.W016"}
    if https:
        assert not {w for w in warnings if w in output}, output
    else:
        assert warnings <= {w for w in warnings if w in output}, output


@pytest.mark.parametrize("override", [True, False])
def test_check_deploy_refuses_the_test_only_certificate_fetch_override(override: bool) -> None:
    """EMAILHUB_SNS_CERT_FETCH_OVERRIDE sends SNS signing-certificate fetches to another host:
    a production process with it set would trust whatever certificate that host serves."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "emailhub.settings",
        "EMAILHUB_DEBUG": "false",
        "EMAILHUB_SECRET_KEY": "x" * 64 + "-not-a-development-key-" + "y" * 16,
        "EMAILHUB_PUBLIC_URL": "https://mail.example.com",
        "EMAILHUB_HTTPS": "true",
        "EMAILHUB_SNS_CERT_FETCH_OVERRIDE": "https://sns.us-east-1.amazonaws.com/=http://127.0.0.1:9/"
        if override
        else "",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    if override:
        assert result.returncode != 0, output
        assert "delivery.E002" in output and "EMAILHUB_SNS_CERT_FETCH_OVERRIDE" in output, output
    else:
        assert result.returncode == 0, output
        assert "delivery.E002" not in output
