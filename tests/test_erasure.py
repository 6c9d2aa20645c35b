"""Deleting a contact anonymises it: personal data goes, the delivery record stays (issue 8, item 3)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns import lifecycle
from campaigns.fanout import fan_out
from campaigns.models import Campaign, Contact, ListMembership
from campaigns.services import add_list_members
from delivery.models import EmailEvent, Message
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def history(email: str = "ann@example.com") -> tuple[Contact, Campaign, Message, Message, Message]:
    """A contact in a list, with a sent campaign message (and its webhook event), a transactional
    message to the same address, and a campaign message still queued."""
    contact = factories.contact(email, name="Ann", attributes={"plan": "gold"}, timezone="Europe/Paris")
    contact_list = factories.contact_list()
    add_list_members(contact_list, [contact.pk])
    template = factories.template()
    old = factories.campaign(
        "old", template=template, contact_list=contact_list, status="completed", total_count=1, sent_count=1
    )
    sent = Message.objects.create(
        to_email=email, campaign=old, contact=contact, template=template, priority="normal",
        status="sent", sent_at=timezone.now(), provider="smtp", provider_message_id="<abc@x>",
    )  # fmt: skip
    EmailEvent.objects.create(
        message=sent, kind="delivered", provider="smtp", occurred_at=timezone.now(), payload={"to": email}
    )
    transactional = Message.objects.create(
        to_email=email.upper(), subject="Your code, Ann", text="1234", priority="critical", status="sent",
        sent_at=timezone.now(), context={"name": "Ann"},
    )  # fmt: skip
    running = factories.campaign(
        "running", template=template, contact_list=contact_list, status="sending", total_count=1
    )
    queued = Message.objects.create(
        to_email=email,
        campaign=running,
        contact=contact,
        template=template,
        priority="normal",
        status="queued",
    )
    return contact, running, sent, transactional, queued


def assert_erased(
    contact: Contact, running: Campaign, sent: Message, transactional: Message, queued: Message
) -> None:
    placeholder = f"erased-{contact.pk}@invalid"
    contact.refresh_from_db()
    assert (contact.email, contact.name, contact.attributes, contact.timezone) == (placeholder, "", {}, "UTC")
    assert contact.anonymised_at is not None and contact.status != "active"
    assert not ListMembership.objects.filter(contact=contact).exists()
    # The delivery record stays: same rows, statuses, timestamps, provider ids, contact id.
    before_sent_at = sent.sent_at
    sent.refresh_from_db()
    assert (sent.to_email, sent.status, sent.contact_id, sent.sent_at, sent.provider_message_id) == (
        placeholder, "sent", contact.pk, before_sent_at, "<abc@x>",
    )  # fmt: skip
    assert EmailEvent.objects.get(message=sent).payload == {}
    transactional.refresh_from_db()
    assert (transactional.to_email, transactional.status, transactional.subject, transactional.context) == (
        placeholder, "sent", None, None,
    )  # fmt: skip
    # What was not sent yet never will be, and its campaign counts it.
    queued.refresh_from_db()
    assert (queued.status, queued.to_email) == ("cancelled", placeholder)
    running.refresh_from_db()
    assert running.cancelled_count == 1
    assert not Message.objects.filter(to_email__iexact="ann@example.com").exists()


def test_deleting_a_contact_in_the_admin_anonymises_it_and_keeps_its_delivery_record(
    admin_client: Client,
) -> None:
    rows = history()
    contact = rows[0]
    delete = reverse("admin:campaigns_contact_delete", args=[contact.pk])
    page = admin_client.get(delete).content.decode()
    assert "anonymised, not deleted" in page
    response = admin_client.post(delete, {"post": "yes"})
    assert response.status_code == 302
    assert_erased(*rows)
    # An erased contact's page can no longer be saved: nothing personal is written back.
    assert (
        'name="_save"'
        not in admin_client.get(reverse("admin:campaigns_contact_change", args=[contact.pk])).content.decode()
    )


def test_delete_selected_contacts_anonymises_each(admin_client: Client) -> None:
    rows = history()
    other = Contact.objects.create(email="bob@example.com", name="Bob")
    admin_client.post(
        reverse("admin:campaigns_contact_changelist"),
        {"action": "delete_selected", "_selected_action": [rows[0].pk, other.pk], "post": "yes"},
    )
    assert_erased(*rows)
    other.refresh_from_db()
    assert other.email == f"erased-{other.pk}@invalid" and Contact.objects.count() == 2


def test_api_delete_of_a_contact_anonymises_it(api: APIClient) -> None:
    rows = history()
    response = api.delete(f"/api/v1/contacts/{rows[0].pk}")
    assert response.status_code == 204
    assert_erased(*rows)
    assert api.delete(f"/api/v1/contacts/{rows[0].pk}").status_code == 204  # erasing again is harmless
    assert api.get(f"/api/v1/contacts/{rows[0].pk}").json()["email"] == f"erased-{rows[0].pk}@invalid"


def test_no_campaign_reaches_an_erased_contact_even_if_it_is_put_back_in_a_list(api: APIClient) -> None:
    contact, *_ = history()
    api.delete(f"/api/v1/contacts/{contact.pk}")
    again = factories.contact_list("again")
    add_list_members(again, [contact.pk])
    campaign = factories.campaign("new", contact_list=again)  # history's template "t"
    lifecycle.schedule(campaign.pk, Campaign.ScheduleType.IMMEDIATE)
    report = fan_out(campaign.pk)
    assert report.created == 0 and not Message.objects.filter(campaign=campaign).exists()


def test_the_same_address_imported_again_is_a_new_contact(api: APIClient) -> None:
    contact, *_ = history()
    api.delete(f"/api/v1/contacts/{contact.pk}")
    response = api.post("/api/v1/contacts", {"email": "ann@example.com"}, format="json")
    assert response.status_code == 201 and response.json()["id"] != contact.pk
