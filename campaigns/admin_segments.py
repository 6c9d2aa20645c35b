"""The segments' admin: a segment's filter edited as JSON, with its count and a sample of the
contacts it matches shown before saving (Preview), validated by the code the API uses
(campaigns.segments)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from campaigns import segment_filter, segments
from campaigns.api.segments import SegmentSerializer
from campaigns.exceptions import InvalidFilter, SegmentInUse, SegmentQueryTimeout
from campaigns.models import (
    ContactList,
    Segment,
)
from core.admin import ZonedTimesMixin, zoned_text
from core.validators import ApiValidatedForm, StorableJSONFormField

# Contacts a preview shows (the first by id): enough to see the filter does what was meant.
PREVIEW_SAMPLE_SIZE = 10
# The legend under the filter: the example of campaigns.segment_filter's docstring.
FILTER_EXAMPLE = {
    "and": [
        {"attribute": "city", "type": "string", "op": "equals", "value": "Hanoi"},
        {"engagement": "opened", "op": "at_least", "value": 1, "within": {"days": 90}},
    ]
}


def filter_legend() -> SafeString:
    """A short legend of the filter language, built from the parser's own tables so it names
    exactly the fields and operators the parser takes."""
    fields = format_html_join(
        "; ", "<code>{}</code> ({})", ((n, ", ".join(o)) for n, o in segment_filter.FIELD_OPS.items())
    )
    types = format_html_join(
        "; ", "<code>{}</code> ({})", ((t, ", ".join(o)) for t, o in segment_filter.ATTRIBUTE_OPS.items())
    )
    return format_html(
        "JSON: groups <code>{{\"and\": [...]}}</code>, <code>{{\"or\": [...]}}</code>, "
        "<code>{{\"not\": {{...}}}}</code> around conditions:<br>"
        "<code>{{\"field\": …, \"op\": …, \"value\": …}}</code> a contact's field: {};<br>"
        "<code>{{\"attribute\": key, \"type\": …, \"op\": …, \"value\": …}}</code> a key of its attributes, "
        "typed: {};<br>"
        "<code>{{\"list\": id, \"op\": \"in\" | \"not_in\"}}</code> list membership;<br>"
        "<code>{{\"engagement\": {}, \"op\": \"at_least\" | \"none\"}}</code>, optionally <code>value</code> "
        "(times, default 1), <code>within</code> <code>{{\"days\": N}}</code> or <code>{{\"hours\": N}}</code>, "
        "<code>between</code> <code>{{\"from\": …, \"to\": …}}</code>, <code>campaign</code> (id), "
        "<code>tag</code>: human opens and clicks only.<br>"
        "Inactive, suppressed and erased contacts are never in a segment. Example:<pre>{}</pre>",
        fields, types, " | ".join(segment_filter.ENGAGEMENTS), json.dumps(FILTER_EXAMPLE, indent=2),
    )  # fmt: skip


def filter_errors(exc: InvalidFilter) -> list[str]:
    """A refused filter's errors as the form shows them: each node's path, then what is wrong
    (`and[2].value: must be a number; got a string`); a limit names its setting."""
    shown = [f"{path}: {message}" if path else message for path, message in exc.errors.items()]
    if exc.limit and not any(exc.limit in line for line in shown):
        shown = [f"{line} ({exc.limit})" for line in shown]
    return shown


class FilterField(StorableJSONFormField):
    """The filter as JSON in a textarea, pretty-printed (as typed while it is not valid JSON)."""

    widget = forms.Textarea(attrs={"rows": 16, "cols": 90, "spellcheck": "false", "class": "vLargeTextField"})

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:  # json.loads of JSON nested thousands deep
            raise forms.ValidationError(
                f"nested too deeply: groups may nest {settings.EMAILHUB_SEGMENT_MAX_DEPTH} deep "
                "(EMAILHUB_SEGMENT_MAX_DEPTH)"
            ) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:  # shown again as typed
            return InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        if value is None:
            return ""
        return json.dumps(_readable(value), indent=2, ensure_ascii=False, cls=self.encoder)


# jsonb stores an object's keys shortest first ("op" before "attribute"): shown again, each node
# reads as it is written, its kind first, then its type, operator and value.
_KEY_ORDER = {
    key: n
    for n, key in enumerate(
        (*segment_filter.GROUPS, *segment_filter.KINDS, "type", "op", "value", "within", "between")
    )
}


def _readable(value: Any) -> Any:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: _KEY_ORDER.get(k, len(_KEY_ORDER)))
        return {key: _readable(value[key]) for key in keys}
    if isinstance(value, list):
        return [_readable(item) for item in value]
    return value


class SegmentForm(ApiValidatedForm):
    """Name, description and filter, each field as the API takes it, and the filter checked by
    campaigns.segments.validate, the code the API runs; `preview_list` narrows only the preview;
    `seen_updated_at` is the segment as the form was opened: a change by someone else since
    refuses the save."""

    api_serializer = SegmentSerializer

    filter = FilterField(label="Filter", help_text=filter_legend())
    preview_list = forms.ModelChoiceField(
        ContactList.objects.order_by("name"),
        required=False,
        label="narrow the preview to list",
        help_text="only for the preview's count and sample; not saved with the segment",
    )
    seen_updated_at = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Segment
        fields = ["name", "description", "filter"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and not self.is_bound:
            self.initial["seen_updated_at"] = self.instance.updated_at.isoformat()

    def clean_filter(self) -> Any:
        data = self.cleaned_data["filter"]
        try:
            segments.validate(data)
        except InvalidFilter as exc:
            raise forms.ValidationError(filter_errors(exc)) from None
        return data

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        seen = cleaned.get("seen_updated_at")
        if self.instance.pk is not None and seen:
            # Locked until the admin's transaction ends (the save is in it): no edit can land
            # between this check and the save.
            current = (
                Segment.objects.select_for_update()
                .filter(pk=self.instance.pk)
                .values_list("updated_at", flat=True)
                .first()
            )
            if current is None:
                self.add_error(None, "this segment was deleted after this form was opened")
            elif _instant(seen) != current:
                self.add_error(
                    None,
                    f"this segment was changed at {zoned_text(current)}, after this form was opened; "
                    "nothing was saved: open it again to see that change, then make yours",
                )
        return cleaned


def _instant(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


@admin.register(Segment)
class SegmentAdmin(ZonedTimesMixin):
    """Segments through campaigns.segments: the form validates the filter as the API does, a
    Preview button counts and samples it without saving (the form shown again), a save is
    segments.create or segments.update, and a delete is segments.delete (refused while a
    campaign or a recurring schedule uses it)."""

    form = SegmentForm
    change_form_template = "admin/campaigns/segment/change_form.html"
    list_display = ("name", "description", "used_by", "updated_at")
    search_fields = ("name", "description")
    readonly_fields = ("created_at", "updated_at")

    def get_fieldsets(self, request: HttpRequest, obj: Segment | None = None) -> Any:
        times = [("Times", {"fields": ("created_at", "updated_at")})] if obj is not None else []
        preview = (
            "Preview",
            {
                "fields": ("preview_list",),
                "description": "Preview counts and samples the filter above as it is in the form; "
                "nothing is saved.",
            },
        )
        # The preview's list, its result and its button together, under the form.
        return [(None, {"fields": ("name", "description", "filter", "seen_updated_at")}), *times, preview]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Segment]:
        return super().get_queryset(request).annotate(campaign_count=Count("campaigns"))

    @admin.display(description="used by", ordering="campaign_count")
    def used_by(self, segment: Segment) -> str:
        # Campaigns only: recurring schedules (the scheduling app, above this one) are named by
        # the delete page, which refuses while either uses the segment.
        count = segment.campaign_count  # type: ignore[attr-defined]
        if not count:
            return "—"
        query = urlencode({"segment__id__exact": str(segment.pk), "archived": "all"})
        return format_html(
            '<a class="segment-campaigns" href="{}?{}">{} campaign{}</a>',
            reverse("admin:campaigns_campaign_changelist"), query, count, "" if count == 1 else "s",
        )  # fmt: skip

    # --- the form: preview, current count, save through the service ---

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST" and "_preview" in request.POST:
            return self.preview_view(request, object_id, form_url)
        extra = dict(extra_context or {})
        if object_id is not None and request.method == "GET":
            segment = self.get_object(request, unquote(object_id))
            if segment is not None:
                extra["current"] = self.current_count(segment)
        return super().changeform_view(request, object_id, form_url, extra)

    def current_count(self, segment: Segment) -> dict[str, Any]:
        """The stored filter's audience now: one count, its refusal or its timeout as text."""
        try:
            return {"count": segments.count(segment.filter)}
        except SegmentQueryTimeout as exc:
            return {"error": str(exc)}
        except InvalidFilter as exc:  # a list or campaign it names was deleted since
            return {"error": "the saved filter is refused now: " + "; ".join(filter_errors(exc))}

    def preview_view(self, request: HttpRequest, object_id: str | None, form_url: str) -> HttpResponse:
        """The form again, validated as a save would be, with the filter's count and sample:
        nothing is written."""
        add = object_id is None
        obj = None if add else self.get_object(request, unquote(object_id or ""))
        if not add and obj is None:
            self.message_user(request, f"segment {object_id} does not exist (deleted?)", messages.WARNING)
            return HttpResponseRedirect(reverse("admin:campaigns_segment_changelist"))
        if not (self.has_add_permission(request) if add else self.has_change_permission(request, obj)):
            raise PermissionDenied
        fieldsets = self.get_fieldsets(request, obj)
        form_class = self.get_form(request, obj, change=not add, fields=flatten_fieldsets(fieldsets))
        with transaction.atomic():  # the form's edit check locks the row, as a save's does
            form = form_class(request.POST, request.FILES, instance=obj)
            form.is_valid()
        preview = self.preview(form)
        admin_form = helpers.AdminForm(
            form, list(fieldsets), {}, self.get_readonly_fields(request, obj), model_admin=self
        )
        context = {
            **self.admin_site.each_context(request),
            "title": f"{'Add' if add else 'Change'} {self.opts.verbose_name}",
            "subtitle": None if obj is None else str(obj),
            "adminform": admin_form,
            "object_id": object_id,
            "original": obj,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []),
            "preserved_filters": self.get_preserved_filters(request),
            "preview": preview,
        }
        return self.render_change_form(request, context, add=add, change=not add, obj=obj, form_url=form_url)

    def preview(self, form: forms.BaseForm) -> dict[str, Any] | None:
        """The count and the first contacts of the form's filter (None while it is refused); a
        timeout, or a list or campaign deleted meanwhile, is an error on the filter."""
        if "filter" not in form.cleaned_data:
            return None
        data = form.cleaned_data["filter"]
        narrowed = form.cleaned_data.get("preview_list")
        list_id = narrowed.pk if narrowed is not None else None
        try:
            count, sample = segments.preview(data, size=PREVIEW_SAMPLE_SIZE, list_id=list_id)
        except SegmentQueryTimeout as exc:
            form.add_error("filter", str(exc))
            return None
        except InvalidFilter as exc:  # a list or campaign it names deleted since the form's check
            form.add_error("filter", filter_errors(exc))
            return None
        return {"count": count, "sample": sample, "list": narrowed}

    def save_model(self, request: HttpRequest, obj: Segment, form: forms.ModelForm, change: bool) -> None:
        # The form validated the filter (and, for a change, locked the row and found it as it
        # was when the form was opened); the service validates again and writes.
        data = form.cleaned_data
        if not change:
            created = segments.create(
                name=data["name"], description=data["description"], filter=data["filter"]
            )
            obj.pk, obj.created_at, obj.updated_at = created.pk, created.created_at, created.updated_at
            return
        changes = {
            name: data[name] for name in form.changed_data if name in ("name", "description", "filter")
        }
        if changes:
            segments.update(obj.pk, changes)

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> list[dict[str, Any]]:
        # The history names what was saved: not the preview's list or the form's opening time.
        message: list[dict[str, Any]] = super().construct_change_message(request, form, formsets, add)
        unsaved = {str(form.fields[name].label or name) for name in ("preview_list", "seen_updated_at")}
        for entry in message:
            if "changed" in entry:
                entry["changed"]["fields"] = [f for f in entry["changed"]["fields"] if f not in unsaved]
        return [e for e in message if "changed" not in e or e["changed"]["fields"]]

    # --- delete: refused while used, as for a list ---

    def delete_model(self, request: HttpRequest, obj: Segment) -> None:
        try:
            segments.delete(obj)
        except SegmentInUse as exc:  # a campaign took it after the confirmation page
            self.message_user(request, f"not deleted: {exc}", messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Segment]) -> None:
        for segment in queryset:
            self.delete_model(request, segment)
