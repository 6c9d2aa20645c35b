"""The segment admin (issue 23), through Django's test client against the real PostgreSQL: the
form validates the filter with campaigns.segments (the API's code), a Preview shows the count and
a sample without saving, a save goes through the service, a form opened before someone else's
edit does not overwrite it, a segment in use is not deleted; campaigns and recurring schedules
take a list, a segment or both, never neither."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from campaigns import segments
from campaigns.models import Campaign, Contact, ContactList, Segment, Suppression, Template
from campaigns.services import add_list_members
from scheduling.models import RecurringSchedule
from tests import factories
from tests.locks import table_locked

pytestmark = pytest.mark.django_db

ADD = reverse("admin:campaigns_segment_add")
CHANGELIST = reverse("admin:campaigns_segment_changelist")

HANOI = {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"}
ADULT = {"attribute": "age", "type": "number", "op": "gte", "value": 18}
HANOI_ADULTS = {"and": [HANOI, ADULT]}


def change_url(segment: Segment) -> str:
    return reverse("admin:campaigns_segment_change", args=[segment.pk])


def form_data(data: Any, **fields: str) -> dict[str, str]:
    """The segment form as a browser posts it (the filter as the textarea's text)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return {"name": "hanoi adults", "description": "", "filter": text, "preview_list": "", **fields}


def filter_errors(response: Any) -> list[str]:
    assert response.status_code == 200, response  # the form again, not a redirect after a save
    return [str(e) for e in response.context["adminform"].form.errors.get("filter", [])]


def page_errors(response: Any) -> list[str]:
    return [str(e) for e in response.context["adminform"].form.non_field_errors()]


@pytest.fixture
def people() -> dict[str, Contact]:
    """Adults in Hanoi (one suppressed, one unsubscribed: never in an audience), a minor in Hanoi,
    an adult elsewhere."""
    made = {
        "ann": factories.contact("ann@example.com", name="Ann", timezone="Asia/Ho_Chi_Minh",
                                 attributes={"city": "Hanoi", "age": 30}),
        "bao": factories.contact("bao@example.com", name="Bao", timezone="Asia/Bangkok",
                                 attributes={"city": "Hanoi", "age": 18}),
        "cy": factories.contact("cy@example.com", name="Cy", attributes={"city": "Hanoi", "age": 41}),
        "dan": factories.contact("dan@example.com", attributes={"city": "Hanoi", "age": 44}, status="unsubscribed"),
        "kid": factories.contact("kid@example.com", attributes={"city": "Hanoi", "age": 12}),
        "eve": factories.contact("eve@example.com", attributes={"city": "Paris", "age": 30}),
        "str": factories.contact("str@example.com", attributes={"city": "Hanoi", "age": "thirty"}),
    }  # fmt: skip
    Suppression.objects.create(email="cy@example.com", reason="hard_bounce")
    return made


# --- preview ------------------------------------------------------------------------------------


def test_preview_shows_the_count_and_a_sample_of_the_filter_in_the_form_and_saves_nothing(
    admin_client: Client, people: dict[str, Contact]
) -> None:
    response = admin_client.post(ADD, {**form_data(HANOI_ADULTS), "_preview": "1"})
    assert response.status_code == 200
    preview = response.context["preview"]
    # Ann and Bao: Cy is suppressed, Dan unsubscribed, the kid too young, Eve elsewhere, and an
    # age given as the string "30" is not a number.
    assert preview["count"] == 2
    assert [(c["email"], c["name"], c["timezone"]) for c in preview["sample"]] == [
        ("ann@example.com", "Ann", "Asia/Ho_Chi_Minh"),
        ("bao@example.com", "Bao", "Asia/Bangkok"),
    ]
    page = response.content.decode()
    assert '<strong id="segment-preview-count">2</strong>' in page
    assert page.count('class="segment-sample-row"') == 2 and "bao@example.com" in page
    # The form is shown again as typed (pretty-printed), ready to save.
    assert json.loads(response.context["adminform"].form["filter"].value()) == HANOI_ADULTS
    assert not Segment.objects.exists()


def test_preview_narrowed_to_a_list_counts_only_its_members(
    admin_client: Client, people: dict[str, Contact]
) -> None:
    vip = factories.contact_list("vip")
    add_list_members(vip, [people["bao"].pk, people["eve"].pk])
    response = admin_client.post(ADD, {**form_data(HANOI_ADULTS, preview_list=str(vip.pk)), "_preview": "1"})
    preview = response.context["preview"]
    assert (preview["count"], [c["email"] for c in preview["sample"]]) == (1, ["bao@example.com"])
    assert '<span id="segment-preview-list">vip</span>' in response.content.decode()
    assert not Segment.objects.exists()


def test_preview_of_an_existing_segment_shows_the_edited_filter_and_changes_nothing(
    admin_client: Client, people: dict[str, Contact]
) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    page = admin_client.get(change_url(segment))
    # The change page counts the saved filter once: Ann, Bao, the kid, and "str".
    assert page.context["current"] == {"count": 4}
    assert '<strong id="segment-current-count">4</strong>' in page.content.decode()
    seen = page.context["adminform"].form.initial["seen_updated_at"]
    response = admin_client.post(
        change_url(segment),
        {**form_data(HANOI_ADULTS, name="renamed", seen_updated_at=seen), "_preview": "1"},
    )
    assert response.context["preview"]["count"] == 2
    assert not page_errors(response)
    stored = Segment.objects.get()
    assert (stored.name, stored.filter, stored.updated_at) == ("hanoi", HANOI, segment.updated_at)


# --- refused filters ------------------------------------------------------------------------------


@pytest.mark.parametrize("button", ["_preview", "_save"])
def test_a_bad_filter_is_an_error_on_the_field_naming_its_path_and_nothing_is_saved(
    admin_client: Client, people: dict[str, Contact], button: str
) -> None:
    bad = {
        "and": [HANOI, {"field": "email", "op": "domain", "value": "example.com"}, {**ADULT, "value": "18"}]
    }
    response = admin_client.post(ADD, {**form_data(bad), button: "1"})
    assert filter_errors(response) == ["and[2].value: must be a number; got a string"]
    assert response.context.get("preview") is None  # no count of a refused filter
    page = response.content.decode()
    assert "and[2].value: must be a number; got a string" in page
    assert 'id="segment-preview"' not in page
    assert not Segment.objects.exists()


def test_every_kind_of_refusal_is_a_form_error_never_a_500(
    admin_client: Client, settings: Any, people: dict[str, Contact]
) -> None:
    settings.EMAILHUB_SEGMENT_MAX_CONDITIONS = 2
    cases = {
        "{not json": ["Enter a valid JSON."],
        json.dumps({"and": [HANOI, HANOI, ADULT]}): [
            "the filter has 3 conditions; at most 2 (EMAILHUB_SEGMENT_MAX_CONDITIONS)"
        ],
        json.dumps({"and": [HANOI, {"list": 987654, "op": "in"}]}): ["and[1].list: there is no list 987654"],
        json.dumps({"field": "nickname", "op": "equals", "value": "x"}): [
            "field: 'nickname' is not a contact field; use one of email, name, timezone, status, created_at"
        ],
        json.dumps({"and": [{"engagement": "opened", "op": "often"}, {"field": "status", "op": "in", "value": []}]}): [
            "and[0].op: must be one of at_least, none; got 'often'",
            "and[1].value: must be an array of 1 to 1000 strings",
        ],
        "": ["This field is required."],
        json.dumps({"field": "created_at", "op": "before", "value": "9999-12-31T23:00:00-05:00"}): [
            "value: must be between 1900-01-01 and 9998-12-31; got '9999-12-31T23:00:00-05:00'"
        ],
    }  # fmt: skip
    for text, expected in cases.items():
        for button in ("_preview", "_save"):
            response = admin_client.post(ADD, {**form_data(text), button: "1"})
            assert filter_errors(response) == expected, (text, button)
    assert not Segment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_count_past_the_query_timeout_is_an_error_on_the_form(admin_client: Client, settings: Any) -> None:
    settings.EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS = 0.2
    segment = segments.create(name="hanoi", filter=HANOI)
    with table_locked("campaigns_suppression"):  # the audience's anti-join waits past the timeout
        response = admin_client.post(ADD, {**form_data(HANOI_ADULTS), "_preview": "1"})
        (error,) = filter_errors(response)
        assert "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS" in error and "narrow the filter" in error
        assert response.context["preview"] is None
        page = admin_client.get(change_url(segment))
        assert page.status_code == 200
        assert "EMAILHUB_SEGMENT_QUERY_TIMEOUT_SECONDS" in page.context["current"]["error"]
        assert 'id="segment-current-error"' in page.content.decode()
    assert Segment.objects.count() == 1


# --- save -----------------------------------------------------------------------------------------


def test_save_stores_the_segment_through_the_service_and_its_page_counts_it(
    admin_client: Client, people: dict[str, Contact]
) -> None:
    response = admin_client.post(
        ADD, {**form_data(HANOI_ADULTS, description="adults in Hanoi"), "_continue": "1"}
    )
    segment = Segment.objects.get()
    assert response.status_code == 302 and response["Location"] == change_url(segment)
    assert (segment.name, segment.description, segment.filter) == (
        "hanoi adults",
        "adults in Hanoi",
        HANOI_ADULTS,
    )
    page = admin_client.get(change_url(segment))
    assert page.context["current"] == {"count": 2}
    # The textarea shows the stored filter pretty-printed.
    text = page.context["adminform"].form["filter"].value()
    assert text == json.dumps(HANOI_ADULTS, indent=2)

    seen = page.context["adminform"].form.initial["seen_updated_at"]
    vip = factories.contact_list("vip")  # chosen for a preview, then saved: the list is not saved
    response = admin_client.post(
        change_url(segment), form_data(HANOI, seen_updated_at=seen, preview_list=str(vip.pk))
    )
    assert response.status_code == 302
    segment.refresh_from_db()
    assert (segment.name, segment.description, segment.filter) == ("hanoi adults", "", HANOI)
    # The history names what was saved, not the preview's list.
    entry = LogEntry.objects.filter(object_id=str(segment.pk)).order_by("-pk").first()
    assert entry is not None and entry.get_change_message() == "Changed Description and Filter."
    # The list shows it, with nothing using it yet.
    listed = admin_client.get(CHANGELIST).content.decode()
    assert "hanoi adults" in listed and 'class="segment-campaigns"' not in listed


def test_a_taken_name_is_refused_on_the_form(admin_client: Client) -> None:
    segments.create(name="hanoi", filter=HANOI)
    response = admin_client.post(ADD, form_data(HANOI, name="hanoi"))
    assert response.status_code == 200 and "name" in response.context["adminform"].form.errors
    assert Segment.objects.count() == 1


def test_a_segment_edited_after_the_form_was_opened_is_not_overwritten(admin_client: Client) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    seen = admin_client.get(change_url(segment)).context["adminform"].form.initial["seen_updated_at"]
    # Someone else (the API, another operator) changes the filter meanwhile.
    segments.update(segment.pk, {"filter": HANOI_ADULTS})
    edited = Segment.objects.get()

    stale = form_data(
        {"field": "timezone", "op": "equals", "value": "UTC"}, name="mine", seen_updated_at=seen
    )
    response = admin_client.post(change_url(segment), stale)
    assert response.status_code == 200
    (error,) = page_errors(response)
    assert "after this form was opened; nothing was saved" in error
    # A preview of the stale form says so too.
    assert page_errors(admin_client.post(change_url(segment), {**stale, "_preview": "1"})) == [error]
    assert Segment.objects.get().filter == HANOI_ADULTS
    assert (Segment.objects.get().name, Segment.objects.get().updated_at) == ("hanoi", edited.updated_at)

    # Opened again, the form saves.
    seen = admin_client.get(change_url(segment)).context["adminform"].form.initial["seen_updated_at"]
    assert admin_client.post(change_url(segment), {**stale, "seen_updated_at": seen}).status_code == 302
    assert Segment.objects.get().name == "mine"


# --- delete ---------------------------------------------------------------------------------------


def test_a_segment_in_use_is_not_deleted_and_the_page_names_its_users(admin_client: Client) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    campaign = Campaign.objects.create(name="spring", template=factories.template(), segment=segment)
    schedule = RecurringSchedule.objects.create(
        name="weekly", cron="0 9 * * 1", template=campaign.template, segment=segment
    )
    delete_url = reverse("admin:campaigns_segment_delete", args=[segment.pk])
    page = admin_client.get(delete_url).content.decode()
    assert "protected related objects" in page
    assert "spring" in page and "weekly" in page
    response = admin_client.post(delete_url, {"post": "yes"})
    assert response.status_code == 200 and Segment.objects.filter(pk=segment.pk).exists()
    # The list's "Delete selected" refuses as well.
    response = admin_client.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [segment.pk], "post": "yes"}
    )
    assert Segment.objects.filter(pk=segment.pk).exists()
    # The list says who uses it.
    listed = admin_client.get(CHANGELIST).content.decode()
    assert ">1 campaign</a>" in listed
    used = admin_client.get(
        reverse("admin:campaigns_campaign_changelist") + f"?segment__id__exact={segment.pk}&archived=all"
    )
    assert [c.pk for c in used.context["cl"].result_list] == [campaign.pk]

    # Once nothing uses it, it is deleted.
    campaign.delete()
    schedule.delete()
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 302
    assert not Segment.objects.exists()


def test_a_segment_taken_by_a_campaign_after_the_confirmation_page_is_not_deleted(
    admin_client: Client,
) -> None:
    from django.contrib import admin as django_admin
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.test import RequestFactory

    from campaigns.admin import SegmentAdmin

    segment = segments.create(name="hanoi", filter=HANOI)
    Campaign.objects.create(name="spring", template=factories.template(), segment=segment)
    request = RequestFactory().post("/")
    request._messages = CookieStorage(request)  # type: ignore[attr-defined]
    model_admin = SegmentAdmin(Segment, django_admin.site)
    model_admin.delete_model(request, segment)  # what the delete view calls once confirmed
    (message,) = [str(m) for m in request._messages]  # type: ignore[attr-defined]
    assert message.startswith("not deleted: segment 'hanoi' is used by campaign")
    assert Segment.objects.filter(pk=segment.pk).exists()


# --- campaigns and recurring schedules: a list, a segment or both ---------------------------------


@pytest.fixture
def template() -> Template:
    return factories.template("news")


@pytest.fixture
def contact_list() -> ContactList:
    return factories.contact_list("all")


def campaign_form(template: Template, **fields: Any) -> dict[str, Any]:
    return {"name": "c", "template": template.pk, "contact_list": "", "segment": "", "from_email": "",
            "priority": "normal", "window_hours": "24", "holdout_percent": "10", **fields}  # fmt: skip


def test_the_campaign_form_takes_a_segment_alone_or_narrowing_a_list_and_refuses_neither(
    admin_client: Client, template: Template, contact_list: ContactList
) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    add = reverse("admin:campaigns_campaign_add")
    response = admin_client.post(add, campaign_form(template))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    # The API's rule and words (core.api_input.OneOfRequiredMixin), not the model constraint's name.
    assert errors == {"contact_list": ["give at least one of contact_list, segment"]}
    assert not Campaign.objects.exists()

    assert admin_client.post(add, campaign_form(template, name="seg", segment=segment.pk)).status_code == 302
    assert admin_client.post(
        add, campaign_form(template, name="both", segment=segment.pk, contact_list=contact_list.pk)
    ).status_code == 302  # fmt: skip
    assert (
        admin_client.post(add, campaign_form(template, name="list", contact_list=contact_list.pk)).status_code
        == 302
    )
    audiences = {c.name: (c.contact_list_id, c.segment_id) for c in Campaign.objects.all()}
    assert audiences == {
        "seg": (None, segment.pk),
        "both": (contact_list.pk, segment.pk),
        "list": (contact_list.pk, None),
    }

    listed = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    for shown in ("segment hanoi", "list all ∩ segment hanoi", "list all"):
        assert f'<td class="field-audience">{shown}</td>' in listed, shown

    # A draft's list can be taken away when it has a segment, not when it has none.
    both = Campaign.objects.get(name="both")
    change = reverse("admin:campaigns_campaign_change", args=[both.pk])
    assert (
        admin_client.post(change, campaign_form(template, name="both", segment=segment.pk)).status_code == 302
    )
    assert Campaign.objects.get(pk=both.pk).contact_list_id is None
    only_list = Campaign.objects.get(name="list")
    change = reverse("admin:campaigns_campaign_change", args=[only_list.pk])
    response = admin_client.post(change, campaign_form(template, name="list"))
    assert response.context["adminform"].form.errors == {
        "contact_list": ["give at least one of contact_list, segment"]
    }
    assert Campaign.objects.get(pk=only_list.pk).contact_list_id == contact_list.pk


def test_a_started_segment_campaigns_page_shows_the_filter_it_was_scheduled_with(
    admin_client: Client, template: Template, contact_list: ContactList
) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    campaign = Campaign.objects.create(
        name="c", template=template, contact_list=contact_list, segment=segment, status="sending",
        audience_filter=HANOI, started_at=timezone.now(),
    )  # fmt: skip
    segments.update(segment.pk, {"filter": HANOI_ADULTS})
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[campaign.pk])).content.decode()
    assert "list all ∩ segment hanoi" in page
    assert "the segment's filter as it was when the campaign was scheduled" in page
    assert "&quot;value&quot;: &quot;Hanoi&quot;" in page and "&quot;age&quot;" not in page


def recurring_form(template: Template, **fields: Any) -> dict[str, Any]:
    return {"name": "r", "cron": "0 9 * * *", "timezone": "UTC", "template": template.pk, "contact_list": "",
            "segment": "", "priority": "normal", "schedule_type": "immediate", "from_email": "",
            "active": "on", **fields}  # fmt: skip


def test_the_recurring_form_takes_a_segment_and_refuses_neither(
    admin_client: Client, template: Template, contact_list: ContactList
) -> None:
    segment = segments.create(name="hanoi", filter=HANOI)
    add = reverse("admin:scheduling_recurringschedule_add")
    response = admin_client.post(add, recurring_form(template))
    assert response.context["adminform"].form.errors == {
        "contact_list": ["give at least one of contact_list, segment"]
    }
    assert not RecurringSchedule.objects.exists()
    assert admin_client.post(add, recurring_form(template, segment=segment.pk)).status_code == 302
    assert admin_client.post(
        add, recurring_form(template, name="both", segment=segment.pk, contact_list=contact_list.pk)
    ).status_code == 302  # fmt: skip
    assert {r.name: (r.contact_list_id, r.segment_id) for r in RecurringSchedule.objects.all()} == {
        "r": (None, segment.pk),
        "both": (contact_list.pk, segment.pk),
    }
    listed = admin_client.get(reverse("admin:scheduling_recurringschedule_changelist")).content.decode()
    assert '<td class="field-audience">segment hanoi</td>' in listed
    assert '<td class="field-audience">list all ∩ segment hanoi</td>' in listed


def test_the_segment_list_costs_the_same_queries_for_one_segment_or_many(
    admin_client: Client, template: Template
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(CHANGELIST).status_code == 200
        return len(captured)

    first = segments.create(name="s0", filter=HANOI)
    Campaign.objects.create(name="c0", template=template, segment=first)
    one = queries()
    for n in range(1, 6):
        segment = segments.create(name=f"s{n}", filter=HANOI)
        Campaign.objects.create(name=f"c{n}", template=template, segment=segment)
    assert queries() == one


def test_a_filter_nested_thousands_deep_is_a_form_error_not_a_500(admin_client: Client) -> None:
    text = '{"not": ' * 5_000 + '{"field": "email", "op": "equals", "value": "a@b.c"}' + "}" * 5_000
    for button in ("_preview", "_save"):
        response = admin_client.post(ADD, {**form_data(text), button: "1"})
        (error,) = filter_errors(response)
        assert "EMAILHUB_SEGMENT_MAX_DEPTH" in error
    assert not Segment.objects.exists()
