"""Every admin form refuses what the API refuses for the same field, with the API's own
validators (issue 18, item 12): a value the admin stored and the API would refuse broke the API's
own responses (an address that is not `format: email` in `GET /api/v1/contacts`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from campaigns.models import Campaign, Contact, ContactList, Segment, Suppression, Template
from core.validators import ApiValidatedForm
from outbound.models import Endpoint
from scheduling.models import RecurringSchedule
from tests import factories

pytestmark = pytest.mark.django_db

BAD_ADDRESSES = ["x@y", "not an email", "two@example.com, three@example.com", "ann@example.com\nBcc: x@y.z"]


def add_url(model: type) -> str:
    meta = model._meta  # type: ignore[attr-defined]
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_add")


def form_errors(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200, response  # the form again, not a redirect after a save
    return dict(response.context["adminform"].form.errors)


@pytest.fixture
def template() -> Template:
    return factories.template()


@pytest.fixture
def contact_list() -> ContactList:
    return factories.contact_list()


CONTACT = {"email": "ann@example.com", "name": "Ann", "timezone": "UTC", "attributes": "{}"}


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_the_contact_form_refuses_an_address_the_api_refuses(
    admin_client: Client, api: APIClient, address: str
) -> None:
    assert (
        api.post(
            "/api/v1/contacts", {**CONTACT, "attributes": {}, "email": address}, format="json"
        ).status_code
        == 400
    )
    errors = form_errors(admin_client.post(add_url(Contact), {**CONTACT, "email": address}))
    assert "email" in errors
    assert not Contact.objects.exists()


def test_the_contact_form_stores_an_address_as_the_api_does_and_refuses_its_other_rules(
    admin_client: Client, api: APIClient
) -> None:
    assert admin_client.post(add_url(Contact), {**CONTACT, "email": " Ann@Example.COM "}).status_code == 302
    assert Contact.objects.get().email == "ann@example.com"  # lower-cased, as the API stores it
    # The same address in another case is the same contact (the API's uniqueness rule).
    assert "email" in form_errors(
        admin_client.post(add_url(Contact), {**CONTACT, "email": "ANN@example.com"})
    )
    listed = api.get("/api/v1/contacts").json()["results"]
    assert [c["email"] for c in listed] == ["ann@example.com"]
    for field, value in (("attributes", '["gold"]'), ("attributes", '"gold"'), ("name", "Ann\nBcc: x")):
        errors = form_errors(
            admin_client.post(add_url(Contact), {**CONTACT, "email": "bob@example.com", field: value})
        )
        assert field in errors, (field, value)
    assert Contact.objects.count() == 1


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_the_suppression_form_refuses_an_address_the_api_refuses(admin_client: Client, address: str) -> None:
    errors = form_errors(admin_client.post(add_url(Suppression), {"email": address, "reason": "manual"}))
    assert "email" in errors
    assert not Suppression.objects.exists()


def test_the_suppression_form_lower_cases_like_the_api_so_the_anti_join_matches(admin_client: Client) -> None:
    # Suppressions are matched by the lower-cased address at fan-out and before every send: a
    # mixed-case row suppressed nobody.
    assert (
        admin_client.post(add_url(Suppression), {"email": "Gone@Example.com", "reason": "manual"}).status_code
        == 302
    )
    assert Suppression.objects.get().email == "gone@example.com"
    again = form_errors(
        admin_client.post(add_url(Suppression), {"email": "GONE@example.com", "reason": "manual"})
    )
    assert "email" in again and Suppression.objects.count() == 1


@pytest.mark.parametrize("defaults", ['["x"]', '"x"', "3"])
def test_the_template_form_refuses_defaults_that_are_not_an_object(
    admin_client: Client, defaults: str
) -> None:
    form = {"name": "t", "subject": "s", "html": "", "text": "x", "defaults": defaults}
    assert "defaults" in form_errors(admin_client.post(add_url(Template), form))
    assert not Template.objects.exists()


def test_the_contact_list_form_refuses_what_the_api_refuses(
    admin_client: Client, contact_list: ContactList
) -> None:
    for name in ("l", "   ", "x" * 201):  # taken, blank, too long: the API's 400s
        assert "name" in form_errors(
            admin_client.post(add_url(ContactList), {"name": name, "description": ""})
        )
    assert ContactList.objects.count() == 1


@pytest.mark.parametrize("window_hours", ["0", "169", "1000"])
def test_the_campaign_form_refuses_a_window_the_schedule_would_refuse(
    admin_client: Client, template: Template, contact_list: ContactList, window_hours: str
) -> None:
    form = {"name": "c", "template": template.pk, "contact_list": contact_list.pk, "from_email": "",
            "priority": "normal", "window_hours": window_hours, "holdout_percent": "10"}  # fmt: skip
    assert "window_hours" in form_errors(admin_client.post(add_url(Campaign), form))
    assert not Campaign.objects.exists()


def test_the_campaign_form_refuses_a_blank_name_and_a_bad_sender(
    admin_client: Client, template: Template, contact_list: ContactList
) -> None:
    form = {"name": "c", "template": template.pk, "contact_list": contact_list.pk, "from_email": "",
            "priority": "normal", "window_hours": "24", "holdout_percent": "10"}  # fmt: skip
    assert "name" in form_errors(admin_client.post(add_url(Campaign), {**form, "name": "  "}))
    assert "from_email" in form_errors(admin_client.post(add_url(Campaign), {**form, "from_email": "x@y"}))
    assert not Campaign.objects.exists()


@pytest.mark.parametrize("schedule_type", ["at", "local_time", "optimized"])
def test_the_recurring_form_refuses_a_schedule_type_the_api_refuses(
    admin_client: Client, template: Template, contact_list: ContactList, schedule_type: str
) -> None:
    # A recurring schedule makes `immediate` campaigns only (the API's choice): an `at` one has
    # no instant to run at.
    form = {"name": "r", "cron": "0 9 * * *", "timezone": "UTC", "template": template.pk,
            "contact_list": contact_list.pk, "priority": "normal", "schedule_type": schedule_type,
            "from_email": "", "active": "on"}  # fmt: skip
    assert "schedule_type" in form_errors(admin_client.post(add_url(RecurringSchedule), form))
    assert not RecurringSchedule.objects.exists()


def test_the_recurring_form_refuses_a_bad_cron_timezone_and_sender(
    admin_client: Client, template: Template, contact_list: ContactList
) -> None:
    form = {"name": "r", "cron": "0 9 * * *", "timezone": "UTC", "template": template.pk,
            "contact_list": contact_list.pk, "priority": "normal", "schedule_type": "immediate",
            "from_email": "", "active": "on"}  # fmt: skip
    for field, value in (
        ("cron", "61 * * * *"),
        ("timezone", "Mars/Olympus"),
        ("from_email", "a@b.c, d@e.f"),
    ):
        assert field in form_errors(admin_client.post(add_url(RecurringSchedule), {**form, field: value})), (
            field
        )
    assert not RecurringSchedule.objects.exists()


# Admin pages whose form writes a model the API also writes, and those that write nothing an API
# field takes (each with the reason).
API_VALIDATED = {Contact, ContactList, Suppression, Template, Segment, Campaign, RecurringSchedule, Endpoint}
NO_API_COUNTERPART = {
    "ListMembership": "two foreign keys chosen from existing rows; the API's members endpoint takes ids",
    "ApiKey": "keys are made by manage.py create_api_key; the form edits name and scopes (choices)",
    "PeriodicTask": "emailhub's internal ticks: only `enabled` is editable",
}


def test_every_admin_form_that_writes_what_the_api_writes_validates_with_the_api(rf: Any) -> None:
    """The audit: a model admin that can add or change rows either validates with the API's
    serializer (core.validators.ApiValidatedForm) or is listed above with the reason it need not."""
    from django.contrib.auth.models import User

    request = rf.get("/admin/")
    request.user = User(is_superuser=True, is_staff=True)
    writable = {}
    for model, model_admin in admin.site._registry.items():
        if model_admin.has_add_permission(request) or model_admin.has_change_permission(request):
            writable[model] = model_admin
    for model, model_admin in writable.items():
        form = model_admin.get_form(request)
        if model in API_VALIDATED:
            assert issubclass(form, ApiValidatedForm), model
        elif model._meta.app_label not in ("auth", "axes"):  # Django's users and groups
            assert model.__name__ in NO_API_COUNTERPART, model
    assert API_VALIDATED <= set(writable)
