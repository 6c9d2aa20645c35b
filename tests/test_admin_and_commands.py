from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.apps import apps
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.urls import reverse

from campaigns.models import Campaign, Template
from delivery.models import ApiKey, Message
from tests import factories

OUR_APPS = ("campaigns", "delivery", "scheduling")


def test_every_model_is_in_the_admin() -> None:
    for app in OUR_APPS:
        for model in apps.get_app_config(app).get_models():
            assert admin.site.is_registered(model), model.__name__


@pytest.mark.django_db
def test_every_admin_changelist_and_add_page_renders(admin_client) -> None:  # noqa: ANN001
    factories.campaign("c")
    Message.objects.create(to_email="a@example.com", subject="s", text="t", priority="high")
    for app in OUR_APPS:
        for model in apps.get_app_config(app).get_models():
            meta = model._meta
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
            assert admin_client.get(url).status_code == 200, url
            assert admin_client.get(url, {"q": "a@example.com"}).status_code == 200, url


@pytest.mark.django_db
def test_message_admin_filters_by_status_and_priority(admin_client) -> None:  # noqa: ANN001
    Message.objects.create(
        to_email="a@example.com", subject="s", text="t", priority="critical", status="sent"
    )
    Message.objects.create(to_email="b@example.com", subject="s", text="t", priority="low", status="queued")
    url = reverse("admin:delivery_message_changelist")
    page = admin_client.get(url, {"status__exact": "sent", "priority__exact": "critical"}).content.decode()
    assert "a@example.com" in page and "b@example.com" not in page


@pytest.mark.django_db
def test_create_api_key_prints_the_key_once_and_stores_only_its_hash() -> None:
    out = StringIO()
    call_command("create_api_key", "billing", stdout=out)
    raw = out.getvalue().strip()
    key = ApiKey.objects.get(name="billing")
    assert raw.startswith("eh_") and len(raw) > 40
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(ApiKey.objects.values_list(flat=False))


@pytest.mark.django_db
def test_create_api_key_refuses_a_taken_name_with_a_clear_message() -> None:
    call_command("create_api_key", "billing", stdout=StringIO())
    with pytest.raises(CommandError, match="exists already"):
        call_command("create_api_key", "billing", stdout=StringIO())
    assert ApiKey.objects.count() == 1


@pytest.mark.django_db
def test_periodic_tasks_exist_and_are_not_overwritten_by_a_restart() -> None:
    from django_celery_beat.models import PeriodicTask

    from emailhub.periodic import PERIODIC_TASKS, ensure_periodic_tasks

    ensure_periodic_tasks()
    relay = PeriodicTask.objects.get(name="emailhub: relay outbox")
    assert relay.task == "delivery.relay_outbox" and relay.queue == "system" and relay.interval.every == 1
    relay.enabled = False  # an operator's edit in the admin
    relay.save()
    assert ensure_periodic_tasks() == 0
    assert PeriodicTask.objects.get(name="emailhub: relay outbox").enabled is False
    assert set(PERIODIC_TASKS) <= set(PeriodicTask.objects.values_list("name", flat=True))


@pytest.mark.django_db
def test_provider_health_page_shows_each_configured_provider(admin_client, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["locmem", "smtp"]
    settings.EMAILHUB_PROVIDERS_BULK = ["smtp"]
    page = admin_client.get("/admin/providers/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "locmem" in html and "smtp" in html and "closed" in html


@pytest.mark.django_db
def test_provider_health_api_shows_circuits_and_tokens(api, settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["locmem", "smtp"]
    settings.EMAILHUB_PROVIDERS_BULK = ["smtp"]
    settings.EMAILHUB_RATE_LIMITS = {"smtp": 50.0}
    body = api.get("/api/v1/providers").json()
    assert body["chains"] == {"transactional": ["locmem", "smtp"], "bulk": ["smtp"]}
    by_name = {p["name"]: p for p in body["providers"]}
    assert by_name["smtp"]["pools"] == ["transactional", "bulk"]
    assert by_name["smtp"]["circuit"]["state"] == "closed"
    assert by_name["smtp"]["rate_limit"]["per_second"] == 50.0
    assert by_name["locmem"]["rate_limit"] is None


@pytest.mark.django_db
def test_campaign_admin_actions_change_state_and_report_refusals(admin_client) -> None:  # noqa: ANN001
    draft = factories.campaign("a")
    done = factories.campaign("b", status="completed")
    url = reverse("admin:campaigns_campaign_changelist")
    response = admin_client.post(
        url, {"action": "start_now", "_selected_action": [draft.pk, done.pk]}, follow=True
    )
    assert Campaign.objects.get(pk=draft.pk).status == "sending"
    assert "only a draft campaign can be scheduled; this one is completed" in response.content.decode()
    admin_client.post(url, {"action": "pause", "_selected_action": [draft.pk]})
    assert Campaign.objects.get(pk=draft.pk).status == "paused"
    admin_client.post(url, {"action": "cancel", "_selected_action": [draft.pk]})
    assert Campaign.objects.get(pk=draft.pk).status == "cancelled"


@pytest.mark.django_db
def test_template_admin_previews_with_a_sample_contact_and_escapes_html(admin_client) -> None:  # noqa: ANN001
    from campaigns.models import Contact

    Contact.objects.create(email="ann@example.com", attributes={"first_name": "<Ann>"})
    template = Template.objects.create(
        name="t", subject="Hi {{ first_name }}", html="<b>{{ first_name }}</b>"
    )
    page = admin_client.get(reverse("admin:campaigns_template_change", args=[template.pk])).content.decode()
    assert "ann@example.com" in page and "Hi &lt;Ann&gt;" in page
    assert "<b>&amp;lt;Ann&amp;gt;</b>" not in page and "&lt;b&gt;&amp;lt;Ann&amp;gt;&lt;/b&gt;" in page


@pytest.mark.django_db
def test_template_admin_refuses_a_malformed_placeholder(admin_client) -> None:  # noqa: ANN001
    response = admin_client.post(
        reverse("admin:campaigns_template_add"),
        {"name": "t", "subject": "Hi", "html": "{{ first name }}", "text": "", "defaults": "{}"},
    )
    assert response.status_code == 200 and "is not a placeholder" in response.content.decode()
    assert not Template.objects.exists()


@pytest.mark.django_db
def test_editing_a_sending_campaign_in_the_admin_never_writes_its_counters_or_status(admin_client) -> None:  # noqa: ANN001
    campaign = factories.campaign("old", status="sending")
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[campaign.pk]))
    assert page.status_code == 200
    Campaign.objects.filter(pk=campaign.pk).update(sent_count=7, status="paused")  # workers, an operator
    response = admin_client.post(
        reverse("admin:campaigns_campaign_change", args=[campaign.pk]),
        {"name": "new", "from_email": "", "priority": "normal", "window_hours": 24},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    campaign.refresh_from_db()
    assert (campaign.name, campaign.sent_count, campaign.status) == ("new", 7, "paused")
