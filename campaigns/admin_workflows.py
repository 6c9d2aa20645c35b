"""The operator's workflows in the admin, each through the service the API calls.

- contact import: the upload form stores the file as an import job (`import_jobs.create_import_job`,
  the same call and header check as `POST /api/v1/contacts/import`); the job's page shows its
  progress (refreshing itself while it runs) and its rejected rows, downloadable as CSV;
- scheduling: a "Schedule…" page whose input is checked by the API's own `ScheduleSerializer`
  (and so by `lifecycle.check_schedule`) and applied by `lifecycle.schedule` with the same
  arguments as `POST /api/v1/campaigns/{id}/schedule`; pause, resume and cancel buttons on the
  campaign page call the lifecycle functions the list actions call;
- template preview with a chosen contact (the sending renderer, `core.templating` through
  `campaigns.services`), its HTML shown only inside a sandboxed iframe, and a test send
  (`delivery.services.test_sends`: a critical/high transactional message through the pipeline).

The admin classes in `campaigns/admin.py` take these as mixins; each adds its URLs in get_urls.

Stable element ids (the browser tests drive these): import — `#import-upload-link` (list page),
`#import-form` (`#id_file`, `#id_contact_list`, `#id_list_name`), `#import-submit`,
`#import-progress` (`data-status`, `data-percent`), `#import-status`, `#import-percent`,
`#import-rows`, `#import-rejections`, `#import-rejections-csv`; campaign page —
`#campaign-schedule-link`, `#campaign-pause`, `#campaign-resume`, `#campaign-cancel`,
`#campaign-archive`, `#campaign-messages-link`, `#campaign-events-link`, `#campaign-progress`
(`data-status`, `data-percent`, `data-next-send-at` while waiting), `#campaign-percent` (not while
waiting), `#campaign-waiting`, `#campaign-counters` (`#campaign-total`, `-excluded`, `-sent`,
`-failed`, `-suppressed`, `-cancelled`, `-unfinished`, `-bounced`, `-complained`, `-unsubscribed`); schedule page — `#schedule-form` (`#id_type_0..3` for
immediate, at, local_time, optimized; `#id_scheduled_at`, `#id_zone`, `#id_local_date`,
`#id_local_time`, `#id_past_time_policy`, `#id_window_start`, `#id_window_hours`,
`#id_holdout_percent`), `#schedule-submit`, `#schedule-refused`; template page —
`#template-preview-link`, `#preview-form` (`#id_contact`), `#preview-frame`, `#preview-subject`,
`#preview-text`, `#test-send-form` (`#test-send-to`, `#test-send-priority`), `#test-send-submit`,
`#test-send-message` (the link in the result message).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from campaigns import import_jobs, lifecycle
from campaigns.api.campaigns import ScheduleSerializer, schedule_validated
from campaigns.exceptions import CampaignStateError, ImportFileError
from campaigns.models import Campaign, Contact, ContactList, ImportIssue, ImportJob, Priority, Template
from campaigns.selectors import waiting_until, waits_for_due_instant
from campaigns.services import compile_template, contact_context
from core.admin import zoned
from core.localtime import localize
from core.templating import TemplateSyntaxError
from core.timezones import known_timezones
from delivery.exceptions import InvalidTestSend
from delivery.selectors import next_sends
from delivery.services import test_sends

# Rejected rows shown on an import's page; all of them are in the CSV download.
REJECTIONS_SHOWN = 100
# How often a running import's page reloads itself.
IMPORT_REFRESH_SECONDS = 2


def _zone_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted(known_timezones())]


def _admin_context(model_admin: admin.ModelAdmin, request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**model_admin.admin_site.each_context(request), "opts": model_admin.model._meta, **extra}


def _wrap(
    model_admin: admin.ModelAdmin, view: Callable[..., HttpResponseBase]
) -> Callable[..., HttpResponseBase]:
    return model_admin.admin_site.admin_view(view)


# --- contact import -------------------------------------------------------------------------


class ImportUploadForm(forms.Form):
    file = forms.FileField(
        help_text="UTF-8 CSV whose header row names an email column (name, timezone and any "
        "attribute columns optional); duplicates merge, the later row wins"
    )
    contact_list = forms.ModelChoiceField(
        ContactList.objects.order_by("name"), required=False, help_text="add the contacts to this list"
    )
    list_name = forms.CharField(
        max_length=200, required=False, help_text="…or to a new list of this name (created if missing)"
    )

    def clean_file(self) -> Any:
        file = self.cleaned_data["file"]
        limit = settings.EMAILHUB_IMPORT_MAX_BYTES
        if file.size > limit:
            raise forms.ValidationError(
                f"the file has {file.size} bytes; the limit is {limit} (EMAILHUB_IMPORT_MAX_BYTES)"
            )
        return file

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("contact_list") and (data.get("list_name") or "").strip():
            raise forms.ValidationError("choose an existing list or name a new one, not both")
        return data

    def target_list_name(self) -> str | None:
        chosen = self.cleaned_data.get("contact_list")
        return chosen.name if chosen else (self.cleaned_data.get("list_name") or "").strip() or None


def import_progress(job: ImportJob) -> dict[str, Any]:
    """What the job's page shows: rows so far, and the share of the file's bytes read."""
    finished = job.status in (ImportJob.Status.COMPLETED, ImportJob.Status.FAILED)
    if job.status == ImportJob.Status.COMPLETED or not job.size:
        percent = 100 if job.status == ImportJob.Status.COMPLETED else 0
    else:
        percent = min(99, int(100 * job.next_offset / job.size))
    # The file's rows are known only once it is read: while it runs, extrapolate from the bytes.
    estimate = None
    if not finished and job.next_offset and job.size:
        estimate = round(job.rows_read * job.size / job.next_offset)
    return {
        "percent": percent,
        "running": not finished,
        "rows_done": job.rows_read,
        "rows_estimate": estimate,
        "bytes_done": job.size if job.status == ImportJob.Status.COMPLETED else job.next_offset,
        "bytes_total": job.size,
    }


class ImportJobWorkflows(admin.ModelAdmin):
    """Upload page, progress on the job's page, rejected rows as CSV."""

    change_form_template = "admin/campaigns/importjob/change_form.html"
    change_list_template = "admin/campaigns/importjob/change_list.html"

    def get_urls(self) -> list[URLPattern]:
        return [
            path("upload/", _wrap(self, self.upload_view), name="campaigns_importjob_upload"),
            path(
                "<int:job_id>/rejections.csv",
                _wrap(self, self.rejections_csv_view),
                name="campaigns_importjob_rejections_csv",
            ),
            *super().get_urls(),
        ]

    def may_upload(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("campaigns.add_contact"))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        return super().changelist_view(
            request, {**(extra_context or {}), "may_upload": self.may_upload(request)}
        )

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        if not self.may_upload(request):
            raise PermissionDenied
        form = ImportUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            file = form.cleaned_data["file"]
            try:
                job = import_jobs.create_import_job(
                    file, filename=file.name or "", list_name=form.target_list_name()
                )
            except ImportFileError as exc:  # the header: refused before anything is stored
                form.add_error("file", str(exc))
            else:
                self.message_user(
                    request,
                    f"Import {job.pk} stored ({job.size} bytes); a worker imports it now.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:campaigns_importjob_change", args=[job.pk]))
        context = _admin_context(self, request, title="Import contacts from a CSV file", form=form)
        return TemplateResponse(request, "admin/campaigns/importjob/upload.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = (
            ImportJob.objects.filter(pk=object_id).select_related("contact_list").first()
            if object_id.isdigit()
            else None
        )
        extra = dict(extra_context or {})
        if job is not None:
            progress = import_progress(job)
            extra.update(
                job=job,
                progress=progress,
                refresh_seconds=IMPORT_REFRESH_SECONDS if progress["running"] else None,
                rejections=list(
                    ImportIssue.objects.filter(job=job, kind=ImportIssue.Kind.REJECTED).order_by("line")[
                        :REJECTIONS_SHOWN
                    ]
                ),
                rejections_shown=REJECTIONS_SHOWN,
            )
        return super().change_view(request, object_id, form_url, extra)

    def rejections_csv_view(self, request: HttpRequest, job_id: int) -> StreamingHttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        job = get_object_or_404(ImportJob, pk=job_id)
        response = StreamingHttpResponse(
            import_jobs.rejections_csv(job), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="import-{job.pk}-rejected.csv"'
        return response


# --- scheduling -----------------------------------------------------------------------------


class WallDateTimeField(forms.DateTimeField):
    """A date and time on the wall (no zone); the form reads it in the zone it names."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def to_python(self, value: Any) -> datetime | None:  # type: ignore[override]
        if value in self.empty_values:
            return None
        if isinstance(value, datetime):
            return value.replace(tzinfo=None)
        try:
            parsed = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise forms.ValidationError("give a date and time, e.g. 2030-05-01 09:30") from None
        if parsed.tzinfo is not None:
            raise forms.ValidationError("give the wall time without an offset; choose its zone below")
        return parsed


class ScheduleForm(forms.Form):
    """The API's schedule body as a form. Every rule is the API's: ScheduleSerializer checks it."""

    # No initial type: with "immediate" preselected, an operator who filled in the `at` date and
    # forgot the radio sent the campaign at once (issue 18, item 16).
    type = forms.ChoiceField(
        choices=Campaign.ScheduleType.choices,
        widget=forms.RadioSelect,
        error_messages={"required": "choose when to send: immediate, at, local_time or optimized"},
    )
    scheduled_at = WallDateTimeField(required=False, label="at (date and time)", help_text="type at")
    zone = forms.ChoiceField(
        choices=_zone_choices,
        label="zone of the dates and times",
        help_text="the zone 'at' and the window start are read in; the page shows the UTC instant",
    )
    local_date = forms.DateField(
        required=False,
        label="local date",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="type local_time",
    )
    local_time = forms.TimeField(
        required=False,
        label="local time",
        widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
        help_text="type local_time: the wall time in each recipient's own timezone",
    )
    past_time_policy = forms.ChoiceField(
        choices=Campaign.PastTimePolicy.choices,
        initial=Campaign.PastTimePolicy.NEXT_DAY,
        required=False,
        help_text="type local_time: recipients for whom that time has passed",
    )
    window_start = WallDateTimeField(
        required=False, label="window start", help_text="type optimized: empty means now"
    )
    window_hours = forms.IntegerField(
        required=False, initial=lifecycle.DEFAULT_WINDOW_HOURS, help_text="type optimized: 1 to 168"
    )
    holdout_percent = forms.IntegerField(
        required=False,
        initial=lifecycle.DEFAULT_HOLDOUT_PERCENT,
        help_text="type optimized: 0 to 50, sent at the window's start to measure the lift",
    )
    # The campaign as the operator saw it: a change since (an edit, a schedule) refuses the form.
    seen_updated_at = forms.CharField(widget=forms.HiddenInput, required=False)

    # The API fields each type takes; the others are not sent (schedule() stores what it gets).
    # A started campaign's page shows its type's fields only (CampaignAdmin.get_fieldsets).
    TYPE_FIELDS: dict[str, tuple[str, ...]] = {
        Campaign.ScheduleType.IMMEDIATE: (),
        Campaign.ScheduleType.AT: ("scheduled_at",),
        Campaign.ScheduleType.LOCAL_TIME: ("local_date", "local_time", "past_time_policy"),
        Campaign.ScheduleType.OPTIMIZED: ("window_start", "window_hours", "holdout_percent"),
    }
    # The fields that say *when*. One filled in for a type that does not use it is refused: the
    # operator meant a moment the chosen type would ignore. The number and policy fields carry
    # defaults, so a value there for another type is simply not sent.
    MOMENT_FIELDS = ("scheduled_at", "local_date", "local_time", "window_start")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        kind = data.get("type")
        if kind is None:
            return data
        ignored = {name for fields in self.TYPE_FIELDS.values() for name in fields} - set(
            self.TYPE_FIELDS[kind]
        )
        for name in ignored & set(self.errors):
            del self.errors[name]  # an unparseable value is refused below only if it is a moment
        for name in self.MOMENT_FIELDS:
            if name in ignored and str(self[name].data or "").strip():
                self.add_error(
                    name,
                    f"filled in, but type '{kind}' does not use {self.fields[name].label}: clear it, "
                    "or choose the type that does",
                )
        if self.errors:
            return data
        zone = ZoneInfo(data.get("zone") or "UTC")
        payload: dict[str, Any] = {"type": kind}
        for name in self.TYPE_FIELDS[kind]:
            value = data.get(name)
            if value in (None, ""):
                continue
            if isinstance(value, datetime):
                value = localize(value, zone)  # core.localtime: DST gaps and folds as fan-out does
            payload[name] = value
        serializer = ScheduleSerializer(data=payload)
        if not serializer.is_valid():
            for name, errors in serializer.errors.items():
                field = name if name in self.fields else None
                for error in errors if isinstance(errors, list) else [errors]:
                    self.add_error(field, str(error))
            return data
        self.api_data = serializer.validated_data
        return data


def _schedule(campaign_id: int, data: dict[str, Any], seen_updated_at: str) -> Campaign:
    """lifecycle.schedule with the arguments the API's schedule view passes."""
    unchanged_since = datetime.fromisoformat(seen_updated_at) if seen_updated_at else None
    return schedule_validated(campaign_id, data, unchanged_since=unchanged_since)


def _describe(campaign: Campaign) -> str:
    kind = campaign.schedule_type
    if kind == Campaign.ScheduleType.AT and campaign.scheduled_at:
        return f"at {campaign.scheduled_at:%Y-%m-%d %H:%M} UTC"
    if kind == Campaign.ScheduleType.LOCAL_TIME:
        return f"at {campaign.local_time} on {campaign.local_date} in each recipient's timezone"
    if kind == Campaign.ScheduleType.OPTIMIZED and campaign.window_start:
        return (
            f"optimized over {campaign.window_hours} h from {campaign.window_start:%Y-%m-%d %H:%M} UTC, "
            f"holdout {campaign.holdout_percent}%"
        )
    return "now"


# The buttons on a campaign's page: lifecycle function, label, the states it applies to.
CAMPAIGN_BUTTONS = {
    "pause": ("Pause", (Campaign.Status.SENDING, Campaign.Status.SCHEDULED)),
    "resume": ("Resume", (Campaign.Status.PAUSED,)),
    "cancel": (
        "Cancel campaign",
        (Campaign.Status.DRAFT, Campaign.Status.SCHEDULED, Campaign.Status.SENDING, Campaign.Status.PAUSED),
    ),
    "archive": ("Archive", lifecycle.ARCHIVABLE),  # and not archived yet (campaign_buttons)
}


def campaign_buttons(campaign: Campaign) -> list[tuple[str, str]]:
    """(verb, label) of the buttons that apply to the campaign as it is now."""
    return [
        (verb, label)
        for verb, (label, states) in CAMPAIGN_BUTTONS.items()
        if campaign.status in states and not (verb == "archive" and campaign.archived_at)
    ]


def next_send(campaign: Campaign) -> datetime | None:
    """When a campaign that has sent nothing yet sends its first message (campaigns.selectors
    .waiting_until): its start, or its earliest due message, found with one indexed query."""
    finished = campaign.finished_count
    due = (
        next_sends([campaign.pk]).get(campaign.pk)
        if waits_for_due_instant(campaign.status, campaign.schedule_type, finished)
        else None
    )
    return waiting_until(
        status=campaign.status,
        schedule_type=campaign.schedule_type,
        scheduled_at=campaign.scheduled_at,
        finished=finished,
        next_due=due,
        now=timezone.now(),
    )


def campaign_links(campaign: Campaign) -> tuple[str, str]:
    """The message list and the event list filtered on this campaign (delivery's admin filters)."""
    query = f"?campaign={campaign.pk}"
    return (
        reverse("admin:delivery_message_changelist") + query,
        reverse("admin:delivery_emailevent_changelist") + query,
    )


class CampaignWorkflows(admin.ModelAdmin):
    """The Schedule… page and the pause/resume/cancel buttons of a campaign's page."""

    change_form_template = "admin/campaigns/campaign/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:campaign_id>/schedule/",
                _wrap(self, self.schedule_view),
                name="campaigns_campaign_schedule",
            ),
            path(
                "<int:campaign_id>/do/<str:verb>/",
                _wrap(self, require_POST(self.button_view)),
                name="campaigns_campaign_button",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="messages and events")
    def links(self, campaign: Campaign) -> str:
        if campaign.pk is None:
            return "—"
        messages_url, events_url = campaign_links(campaign)
        return format_html(
            '<a class="campaign-messages" href="{}">messages</a> · <a class="campaign-events" href="{}">events</a>',
            messages_url, events_url,
        )  # fmt: skip

    def _may_operate(self, request: HttpRequest) -> None:
        if not request.user.has_perm("campaigns.change_campaign"):
            raise PermissionDenied

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        campaign = Campaign.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        extra = dict(extra_context or {})
        if campaign is not None:
            messages_url, events_url = campaign_links(campaign)
            sends_at = next_send(campaign)
            extra.update(
                campaign_buttons=campaign_buttons(campaign),
                may_schedule=campaign.status == Campaign.Status.DRAFT,
                # Delete only where lifecycle.delete_draft would (a draft with no messages).
                show_delete=lifecycle.why_not_deletable(campaign) is None,
                messages_url=messages_url,
                events_url=events_url,
                failed_url=f"{messages_url}&status__exact=failed",
                next_send=zoned(sends_at) if sends_at else None,
                next_send_iso=sends_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
                if sends_at
                else None,
            )
        return super().change_view(request, object_id, form_url, extra)

    def button_view(self, request: HttpRequest, campaign_id: int, verb: str) -> HttpResponse:
        self._may_operate(request)
        campaign = get_object_or_404(Campaign, pk=campaign_id)
        if verb not in CAMPAIGN_BUTTONS:
            raise Http404(f"no campaign action {verb!r}")
        try:
            campaign = getattr(lifecycle, verb)(campaign.pk)
        except CampaignStateError as exc:  # changed since the page was drawn (or a double click)
            self.message_user(request, f"{campaign}: not done: {exc}", messages.ERROR)
        else:
            self.message_user(
                request, f"{campaign}: {verb} done; it is {campaign.status} now", messages.SUCCESS
            )
        return HttpResponseRedirect(reverse("admin:campaigns_campaign_change", args=[campaign_id]))

    def schedule_view(self, request: HttpRequest, campaign_id: int) -> HttpResponse:
        self._may_operate(request)
        campaign = get_object_or_404(Campaign, pk=campaign_id)
        change_url = reverse("admin:campaigns_campaign_change", args=[campaign.pk])
        if request.method == "POST":
            form = ScheduleForm(request.POST)
            if form.is_valid():
                try:
                    campaign = _schedule(campaign.pk, form.api_data, form.cleaned_data["seen_updated_at"])
                except CampaignStateError as exc:
                    # Scheduled, cancelled or edited by someone else since this form was opened.
                    self.message_user(
                        request, f"{campaign}: not scheduled, nothing changed: {exc}", messages.ERROR
                    )
                    return HttpResponseRedirect(change_url)
                self.message_user(
                    request,
                    f"{campaign}: scheduled {_describe(campaign)}; it is {campaign.status} now",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(change_url)
        else:
            form = ScheduleForm(
                initial={
                    "zone": timezone.get_current_timezone_name(),
                    "seen_updated_at": campaign.updated_at.isoformat(),
                }
            )
        context = _admin_context(
            self,
            request,
            title=f"Schedule {campaign}",
            campaign=campaign,
            form=form,
            change_url=change_url,
            schedulable=campaign.status == Campaign.Status.DRAFT,
            now_utc=timezone.now(),
            operator_zone=timezone.get_current_timezone_name(),
        )
        return TemplateResponse(request, "admin/campaigns/campaign/schedule.html", context)


# --- template preview and test send ---------------------------------------------------------


class PreviewForm(forms.Form):
    contact = forms.CharField(
        required=False,
        help_text="a contact's id or address; empty: the template's declared defaults only",
    )

    def clean_contact(self) -> Contact | None:
        value = (self.cleaned_data.get("contact") or "").strip()
        if not value:
            return None
        contacts = Contact.objects.filter(anonymised_at=None)
        found = (
            contacts.filter(pk=int(value)).first()
            if value.isdigit()
            else contacts.filter(email=value.lower()).first()
        )
        if found is None:
            raise forms.ValidationError(f"no contact {value!r}")
        return found


# The preview form's `contact` is id_contact; the test-send form's fields get ids of their own.
TEST_SEND_IDS = "test-send-%s"


class TestSendForm(forms.Form):
    to = forms.CharField(
        max_length=254, label="send a test to", help_text="one address; it gets this template once"
    )
    priority = forms.ChoiceField(
        choices=[(p, p) for p in test_sends.TEST_SEND_PRIORITIES], initial=Priority.HIGH
    )
    contact = forms.CharField(widget=forms.HiddenInput, required=False)


class TemplateWorkflows(admin.ModelAdmin):
    """Preview with a chosen contact, in a sandboxed iframe, and a test send."""

    change_form_template = "admin/campaigns/template/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:template_id>/preview/",
                _wrap(self, self.preview_view),
                name="campaigns_template_preview",
            ),
            path(
                "<int:template_id>/test-send/",
                _wrap(self, require_POST(self.test_send_view)),
                name="campaigns_template_test_send",
            ),
            *super().get_urls(),
        ]

    def preview_view(
        self, request: HttpRequest, template_id: int, test_form: TestSendForm | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        template = get_object_or_404(Template, pk=template_id)
        source = request.POST if test_form is not None else request.GET
        form = PreviewForm({"contact": source.get("contact", "")})
        contact = form.cleaned_data["contact"] if form.is_valid() else None
        rendered, error = None, None
        try:
            rendered = compile_template(template).render(contact_context(contact))
        except TemplateSyntaxError as exc:
            error = str(exc)
        context = _admin_context(
            self,
            request,
            title=f"Preview {template}",
            template_obj=template,
            preview_form=form,
            contact=contact,
            rendered=rendered,
            render_error=error,
            test_form=test_form
            or TestSendForm(initial={"contact": form.data.get("contact", "")}, auto_id=TEST_SEND_IDS),
            may_send=self.may_test_send(request),
        )
        return TemplateResponse(request, "admin/campaigns/template/preview.html", context)

    def may_test_send(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("delivery.add_message"))

    def test_send_view(self, request: HttpRequest, template_id: int) -> HttpResponse:
        if not self.may_test_send(request):
            raise PermissionDenied
        template = get_object_or_404(Template, pk=template_id)
        form = TestSendForm(request.POST, auto_id=TEST_SEND_IDS)
        preview = PreviewForm({"contact": request.POST.get("contact", "")})
        if form.is_valid() and preview.is_valid():
            try:
                message = test_sends.send_test(
                    template,
                    form.cleaned_data["to"],
                    contact=preview.cleaned_data["contact"],
                    priority=form.cleaned_data["priority"],
                    operator=request.user.get_username(),
                )
            except InvalidTestSend as exc:
                for name, reason in exc.errors.items():
                    form.add_error(name if name in form.fields else None, reason)
            else:
                url = reverse("admin:delivery_message_change", args=[message.pk])
                self.message_user(
                    request,
                    format_html(
                        'Test message <a id="test-send-message" href="{}">{}</a> to {} accepted ({}); '
                        "it is {}.",
                        url,
                        message.pk,
                        message.to_email,
                        message.priority,
                        message.status,
                    ),  # fmt: skip
                    messages.SUCCESS,
                )
                query = f"?contact={preview.data['contact']}" if preview.data.get("contact") else ""
                return HttpResponseRedirect(
                    reverse("admin:campaigns_template_preview", args=[template.pk]) + query
                )
        elif not preview.is_valid():
            form.add_error(None, "; ".join(str(e) for e in preview.errors.get("contact", [])))
        return self.preview_view(request, template_id, test_form=form)
