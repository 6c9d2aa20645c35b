"""The admin's shared pieces: times shown with their zone, the read-only base every app's
worker-written tables use, the outbox and django-axes' tables (read-only), and the operator's
timezone page."""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django import forms
from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString

from core.models import OutboxTask
from core.operator_zone import TIMEZONE_COOKIE, operator_zone_name
from core.timezones import known_timezones

# --- Times ------------------------------------------------------------------------------------

_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Zulu", "Zulu", "Universal", "Etc/Universal"})


def zoned_text(value: datetime | None, empty: str = "-") -> str:
    """An instant as "2026-12-01 14:03:07 UTC (15:03:07 CET)": UTC first, then the operator's
    zone (core.operator_zone) when it is not UTC, with the date again when it differs there."""
    if value is None:
        return empty
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    zone = timezone.get_current_timezone()
    if str(zone) not in _UTC_NAMES:
        local = value.astimezone(zone)
        shown = local.strftime("%H:%M:%S" if local.date() == utc.date() else "%Y-%m-%d %H:%M:%S")
        text = f"{text} ({shown} {local.tzname()})"
    return text


def zoned(value: datetime | None, empty: str = "-") -> SafeString | str:
    """`zoned_text` in a `<time>` element carrying the ISO instant and the zone's IANA name, so
    a browser test (or a tooltip) can read the exact value whatever the operator's zone."""
    if value is None:
        return empty
    return format_html(
        '<time class="zoned" datetime="{}" title="{}">{}</time>',
        value.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        str(timezone.get_current_timezone()),
        zoned_text(value),
    )


_columns: dict[tuple[type[models.Model], str], Callable[[Any], SafeString | str]] = {}


def zoned_column(model: type[models.Model], name: str) -> Callable[[Any], SafeString | str]:
    """A list/read-only column showing the DateTimeField `name` through `zoned`, sortable by
    the field. One function per (model, field), so a form's excluded fields and the page's
    read-only fields name the same object."""
    key = (model, name)
    if key not in _columns:
        field = model._meta.get_field(name)

        def column(obj: Any) -> SafeString | str:
            return zoned(getattr(obj, name))

        column.__name__ = name  # the CSS class Django gives the cell: field-<name>, as before
        label = str(getattr(field, "verbose_name", name))
        _columns[key] = admin.display(description=label, ordering=name)(column)
    return _columns[key]


def _is_datetime(model: type[models.Model], name: object) -> bool:
    if not isinstance(name, str):
        return False
    try:
        return isinstance(model._meta.get_field(name), models.DateTimeField)
    except FieldDoesNotExist:
        return False


def _zone_names(
    model: type[models.Model], names: Iterable[Any], only: Sequence[Any] | None = None
) -> list[Any]:
    """`names` with each DateTimeField name (those in `only`, if given) as its zoned column."""
    return [
        zoned_column(model, n) if _is_datetime(model, n) and (only is None or n in only) else n for n in names
    ]


def _zone_fieldsets(model: type[models.Model], fieldsets: Any, readonly: Sequence[Any]) -> list[Any]:
    zoned_sets = []
    for title, options in fieldsets:
        fields = [
            tuple(_zone_names(model, f, readonly))
            if isinstance(f, list | tuple)
            else _zone_names(model, [f], readonly)[0]
            for f in options.get("fields", ())
        ]
        zoned_sets.append((title, {**options, "fields": fields}))
    return zoned_sets


class ZonedTimesMixin(admin.ModelAdmin):
    """Every DateTimeField an admin page shows read-only, or as a list column, is rendered by
    `zoned`: UTC and the operator's zone, never an unlabelled wall time.

    Applied where the page is rendered (the changelist's columns, the change form's read-only
    fields and its inlines' read-only fields), so a subclass's own get_readonly_fields or
    fieldsets need no change. Editable datetime inputs are left as Django renders them (in the
    operator's zone, which the form field parses back)."""

    def get_list_display(self, request: HttpRequest) -> Any:
        return _zone_names(self.model, super().get_list_display(request))

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        adminform = context.get("adminform")
        if adminform is not None:
            readonly = list(adminform.readonly_fields)
            adminform.fieldsets = _zone_fieldsets(self.model, adminform.fieldsets, readonly)
            adminform.readonly_fields = _zone_names(self.model, readonly)
        for inline in context.get("inline_admin_formsets", ()):
            model = inline.opts.model
            readonly = list(inline.readonly_fields)
            if not inline.has_change_permission:
                readonly += [
                    n for _, opts in inline.fieldsets for n in opts.get("fields", ()) if isinstance(n, str)
                ]
            inline.fieldsets = _zone_fieldsets(model, inline.fieldsets, readonly)
            inline.readonly_fields = _zone_names(model, inline.readonly_fields, readonly)
        return super().render_change_form(request, context, add, change, form_url, obj)


class ReadOnlyAdmin(ZonedTimesMixin):
    """Shown, never written: no Add, no Save, no Delete (a POST to the change page is a 403).

    A saved form writes back every field it showed, including what a worker changed after the
    page was opened: Save on a `retry_wait` message the worker had sent meanwhile put it back in
    `retry_wait` and sent it twice (issue 8). Operators act through the actions, which call the
    apps' conditional-UPDATE services (delivery.services.operator for messages).
    """

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may run the actions: whoever Django's "change" permission names (a superuser,
        or staff granted it), even though the form itself never saves."""
        meta = self.model._meta
        return request.user.has_perm(f"{meta.app_label}.change_{meta.model_name}")


@admin.register(OutboxTask)
class OutboxTaskAdmin(ReadOnlyAdmin):
    """The relay's work list: deleting a row would lose the task it announces."""

    list_display = ("id", "kind", "payload", "created_at")
    list_filter = ("kind",)


# --- django-axes' tables: written by its login handler, read-only here -------------------------


@admin.register(AccessAttempt)
class AccessAttemptAdmin(ReadOnlyAdmin):
    """Failed logins per (username, IP address) and their count, which locks the pair out at
    AXES_FAILURE_LIMIT. Deleting a row is the one write allowed: it unlocks that pair before
    the cool-off (as `manage.py axes_reset_username` does)."""

    list_display = (
        "attempt_time",
        "username",
        "ip_address",
        "failures_since_start",
        "path_info",
        "user_agent",
    )
    list_filter = ("path_info",)
    search_fields = ("=username", "=ip_address")
    exclude = ("get_data", "post_data")  # the form data: never shown (it may hold a mistyped password)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return request.user.has_perm("axes.delete_accessattempt")


@admin.register(AccessLog)
class AccessLogAdmin(ReadOnlyAdmin):
    list_display = ("attempt_time", "logout_time", "username", "ip_address", "path_info", "user_agent")
    search_fields = ("=username", "=ip_address")
    exclude = ("session_hash",)


@admin.register(AccessFailureLog)
class AccessFailureLogAdmin(ReadOnlyAdmin):
    list_display = ("attempt_time", "username", "ip_address", "locked_out", "path_info", "user_agent")
    list_filter = ("locked_out",)
    search_fields = ("=username", "=ip_address")


# --- The operator's timezone -------------------------------------------------------------------


class OperatorZoneForm(forms.Form):
    timezone = forms.ChoiceField(
        label="Your timezone",
        help_text="Every time in the admin is shown in UTC and in this zone.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        zone_field = self.fields["timezone"]
        assert isinstance(zone_field, forms.ChoiceField)
        zone_field.choices = [("UTC", "UTC only")] + [(n, n) for n in sorted(known_timezones())]


def operator_timezone_view(request: HttpRequest) -> HttpResponse:
    """Admin page: choose the zone the admin shows beside UTC (a cookie, core.operator_zone)."""
    back = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        back = ""
    form = OperatorZoneForm(request.POST or None, initial={"timezone": operator_zone_name(request) or "UTC"})
    if request.method == "POST" and form.is_valid():
        response = HttpResponseRedirect(back or request.path)
        name = form.cleaned_data["timezone"]
        # Read by the server only (core.operator_zone) and by admin.js, which sets it the first
        # time from the browser's zone; a year, then the browser's zone is taken again.
        response.set_cookie(
            TIMEZONE_COOKIE, name, max_age=365 * 86400, samesite="Lax", secure=request.is_secure()
        )
        return response
    zone = zoneinfo.ZoneInfo(operator_zone_name(request) or "UTC")
    context = {
        **admin.site.each_context(request),
        "title": "Your timezone",
        "form": form,
        "next": back,
        "now": zoned(timezone.now()),
        "zone": str(zone),
    }
    return TemplateResponse(
        request, "admin/core/operator_timezone.html", context, status=400 if form.errors else 200
    )
