"""The operator's workflows in the admin (issue 12, item 3), through Django's test client against
the real PostgreSQL and Redis: contact import, scheduling, pause/resume/cancel, template preview
and test send, a campaign's messages and events. Each goes through the service the API calls, so
each test checks the success path, the bad inputs (a form error, nothing changed) and, where a
form can go stale, the state that changed under it."""

from __future__ import annotations

import csv
import io
import re
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns import lifecycle
from campaigns.exceptions import CampaignStateError
from campaigns.fanout import fan_out
from campaigns.import_jobs import run_import_job
from campaigns.models import Campaign, Contact, ContactList, ImportChunk, ImportJob, ListMembership, Template
from core.localtime import localize
from core.models import OutboxTask
from core.operator_zone import TIMEZONE_COOKIE
from delivery.models import EmailEvent, Message
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests import factories

pytestmark = pytest.mark.django_db

UPLOAD = reverse("admin:campaigns_importjob_upload")


def upload(client: Client, data: bytes, **fields: object) -> object:
    return client.post(
        UPLOAD, {"file": SimpleUploadedFile("people.csv", data, content_type="text/csv"), **fields}
    )


def field_errors(response: object) -> dict[str, list[str]]:
    form = response.context["form"]  # type: ignore[attr-defined]
    return {name: [str(e) for e in errors] for name, errors in form.errors.items()}


# --- contact import -------------------------------------------------------------------------


def test_an_uploaded_csv_becomes_an_import_job_whose_page_shows_progress_and_rejected_rows(
    admin_client: Client,
) -> None:
    data = b"email,name,plan\nann@example.com,Ann,gold\nnot-an-address,Bob,x\ncy@example.com,Cy,\n"
    response = upload(admin_client, data, list_name="Newsletter")
    job = ImportJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:campaigns_importjob_change", args=[job.pk])
    assert (job.status, job.list_name, job.size, job.filename) == (
        "pending",
        "Newsletter",
        len(data),
        "people.csv",
    )

    pending = admin_client.get(response["Location"]).content.decode()
    assert 'id="import-progress"' in pending and 'data-status="pending"' in pending
    assert '<meta http-equiv="refresh" content="2">' in pending  # reloads itself while it runs

    run_import_job(job.pk)  # what the worker does with the published task
    done = admin_client.get(response["Location"]).content.decode()
    assert 'data-status="completed"' in done and 'data-percent="100"' in done
    assert 'http-equiv="refresh"' not in done
    assert 'id="import-rejections"' in done and "not-an-address" in done
    rows = Contact.objects.filter(listmembership__contact_list__name="Newsletter")
    assert sorted(rows.values_list("email", flat=True)) == ["ann@example.com", "cy@example.com"]

    download = admin_client.get(reverse("admin:campaigns_importjob_rejections_csv", args=[job.pk]))
    assert download["Content-Type"].startswith("text/csv")
    lines = list(csv.reader(io.StringIO(b"".join(download.streaming_content).decode())))
    assert lines[0] == ["line", "reason", "excerpt"]
    assert [row[0] for row in lines[1:]] == ["3"] and "not-an-address" in lines[1][2]


def test_a_running_imports_page_shows_rows_done_of_an_estimate_and_keeps_refreshing(
    admin_client: Client,
) -> None:
    job = ImportJob.objects.create(status="running", size=1_000, next_offset=250, rows_read=10)
    page = admin_client.get(reverse("admin:campaigns_importjob_change", args=[job.pk])).content.decode()
    assert 'data-status="running"' in page and 'data-percent="25"' in page
    assert '<span id="import-rows">10</span> row(s) done of about 40' in page
    assert '<meta http-equiv="refresh" content="2">' in page


def test_an_import_into_an_existing_list_adds_its_contacts_there(admin_client: Client) -> None:
    existing = ContactList.objects.create(name="VIP")
    upload(admin_client, b"email\nvip@example.com\n", contact_list=existing.pk)
    run_import_job(ImportJob.objects.get().pk)
    assert ListMembership.objects.filter(contact_list=existing, contact__email="vip@example.com").exists()


@pytest.mark.parametrize(
    ("data", "fields", "field", "says"),
    [
        (b"\xff\xfeemail\na@example.com\n", {}, "file", "not valid UTF-8"),
        (b"name,plan\nAnn,gold\n", {}, "file", "no email column"),
        (b"", {}, "file", "empty"),
        (b"\n\n", {}, "file", "header"),
        (b"email\n" + b"a@example.com\n" * 20, {}, "file", "EMAILHUB_IMPORT_MAX_BYTES"),
        (b"email\na@example.com\n", {"list_name": "New"}, "__all__", "not both"),
    ],
    ids=["not-utf8", "no-email-column", "empty", "blank-header", "too-large", "list-and-name"],
)
def test_a_bad_file_is_a_form_error_and_stores_nothing(
    admin_client: Client,
    settings,
    data: bytes,
    fields: dict,
    field: str,
    says: str,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_IMPORT_MAX_BYTES = 200
    if "list_name" in fields:
        fields = {**fields, "contact_list": ContactList.objects.create(name="Old").pk}
    response = upload(admin_client, data, **fields)
    assert response.status_code == 200
    errors = field_errors(response)
    assert says in " ".join(errors.get(field, [])), errors
    assert 'id="import-form"' in response.content.decode()
    assert (
        not ImportJob.objects.exists() and not ImportChunk.objects.exists() and not Contact.objects.exists()
    )


def test_upload_needs_the_add_contact_permission(client: Client) -> None:
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_importjob"))
    client.force_login(user)
    assert client.get(UPLOAD).status_code == 403
    page = client.get(reverse("admin:campaigns_importjob_changelist")).content.decode()
    assert 'id="import-upload-link"' not in page


# --- scheduling -----------------------------------------------------------------------------


@pytest.fixture
def draft(db: None) -> Campaign:
    template = factories.template("news", subject="Hi {{ name }}", text="hello")
    return factories.campaign("December", template=template, contact_list=factories.contact_list("all"))


def schedule_url(campaign: Campaign) -> str:
    return reverse("admin:campaigns_campaign_schedule", args=[campaign.pk])


def open_form(client: Client, campaign: Campaign) -> dict[str, str]:
    page = client.get(schedule_url(campaign))
    assert page.status_code == 200 and 'id="schedule-form"' in page.content.decode()
    return {"seen_updated_at": page.context["form"].initial["seen_updated_at"], "zone": "UTC"}


def twin(campaign: Campaign) -> Campaign:
    return Campaign.objects.create(
        name=f"{campaign.name} (API)", template=campaign.template, contact_list=campaign.contact_list
    )


SCHEDULE_FIELDS = (
    "status", "schedule_type", "scheduled_at", "local_date", "local_time", "past_time_policy", "window_hours",
    "holdout_percent",
)  # fmt: skip


def test_each_schedule_type_from_the_admin_leaves_the_campaign_as_the_same_api_call_does(
    admin_client: Client, draft: Campaign, api: APIClient
) -> None:
    future = (timezone.now() + timedelta(days=3)).astimezone(ZoneInfo("America/New_York"))
    wall = future.replace(tzinfo=None, second=0, microsecond=0)
    local_day = (timezone.now() + timedelta(days=2)).date()
    cases = [
        ({"type": "immediate"}, {"type": "immediate"}),
        (
            {"type": "at", "scheduled_at": wall.strftime("%Y-%m-%dT%H:%M"), "zone": "America/New_York"},
            {"type": "at", "scheduled_at": localize(wall, ZoneInfo("America/New_York")).isoformat()},
        ),
        (
            {"type": "local_time", "local_date": local_day.isoformat(), "local_time": "09:30",
             "past_time_policy": "skip"},
            {"type": "local_time", "local_date": local_day.isoformat(), "local_time": "09:30",
             "past_time_policy": "skip"},
        ),
        (
            {"type": "optimized", "window_hours": "12", "holdout_percent": "20"},
            {"type": "optimized", "window_hours": 12, "holdout_percent": 20},
        ),
    ]  # fmt: skip
    for form_data, api_body in cases:
        ours, theirs = twin(draft), twin(draft)
        response = admin_client.post(schedule_url(ours), {**open_form(admin_client, ours), **form_data})
        assert response.status_code == 302, field_errors(response)
        assert api.post(f"/api/v1/campaigns/{theirs.pk}/schedule", api_body, format="json").status_code == 200
        ours.refresh_from_db()
        theirs.refresh_from_db()
        assert [getattr(ours, f) for f in SCHEDULE_FIELDS] == [getattr(theirs, f) for f in SCHEDULE_FIELDS]
        assert ours.schedule_type == form_data["type"]
    # A bad value in another type's number field does not block the type chosen (a date or
    # time there does: test_a_filled_date_or_time_the_chosen_type_ignores_is_refused_by_name).
    leftover = twin(draft)
    form = {**open_form(admin_client, leftover), "type": "immediate", "window_hours": "x"}
    assert admin_client.post(schedule_url(leftover), form).status_code == 302
    assert Campaign.objects.get(pk=leftover.pk).status == "sending"
    at = Campaign.objects.filter(schedule_type="at").first()
    assert at is not None and at.status == "scheduled"
    assert at.scheduled_at == localize(wall, ZoneInfo("America/New_York"))  # read in the zone chosen


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"type": "at"}, "scheduled_at", "required for type 'at'"),
        ({"type": "at", "scheduled_at": "2001-01-01T10:00"}, "scheduled_at", "is in the past"),
        ({"type": "at", "scheduled_at": "tomorrow"}, "scheduled_at", "give a date and time"),
        ({"type": "local_time", "local_date": "2099-01-01"}, "local_time", "required for type 'local_time'"),
        (
            {"type": "local_time", "local_date": "2001-01-01", "local_time": "10:00"},
            "local_date",
            "every timezone",
        ),
        ({"type": "optimized", "window_hours": "500"}, "window_hours", "between 1 and 168"),
        ({"type": "optimized", "holdout_percent": "90"}, "holdout_percent", "between 0 and 50"),
        ({"type": "optimized", "window_start": "2001-01-01T00:00"}, "window_start", "is in the past"),
        ({"type": "weekly"}, "type", "not one of the available choices"),
        ({"type": "at", "scheduled_at": "2099-01-01T10:00", "zone": "Mars/Olympus"}, "zone", "not one of"),
    ],
)
def test_a_bad_schedule_is_an_error_on_its_field_and_changes_nothing(
    admin_client: Client, draft: Campaign, data: dict, field: str, says: str
) -> None:
    response = admin_client.post(schedule_url(draft), {**open_form(admin_client, draft), **data})
    assert response.status_code == 200
    errors = field_errors(response)
    assert says in " ".join(errors.get(field, [])), errors
    draft.refresh_from_db()
    assert (draft.status, draft.scheduled_at, draft.local_date) == ("draft", None, None)
    assert not OutboxTask.objects.exists()


def test_the_schedule_form_offers_no_type_until_one_is_chosen_and_refuses_a_post_without_one(
    admin_client: Client, draft: Campaign
) -> None:
    page = admin_client.get(schedule_url(draft))
    html = page.content.decode()
    radios = re.findall(r'<input type="radio" name="type"[^>]*>', html)
    assert len(radios) == 4 and not [r for r in radios if "checked" in r], radios
    # An `at` date filled in, the type forgotten: refused, not sent at once.
    tomorrow = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = admin_client.post(
        schedule_url(draft), {**open_form(admin_client, draft), "scheduled_at": tomorrow}
    )
    assert response.status_code == 200
    assert field_errors(response) == {"type": ["choose when to send: immediate, at, local_time or optimized"]}
    assert "choose when to send" in response.content.decode()
    draft.refresh_from_db()
    assert (draft.status, draft.scheduled_at) == ("draft", None) and not OutboxTask.objects.exists()


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"type": "immediate", "scheduled_at": "2099-01-01T10:00"}, {"scheduled_at": "at (date and time)"}),
        ({"type": "immediate", "scheduled_at": "2030-13-45"}, {"scheduled_at": "at (date and time)"}),
        (
            {"type": "at", "scheduled_at": "2099-01-01T10:00", "local_date": "2099-01-01", "local_time": "09:00"},
            {"local_date": "local date", "local_time": "local time"},
        ),
        (
            {"type": "local_time", "local_date": "2099-01-01", "local_time": "09:00",
             "window_start": "2099-01-01T08:00"},
            {"window_start": "window start"},
        ),
        ({"type": "optimized", "scheduled_at": "2099-01-01T10:00"}, {"scheduled_at": "at (date and time)"}),
    ],
    ids=["immediate-with-at", "immediate-with-a-bad-at", "at-with-local", "local-with-window", "optimized-with-at"],
)  # fmt: skip
def test_a_filled_date_or_time_the_chosen_type_ignores_is_refused_by_name(
    admin_client: Client, draft: Campaign, data: dict, named: dict[str, str]
) -> None:
    response = admin_client.post(schedule_url(draft), {**open_form(admin_client, draft), **data})
    assert response.status_code == 200
    errors = field_errors(response)
    assert set(errors) == set(named), errors
    for name, label in named.items():
        (error,) = errors[name]
        assert error == (
            f"filled in, but type '{data['type']}' does not use {label}: clear it, or choose the type that does"
        )
    draft.refresh_from_db()
    assert (draft.status, draft.scheduled_at, draft.local_date) == ("draft", None, None)
    assert not OutboxTask.objects.exists()


def test_a_campaign_scheduled_by_someone_else_under_the_open_form_is_not_scheduled_again(
    admin_client: Client, draft: Campaign, api: APIClient
) -> None:
    seen = open_form(admin_client, draft)
    later = (timezone.now() + timedelta(days=1)).isoformat()
    assert (
        api.post(
            f"/api/v1/campaigns/{draft.pk}/schedule", {"type": "at", "scheduled_at": later}, format="json"
        ).status_code
        == 200
    )
    before = Campaign.objects.get(pk=draft.pk)
    response = admin_client.post(schedule_url(draft), {**seen, "type": "immediate"}, follow=True)
    assert (
        "not scheduled, nothing changed: only a draft campaign can be scheduled; this one is scheduled"
        in (response.content.decode())
    )
    after = Campaign.objects.get(pk=draft.pk)
    assert (after.status, after.schedule_type, after.scheduled_at) == ("scheduled", "at", before.scheduled_at)
    assert not OutboxTask.objects.exists()  # no fan-out was recorded
    # A fresh look at the page says so instead of offering the form.
    assert 'id="schedule-refused"' in admin_client.get(schedule_url(draft)).content.decode()


def test_a_draft_edited_under_the_open_form_is_not_scheduled(admin_client: Client, draft: Campaign) -> None:
    seen = open_form(admin_client, draft)
    other = Template.objects.create(name="other", subject="Other", text="other")
    lifecycle.update_draft(draft.pk, {"template": other})
    response = admin_client.post(schedule_url(draft), {**seen, "type": "immediate"}, follow=True)
    assert "after this form was opened" in response.content.decode()
    assert Campaign.objects.get(pk=draft.pk).status == "draft" and not OutboxTask.objects.exists()


def test_pause_resume_and_cancel_buttons_on_the_campaign_page_go_through_the_lifecycle(
    admin_client: Client, draft: Campaign
) -> None:
    change = reverse("admin:campaigns_campaign_change", args=[draft.pk])

    def button(verb: str) -> str:
        return admin_client.post(
            reverse("admin:campaigns_campaign_button", args=[draft.pk, verb]), follow=True
        ).content.decode()

    page = admin_client.get(change).content.decode()
    assert 'id="campaign-schedule-link"' in page and 'id="campaign-pause"' not in page
    lifecycle.schedule(draft.pk, "immediate")
    page = admin_client.get(change).content.decode()
    assert 'id="campaign-pause"' in page and 'id="campaign-resume"' not in page
    assert 'id="campaign-schedule-link"' not in page and 'id="campaign-progress"' in page
    assert "pause done; it is paused now" in button("pause")
    assert Campaign.objects.get(pk=draft.pk).status == "paused"
    assert 'id="campaign-resume"' in admin_client.get(change).content.decode()
    button("resume")
    assert Campaign.objects.get(pk=draft.pk).status == "sending"
    button("cancel")
    assert Campaign.objects.get(pk=draft.pk).status == "cancelled"
    # A stale page's button (the campaign was cancelled meanwhile): refused, nothing changed.
    assert "not done: only a sending or scheduled campaign can be paused; this one is cancelled" in button(
        "pause"
    )
    assert Campaign.objects.get(pk=draft.pk).status == "cancelled"
    assert (
        admin_client.get(reverse("admin:campaigns_campaign_button", args=[draft.pk, "pause"])).status_code
        == 405
    )
    unknown = reverse("admin:campaigns_campaign_button", args=[draft.pk, "delete"])
    assert admin_client.post(unknown).status_code == 404


def test_a_campaign_page_shows_its_counters_in_the_progress_summary_and_no_internal_field(
    admin_client: Client, draft: Campaign
) -> None:
    Campaign.objects.filter(pk=draft.pk).update(
        status="sending", started_at=timezone.now(), fanout_done=True, fanout_cursor=812, total_count=20,
        excluded_count=3, sent_count=10, failed_count=2, suppressed_count=1, cancelled_count=1,
        bounced_count=4, complained_count=1, unsubscribed_count=2,
    )  # fmt: skip
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[draft.pk])).content.decode()
    summary = page.split('id="campaign-progress"', 1)[1].split("</div>", 1)[0]
    for counter, value in (
        ("total", 20), ("excluded", 3), ("sent", 10), ("failed", 2), ("suppressed", 1), ("cancelled", 1),
        ("unfinished", 6), ("bounced", 4), ("complained", 1), ("unsubscribed", 2),
    ):  # fmt: skip
        assert f'<dd id="campaign-{counter}">{value}' in summary, counter
    # The failed ones link to their list, where the retry action is.
    failed_url = (
        reverse("admin:delivery_message_changelist") + f"?campaign={draft.pk}&amp;status__exact=failed"
    )
    assert f'href="{failed_url}"' in summary
    # Workers' bookkeeping is not on the page, and no counter is a field of its own.
    for internal in ("fanout_cursor", "fanout_done", "updated_at", "status", *(f"{c}_count" for c in (
        "total", "excluded", "sent", "failed", "suppressed", "cancelled", "bounced", "complained", "unsubscribed",
    ))):  # fmt: skip
        assert f"field-{internal}" not in page, internal
    assert "812" not in page
    # A started immediate campaign shows its schedule type and no other type's fields.
    assert (
        "field-schedule_type" in page and "field-local_date" not in page and "field-window_start" not in page
    )


def test_a_campaign_page_offers_delete_only_where_the_lifecycle_would_delete(
    admin_client: Client, draft: Campaign
) -> None:
    change = reverse("admin:campaigns_campaign_change", args=[draft.pk])
    assert 'class="deletelink"' in admin_client.get(change).content.decode()
    Message.objects.create(to_email="ann@example.com", priority="normal", campaign=draft, status="cancelled")
    assert 'class="deletelink"' not in admin_client.get(change).content.decode()  # a draft with messages
    with pytest.raises(CampaignStateError):
        lifecycle.delete_draft(draft.pk)
    started = twin(draft)
    lifecycle.schedule(started.pk, "immediate")
    assert (
        'class="deletelink"'
        not in admin_client.get(
            reverse("admin:campaigns_campaign_change", args=[started.pk])
        ).content.decode()
    )
    # A finished one offers what can be done with it instead: archive.
    lifecycle.cancel(started.pk)
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[started.pk])).content.decode()
    assert 'class="deletelink"' not in page and 'id="campaign-archive"' in page
    admin_client.post(reverse("admin:campaigns_campaign_button", args=[started.pk, "archive"]))
    assert Campaign.objects.get(pk=started.pk).archived_at is not None
    assert (
        'id="campaign-archive"'
        not in admin_client.get(
            reverse("admin:campaigns_campaign_change", args=[started.pk])
        ).content.decode()
    )


@pytest.mark.usefixtures("far_horizon")  # fixed dates years ahead
def test_a_campaign_waiting_for_its_first_due_instant_says_when_it_sends_next(
    admin_client: Client, draft: Campaign
) -> None:
    paris = Contact.objects.create(email="ann@example.com", timezone="Europe/Paris")
    ListMembership.objects.create(contact_list=draft.contact_list, contact=paris)
    lifecycle.schedule(draft.pk, "local_time", local_date=date(2031, 1, 1), local_time=time(9))
    fan_out(draft.pk)
    due = datetime(2031, 1, 1, 8, tzinfo=ZoneInfo("UTC"))  # 9:00 in Paris
    assert Message.objects.get(campaign=draft).due_at == due
    admin_client.cookies[TIMEZONE_COOKIE] = "Europe/Paris"
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[draft.pk])).content.decode()
    summary = page.split('id="campaign-progress"', 1)[1].split("</div>", 1)[0]
    assert 'data-status="sending"' in page and 'data-next-send-at="2031-01-01T08:00:00Z"' in page
    assert (
        'id="campaign-waiting">waiting — next send at <time class="zoned" datetime="2031-01-01T08:00:00Z"'
        in summary
    )
    assert "2031-01-01 08:00:00 UTC (09:00:00 CET)" in summary and 'id="campaign-percent"' not in summary
    # An `at` campaign waits for its start.
    later = twin(draft)
    lifecycle.schedule(later.pk, "at", datetime(2031, 2, 1, 12, tzinfo=ZoneInfo("UTC")))
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[later.pk])).content.decode()
    assert 'data-status="scheduled"' in page and "waiting — next send at" in page
    assert "2031-02-01 12:00:00 UTC (13:00:00 CET)" in page


def test_a_campaigns_messages_and_events_are_one_click_from_its_page(
    admin_client: Client, draft: Campaign
) -> None:
    other = twin(draft)
    ours = Message.objects.create(to_email="ann@example.com", priority="normal", campaign=draft, status="failed",
                                  last_error="smtp: 550 mailbox unavailable")  # fmt: skip
    theirs = Message.objects.create(
        to_email="bob@example.com", priority="normal", campaign=other, status="sent"
    )
    EmailEvent.objects.create(
        message=ours, kind="bounced", recipient="ann@example.com", provider="smtp", occurred_at=timezone.now()
    )
    EmailEvent.objects.create(
        message=theirs,
        kind="delivered",
        recipient="bob@example.com",
        provider="smtp",
        occurred_at=timezone.now(),
    )
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[draft.pk]))
    messages_url, events_url = page.context["messages_url"], page.context["events_url"]
    assert (
        f'href="{messages_url}"' in page.content.decode() and f'href="{events_url}"' in page.content.decode()
    )
    listing = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert f'<a class="campaign-messages" href="{messages_url}">' in listing

    listed = admin_client.get(messages_url).content.decode()
    assert "ann@example.com" in listed and "bob@example.com" not in listed
    assert "smtp: 550 mailbox unavailable" in listed  # the last-error column
    events = admin_client.get(events_url).content.decode()
    assert "ann@example.com" in events and "bob@example.com" not in events
    found = admin_client.get(
        reverse("admin:delivery_message_changelist"), {"q": "BOB@example.com"}
    ).content.decode()
    assert "bob@example.com" in found and "ann@example.com" not in found
    # Each message's page lists its events.
    detail = admin_client.get(reverse("admin:delivery_message_change", args=[ours.pk])).content.decode()
    assert 'id="events-group"' in detail and "bounced" in detail


# --- template preview and test send ---------------------------------------------------------


@pytest.fixture
def template(db: None) -> Template:
    return Template.objects.create(
        name="welcome",
        subject="Welcome {{ first }}",
        html='<p onclick="x()">Hi {{ first }}</p><script>parent.document.title="pwned"</script>',
        text="Hi {{ first }}, your plan is {{ plan }}",
        defaults={"first": "friend", "plan": "free"},
    )


def preview_url(template: Template) -> str:
    return reverse("admin:campaigns_template_preview", args=[template.pk])


def test_preview_renders_with_the_chosen_contact_inside_a_sandboxed_iframe(
    admin_client: Client, template: Template
) -> None:
    ann = Contact.objects.create(email="ann@example.com", attributes={"first": "Ann", "plan": "gold"})
    page = admin_client.get(preview_url(template), {"contact": "ANN@example.com"}).content.decode()
    assert '<span id="preview-subject">Welcome Ann</span>' in page
    assert "Hi Ann, your plan is gold" in page
    # The HTML is only in the iframe's srcdoc, escaped; the frame may run nothing.
    assert '<iframe id="preview-frame" title="HTML part" sandbox=""' in page
    assert 'srcdoc="&lt;p onclick=&quot;x()&quot;&gt;Hi Ann&lt;/p&gt;&lt;script&gt;' in page
    assert "<script>parent.document.title" not in page
    assert page.count('id="id_contact"') == 1 and 'id="test-send-to"' in page  # one id per element
    assert admin_client.get(preview_url(template), {"contact": ann.pk}).context["contact"] == ann
    defaults = admin_client.get(preview_url(template)).content.decode()
    assert "Welcome friend" in defaults and "your plan is free" in defaults
    missing = admin_client.get(preview_url(template), {"contact": "nobody@example.com"})
    assert "no contact &#x27;nobody@example.com&#x27;" in missing.content.decode()


def test_a_test_send_is_a_marked_transactional_message_sent_through_the_pipeline(
    admin_client: Client, template: Template, smtp: SMTPTestServer
) -> None:
    ann = Contact.objects.create(email="ann@example.com", attributes={"first": "Ann", "plan": "gold"})
    response = admin_client.post(
        reverse("admin:campaigns_template_test_send", args=[template.pk]),
        {"to": "qa@example.com", "priority": "critical", "contact": str(ann.pk)},
        follow=True,
    )
    message = Message.objects.get()
    page = response.content.decode()
    assert (
        f'<a id="test-send-message" href="{reverse("admin:delivery_message_change", args=[message.pk])}">'
        in page
    )
    assert (message.to_email, message.priority, message.template, message.campaign_id) == (
        "qa@example.com", "critical", template, None,
    )  # fmt: skip
    assert message.test_send_by == "admin" and message.context["first"] == "Ann"
    assert "emailhub:test_send" not in message.context
    assert message.status == "queued"

    assert send_messages([message.pk]).sent == 1  # what the critical worker does with its task
    (received,) = smtp.wait_for(1)
    mail = received.parsed()
    assert received.rcpt_tos == ["qa@example.com"] and mail["Subject"] == "Welcome Ann"
    assert "your plan is gold" in mail.get_body(("plain",)).get_content()
    listed = admin_client.get(
        reverse("admin:delivery_message_changelist"), {"test_send": "yes"}
    ).content.decode()
    assert "qa@example.com" in listed and "test send" in listed


@pytest.mark.parametrize(
    ("to", "priority", "field", "says"),
    [
        ("not an address", "high", "to", "is not a valid email address"),
        ("qa@example.com\r\nBcc: x@example.com", "high", "to", "line breaks"),
        ("", "high", "to", "required"),
        ("qa@example.com", "normal", "priority", "not one of the available choices"),
    ],
)
def test_a_test_send_to_a_bad_address_or_priority_is_a_form_error_and_sends_nothing(
    admin_client: Client, template: Template, to: str, priority: str, field: str, says: str
) -> None:
    response = admin_client.post(
        reverse("admin:campaigns_template_test_send", args=[template.pk]), {"to": to, "priority": priority}
    )
    assert response.status_code == 200
    errors = {
        name: " ".join(str(e) for e in errs) for name, errs in response.context["test_form"].errors.items()
    }
    assert says in errors.get(field, ""), errors
    assert 'id="test-send-form"' in response.content.decode()
    assert not Message.objects.exists() and not OutboxTask.objects.exists()


def test_a_test_send_needs_the_add_message_permission(client: Client, template: Template) -> None:
    user = User.objects.create_user("designer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_template"))
    client.force_login(user)
    page = client.get(preview_url(template))
    assert page.status_code == 200 and 'id="test-send-form"' not in page.content.decode()
    url = reverse("admin:campaigns_template_test_send", args=[template.pk])
    assert client.post(url, {"to": "qa@example.com", "priority": "high"}).status_code == 403
    assert not Message.objects.exists()


def test_an_api_client_cannot_mark_its_message_as_an_admin_test_send(api: APIClient) -> None:
    body = {"to": "a@example.com", "subject": "s", "text": "t", "context": {"emailhub:test_send": "me"}}
    response = api.post("/api/v1/messages", body, format="json")
    assert response.status_code == 400 and "emailhub:test_send" in response.content.decode()
    assert not Message.objects.exists()


def test_the_schedule_form_reads_times_in_the_operators_zone_by_default_and_says_so(
    admin_client: Client,
    draft: Campaign,
    settings,  # noqa: ANN001
) -> None:
    settings.TIME_ZONE = "Europe/Paris"  # the operator's zone, as the admin's zone middleware activates it
    page = admin_client.get(schedule_url(draft))
    assert page.context["form"].initial["zone"] == "Europe/Paris"
    assert "in Europe/Paris)" in page.content.decode() and " UTC (" in page.content.decode()
    wall = datetime.combine(timezone.now().date() + timedelta(days=30), time(9, 30))
    form = {**open_form(admin_client, draft), "zone": "Europe/Paris", "type": "at"}
    admin_client.post(schedule_url(draft), {**form, "scheduled_at": wall.strftime("%Y-%m-%dT%H:%M")})
    assert Campaign.objects.get(pk=draft.pk).scheduled_at == localize(wall, ZoneInfo("Europe/Paris"))


def test_scheduling_and_the_buttons_need_the_change_campaign_permission(
    client: Client, draft: Campaign
) -> None:
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_campaign"))
    client.force_login(user)
    assert client.get(schedule_url(draft)).status_code == 403
    assert client.post(schedule_url(draft), {"type": "immediate", "zone": "UTC"}).status_code == 403
    assert (
        client.post(reverse("admin:campaigns_campaign_button", args=[draft.pk, "cancel"])).status_code == 403
    )
    assert Campaign.objects.get(pk=draft.pk).status == "draft" and not OutboxTask.objects.exists()
