from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from campaigns import lifecycle
from campaigns.admin_segments import SegmentAdmin  # noqa: F401  (registered there; autodiscovery imports this module)
from campaigns.admin_workflows import CampaignWorkflows, ImportJobWorkflows, ScheduleForm, TemplateWorkflows
from campaigns.api.campaigns import CampaignSerializer, TemplateSerializer
from campaigns.api.contacts import ContactListSerializer, ContactSerializer, SuppressionSerializer
from campaigns.erasure import erase_contacts, placeholder_for
from campaigns.exceptions import CampaignStateError
from campaigns.models import (
    Campaign,
    Contact,
    ContactList,
    EngagementPopulation,
    EngagementProfile,
    ImportChunk,
    ImportIssue,
    ImportJob,
    ListMembership,
    Suppression,
    Template,
    audience_text,
)
from campaigns.reporting import campaign_report
from campaigns.services import compile_template, contact_context
from core.admin import ZonedTimesMixin
from core.templating import TemplateSyntaxError
from core.validators import STORABLE_JSON_FORMFIELDS, ApiValidatedForm


class ContactForm(ApiValidatedForm):
    api_serializer = ContactSerializer  # the address (lower-cased, one, unique), name, attributes


class ContactListForm(ApiValidatedForm):
    api_serializer = ContactListSerializer


class SuppressionForm(ApiValidatedForm):
    # Lower-cased as the API stores it: fan-out's anti-join and the send check match that.
    api_serializer = SuppressionSerializer


class TemplateForm(ApiValidatedForm):
    api_serializer = TemplateSerializer  # defaults: an object, as the API takes


@admin.register(Contact)
class ContactAdmin(ZonedTimesMixin):
    """Delete anonymises (campaigns.erasure): the record that mail was sent to a contact stays.

    `status` is written by bounces, complaints and unsubscribes, so the form shows it and never
    saves it; a save writes only the fields the operator changed.
    """

    form = ContactForm
    formfield_overrides = STORABLE_JSON_FORMFIELDS  # NUL in attributes: a form error, not a 500

    list_display = ("email", "name", "timezone", "status", "created_at", "anonymised_at")
    list_filter = ("status",)
    search_fields = ("=email", "name")
    readonly_fields = ("status", "suppression", "events", "created_at", "updated_at", "anonymised_at")
    show_full_result_count = False

    @admin.display(description="suppression")
    def suppression(self, contact: Contact) -> str:
        row = Suppression.objects.filter(email=contact.email.lower()).first()
        return f"{row.reason}: {row.detail or 'no detail'} (since {row.created_at:%Y-%m-%d})" if row else "—"

    @admin.display(description="events")
    def events(self, contact: Contact) -> str:
        # Events are kept by address (recipient), not by contact: the link filters the event list.
        query = urlencode({"recipient": contact.email.lower()})  # a `+` in an address stays a `+`
        url = f"{reverse('admin:delivery_emailevent_changelist')}?{query}"
        return format_html('<a href="{}">events for {}</a>', url, contact.email)

    def has_change_permission(self, request: HttpRequest, obj: Contact | None = None) -> bool:
        if obj is not None and obj.anonymised_at is not None:
            return False  # nothing personal may be written back to an erased contact
        return super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Contact, form: forms.ModelForm, change: bool) -> None:
        if change:
            fields = [f for f in form.changed_data if f not in self.readonly_fields]
            if fields:
                obj.save(update_fields=[*fields, "updated_at"])
        else:
            obj.save()

    def get_deleted_objects(
        self, objs: Sequence[Any] | QuerySet[Any], request: HttpRequest
    ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        # Nothing is deleted, so the confirmation page must not list memberships and messages as
        # if they were (and must not walk them: a contact can be in many lists).
        summary = [
            f"{contact}: anonymised, not deleted: the address becomes {placeholder_for(contact.pk)}, "
            "name and attributes are cleared, list memberships removed; messages sent to it keep "
            "their status and timestamps under the placeholder address"
            for contact in objs
        ]
        return summary, {"contacts to anonymise": len(summary)}, set(), []

    def delete_model(self, request: HttpRequest, obj: Contact) -> None:
        erase_contacts([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Contact]) -> None:
        erase_contacts(list(queryset.values_list("pk", flat=True)))


@admin.register(ContactList)
class ContactListAdmin(ZonedTimesMixin):
    form = ContactListForm
    list_display = ("name", "created_at")
    search_fields = ("name",)
    readonly_fields = ("created_at",)


@admin.register(ListMembership)
class ListMembershipAdmin(ZonedTimesMixin):
    list_display = ("contact_list", "contact", "added_at")
    list_filter = ("contact_list",)
    search_fields = ("=contact__email",)
    raw_id_fields = ("contact",)
    readonly_fields = ("added_at",)
    show_full_result_count = False


@admin.register(Suppression)
class SuppressionAdmin(ZonedTimesMixin):
    form = SuppressionForm
    # The detail is the provider's diagnostic (bounce subtype, complaint type): why it is here.
    list_display = ("email", "reason", "detail", "created_at")
    list_filter = ("reason",)
    search_fields = ("=email",)
    readonly_fields = ("created_at",)


@admin.register(Template)
class TemplateAdmin(ZonedTimesMixin, TemplateWorkflows):
    form = TemplateForm
    formfield_overrides = STORABLE_JSON_FORMFIELDS  # NUL in defaults: a form error, not a 500
    list_display = ("name", "subject", "updated_at")
    search_fields = ("name", "subject")
    readonly_fields = ("preview", "created_at", "updated_at")

    @admin.display(description="Preview (first contact, or the declared defaults)")
    def preview(self, template: Template) -> str:
        if template.pk is None:
            return "Save the template to see a preview."
        contact = Contact.objects.order_by("id").first()
        try:
            rendered = compile_template(template).render(contact_context(contact))
        except TemplateSyntaxError as exc:
            return f"Template error: {exc}"
        who = contact.email if contact else "no contact yet"
        # The rendered HTML is shown as text inside <pre>, never as live markup in the admin.
        return format_html(
            "<p><b>To:</b> {}<br><b>Subject:</b> {}</p><pre style='white-space:pre-wrap'>{}</pre>"
            "<pre style='white-space:pre-wrap'>{}</pre>",
            who, rendered.subject, rendered.text, rendered.html,
        )  # fmt: skip


def _apply(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, change: str) -> None:
    done = 0
    for campaign in queryset:
        try:
            if change == "schedule":
                lifecycle.schedule(campaign.pk, Campaign.ScheduleType.IMMEDIATE)
            elif change == "optimize":
                # The draft's own window length and holdout (editable on its form); starts now.
                lifecycle.schedule(
                    campaign.pk,
                    Campaign.ScheduleType.OPTIMIZED,
                    window_hours=campaign.window_hours,
                    holdout_percent=campaign.holdout_percent,
                )
            else:
                getattr(lifecycle, change)(campaign.pk)
            done += 1
        except CampaignStateError as exc:
            modeladmin.message_user(request, f"{campaign}: {exc}", messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{change}: {done} campaign(s)", messages.SUCCESS)


@admin.action(description="Start now (draft campaigns)")
def start_now(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "schedule")


@admin.action(description="Send optimized: each recipient at their best hour in the next window_hours")
def send_optimized(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "optimize")


@admin.action(description="Pause")
def pause(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "pause")


@admin.action(description="Resume")
def resume(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "resume")


@admin.action(description="Cancel (what is not sent yet is never sent)")
def cancel(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "cancel")


@admin.action(description="Archive (completed, cancelled or failed campaigns)")
def archive(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _apply(modeladmin, request, queryset, "archive")


class ArchivedFilter(admin.SimpleListFilter):
    """Archived campaigns are hidden unless asked for: the default list shows live ones."""

    title = "archived"
    parameter_name = "archived"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Archived"), ("all", "All")]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "Not archived",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> QuerySet[Campaign]:
        if self.value() == "yes":
            return queryset.filter(archived_at__isnull=False)
        if self.value() == "all":
            return queryset
        return queryset.filter(archived_at__isnull=True)


# What the admin may edit of a draft (besides its name).
DRAFT_CONTENT = (
    "template", "contact_list", "segment", "from_email", "priority", "window_hours", "holdout_percent", "track_opens",
    "track_clicks", "tags",
)  # fmt: skip


class CampaignForm(ApiValidatedForm):
    """A draft's form, validated as the API validates a campaign. `window_hours` and
    `holdout_percent` are set by the API's schedule call, so their range is the schedule rule's
    (lifecycle, which refused an out-of-range draft only when it was sent). `holdout_percent` may
    be left empty (the API's default then applies), so a form that predates the field, or an
    operator who never sends optimized, needs no value."""

    api_serializer = CampaignSerializer

    window_hours = forms.IntegerField(
        min_value=lifecycle.WINDOW_HOURS[0], max_value=lifecycle.WINDOW_HOURS[1],
        initial=lifecycle.DEFAULT_WINDOW_HOURS,
        help_text="optimized campaigns: each recipient is sent at their best hour within this many hours",
    )  # fmt: skip
    holdout_percent = forms.IntegerField(
        required=False, min_value=lifecycle.HOLDOUT_PERCENT[0], max_value=lifecycle.HOLDOUT_PERCENT[1],
        initial=lifecycle.DEFAULT_HOLDOUT_PERCENT,
        help_text="optimized campaigns: the share sent at the window's start to measure the lift",
    )  # fmt: skip

    def clean_holdout_percent(self) -> int:
        value = self.cleaned_data.get("holdout_percent")
        return lifecycle.DEFAULT_HOLDOUT_PERCENT if value is None else value


@admin.register(Campaign)
class CampaignAdmin(ZonedTimesMixin, CampaignWorkflows):
    """State changes go through the actions (lifecycle services). Status, counters, cursor and
    timestamps are never written from this form: a full-row save would overwrite what workers
    and fan-out moved meanwhile. A draft's content is saved through lifecycle.update_draft (locked
    against a concurrent schedule); once it has started, only its name (a label) can change.

    A campaign with messages is never deleted (its delivery history stays): it is cancelled and
    archived. Only a draft with no messages is deleted, and the confirmation page never lists
    messages (a 1M campaign's page would time out).
    """

    actions = [start_now, send_optimized, pause, resume, cancel, archive]
    form = CampaignForm
    list_display = (
        "name",
        "status",
        "audience",
        "priority",
        "schedule_type",
        "total_count",
        "sent_count",
        "progress",
        "bounce_rate",
        "complaint_rate",
        "created_at",
        "links",
    )
    list_filter = (ArchivedFilter, "status", "priority", "schedule_type")
    list_select_related = ("contact_list", "segment")  # the audience column
    search_fields = ("name",)
    draft_content = DRAFT_CONTENT
    # Everything but the name and a draft's content is written by the lifecycle services and the
    # workers (status, schedule, cursor, counters): derived from the model, so a counter added
    # later can never become a form field that a Save writes back.
    always_readonly = (
        *(f.name for f in Campaign._meta.fields if f.name not in ("id", "name", *DRAFT_CONTENT)),
        "audience",
        "audience_as_scheduled",
        "progress",
        "bounce_rate",
        "complaint_rate",
        "engagement",
        "links",
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Campaign | None = None) -> tuple[str, ...]:
        if obj is not None and obj.status != Campaign.Status.DRAFT:
            return (*self.always_readonly, *self.draft_content)
        return self.always_readonly

    def get_fieldsets(self, request: HttpRequest, obj: Campaign | None = None) -> Any:
        """What the operator reads and acts on. The counters are the progress summary above the
        form (change_form.html), status and the buttons beside it; the workers' bookkeeping
        (fan-out cursor and flag, updated_at) is not shown at all. A started campaign shows its
        schedule type and that type's own fields only."""
        content = (
            None,
            {
                "fields": (
                    "name",
                    "template",
                    ("contact_list", "segment"),
                    "from_email",
                    "priority",
                    ("track_opens", "track_clicks"),
                    "tags",
                )
            },
        )
        if obj is None or obj.status == Campaign.Status.DRAFT:
            optimized = (
                "If sent optimized",
                {
                    "fields": ("window_hours", "holdout_percent"),
                    "description": "the Schedule… page can change them",
                },
            )
            return [content, optimized] + ([("Times", {"fields": ("created_at",)})] if obj else [])
        schedule = ("schedule_type", *ScheduleForm.TYPE_FIELDS.get(obj.schedule_type, ()))
        return [
            content,
            ("Audience", {"fields": ("audience_as_scheduled",)}),
            ("Schedule", {"fields": schedule}),
            ("Engagement", {"fields": ("engagement",)}),
            ("Times", {"fields": ("created_at", "started_at", "completed_at", "archived_at")}),
        ]

    def save_model(self, request: HttpRequest, obj: Campaign, form: forms.ModelForm, change: bool) -> None:
        if not change:
            obj.save()  # a new draft
            return
        readonly = self.get_readonly_fields(request, obj)
        changes = {f: form.cleaned_data[f] for f in form.changed_data if f not in readonly}
        if not changes:
            return
        if set(changes) - {"name"}:
            try:
                lifecycle.update_draft(obj.pk, changes)
            except CampaignStateError as exc:  # scheduled between the form's check and this save
                self.message_user(request, f"{obj}: not saved: {exc}", messages.ERROR)
        else:
            # Only the label: one column, and not updated_at, which the stalled-fan-out sweep
            # reads as fan-out progress.
            Campaign.objects.filter(pk=obj.pk).update(name=changes["name"])

    def get_deleted_objects(
        self, objs: Sequence[Any] | QuerySet[Any], request: HttpRequest
    ) -> tuple[Any, Any, set[str], list[str]]:
        refused = [
            f"{campaign} (campaign {campaign.pk}) is {campaign.status}"
            + (f" with {campaign.total_count} message(s)" if campaign.total_count else "")
            + ": only a draft with no messages is deleted; cancel and archive it instead"
            for campaign in objs
            if lifecycle.why_not_deletable(campaign)
        ]
        if refused:
            return [], {}, set(), refused
        return super().get_deleted_objects(objs, request)

    def delete_model(self, request: HttpRequest, obj: Campaign) -> None:
        self.delete_queryset(request, Campaign.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        # get_deleted_objects refused everything but message-less drafts just before; the service
        # checks again under the row lock, for a draft started in between.
        for campaign_id in queryset.values_list("pk", flat=True):
            try:
                lifecycle.delete_draft(campaign_id)
            except CampaignStateError as exc:
                self.message_user(request, f"campaign {campaign_id} not deleted: {exc}", messages.ERROR)

    @admin.display(description="audience")
    def audience(self, campaign: Campaign) -> str:
        return audience_text(campaign.contact_list, campaign.segment)

    @admin.display(description="audience")
    def audience_as_scheduled(self, campaign: Campaign) -> str:
        text = audience_text(campaign.contact_list, campaign.segment)
        if campaign.audience_filter is None:
            return text
        # What fan-out reads: the segment's filter as it was when the campaign was scheduled.
        shown = json.dumps(campaign.audience_filter, indent=2, ensure_ascii=False)
        return format_html(
            "{}<br>the segment's filter as it was when the campaign was scheduled (what fan-out "
            "reads; later edits of the segment do not change this campaign):<pre>{}</pre>",
            text, shown,
        )  # fmt: skip

    @admin.display(description="done")
    def progress(self, campaign: Campaign) -> str:
        return f"{campaign.percent_done}%"

    # Feedback over what was sent: hard bounces and complaints, each message counted once
    # (delivery.services.events moves the counters).
    @admin.display(description="bounce rate")
    def bounce_rate(self, campaign: Campaign) -> str:
        return _rate(campaign.bounced_count, campaign.sent_count)

    @admin.display(description="complaint rate")
    def complaint_rate(self, campaign: Campaign) -> str:
        return _rate(campaign.complained_count, campaign.sent_count)

    @admin.display(description="engagement")
    def engagement(self, campaign: Campaign) -> str:
        """The API's report (campaigns.reporting): human rates, other hits apart, the lift."""
        if campaign.pk is None:
            return "—"
        report = campaign_report(campaign)
        hits = ", ".join(
            f"{cls} {report['open_hits'][cls]}/{report['click_hits'][cls]}" for cls in report["open_hits"]
        )
        html = format_html(
            "<p>Sent {}, delivered {}. Human opens {} ({}), human clicks {} ({}).<br>"
            "Hits (opens/clicks) by class: {}.<br>Bounced {}, complained {}, unsubscribed {}.</p>",
            report["sent"], report["delivered"], report["opened"], _percent(report["open_rate"]),
            report["clicked"], _percent(report["click_rate"]), hits,
            report["bounced"], report["complained"], report["unsubscribed"],
        )  # fmt: skip
        lift = report["lift"]
        if lift:
            html += format_html(
                "<p>Optimized: {} sent, open rate {}, click rate {}. Holdout ({}%): {} sent, open rate {},"
                " click rate {}.<br>Open-rate lift {} (95% CI {}), ratio {} (95% CI {}); click-rate lift {}"
                " (95% CI {}).<br><small>{}</small></p>",
                lift["optimized"]["sent"], _percent(lift["optimized"]["open_rate"]),
                _percent(lift["optimized"]["click_rate"]), lift["holdout_percent"], lift["holdout"]["sent"],
                _percent(lift["holdout"]["open_rate"]), _percent(lift["holdout"]["click_rate"]),
                _points(lift["open_rate"]["difference"]), _interval(lift["open_rate"]["difference_ci95"], _points),
                _number(lift["open_rate"]["ratio"]), _interval(lift["open_rate"]["ratio_ci95"], _number),
                _points(lift["click_rate"]["difference"]), _interval(lift["click_rate"]["difference_ci95"], _points),
                lift["method"],
            )  # fmt: skip
        return html


def _rate(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}% ({part})" if whole else "—"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def _points(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.2f} points"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _interval(bounds: list[float] | None, show: Any) -> str:
    return "—" if not bounds else f"{show(bounds[0])} to {show(bounds[1])}"


class WorkerWrittenAdmin(ZonedTimesMixin):
    """Tables only a task writes (import jobs: progress, counters, resume point; engagement
    profiles): shown, never saved, so a form opened mid-run cannot write stale values back."""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(ImportJob)
class ImportJobAdmin(ImportJobWorkflows, WorkerWrittenAdmin):
    list_display = (
        "id", "filename", "contact_list", "status", "rows_read", "rows_created", "rows_updated",
        "rows_duplicate", "rows_rejected", "created_at",
    )  # fmt: skip
    list_filter = ("status",)
    search_fields = ("filename", "list_name")


@admin.register(ImportIssue)
class ImportIssueAdmin(WorkerWrittenAdmin):
    list_display = ("job", "kind", "line", "reason", "excerpt")
    list_filter = ("kind",)
    list_select_related = ("job",)
    search_fields = ("reason", "excerpt")


@admin.register(ImportChunk)
class ImportChunkAdmin(WorkerWrittenAdmin):
    """The stored upload, in 1 MiB chunks; the bytes themselves are not shown."""

    list_display = ("job", "seq")
    fields = ("job", "seq")
    list_select_related = ("job",)


@admin.register(EngagementProfile)
class EngagementProfileAdmin(WorkerWrittenAdmin):
    """Written only by the engagement refresh (set-based, from human opens and clicks)."""

    list_display = ("contact", "best_hour", "decayed_at")
    list_select_related = ("contact",)
    search_fields = ("contact__email",)


@admin.register(EngagementPopulation)
class EngagementPopulationAdmin(WorkerWrittenAdmin):
    list_display = ("id", "decayed_at", "last_event_id")
